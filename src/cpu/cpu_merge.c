/*
 * cpu_merge.c -- kva_merge_states on the CPU: rows in parallel, each row's states combined with
 * the shared primitive of softmax_state.h (lse = log sum exp, weights exp(lse_i - lse)), in f32.
 * Memory traffic: every input state read once, every output row written once.
 */
#include "cpu_backend.h"
#include "kernels/simd.h"
#include "../common/dtype_convert.h"
#include "../common/internal.h"
#include "../common/softmax_state.h"

/* acc[e] += w * row[e], e < D; dtype constant after inlining. */
KVA__INLINE void accumulate_row(kva_dtype dtype, float w, const void *row, float *acc,
                                int32_t D) {
    const size_t es = dtype == KVA_F32 ? 4 : 2;
    int32_t e = 0;
    for (; e + KVA__VL <= D; e += KVA__VL) {
        kva__vf x = kva__loadv((const unsigned char *)row + (size_t)e * es, dtype);
        kva__storeu(acc + e, kva__fma(kva__splat(w), x, kva__loadu(acc + e)));
    }
    for (; e < D; ++e) acc[e] += w * kva__load_f32(row, dtype, e);
}

static void merge_row(kva_dtype dtype, int32_t num_states, int32_t D, const void *v_in,
                      const float *lse_in, void *v_out, float *lse_out) {
    float acc[1024]; /* head_dim <= 1024 (checked by the API) */
    const size_t es = kva_dtype_size(dtype);
    float total = kva__lse_combine(lse_in, 1, num_states);
    for (int32_t e = 0; e < D; ++e) acc[e] = 0.0f;
    for (int32_t s = 0; s < num_states; ++s) {
        float w = kva__lse_weight(lse_in[s], total);
        if (w == 0.0f) continue; /* empty state: whatever it holds must not leak in */
        const unsigned char *row = (const unsigned char *)v_in + (size_t)s * (size_t)D * es;
        if (dtype == KVA_F32) accumulate_row(KVA_F32, w, row, acc, D);
        else if (dtype == KVA_F16) accumulate_row(KVA_F16, w, row, acc, D);
        else accumulate_row(KVA_BF16, w, row, acc, D);
    }
    for (int32_t e = 0; e < D; ++e) kva__store_f32(v_out, dtype, e, acc[e]);
    if (lse_out) *lse_out = total;
}

typedef struct merge_job {
    int32_t num_states, head_dim;
    kva_dtype dtype;
    const void *v_in;
    const float *lse_in;
    void *v_out;
    float *lse_out;
} merge_job;

static void merge_one_row(void *arg, int64_t r, int thread) {
    (void)thread;
    const merge_job *J = (const merge_job *)arg;
    const size_t es = kva_dtype_size(J->dtype), in_row = (size_t)r * (size_t)J->num_states;
    merge_row(J->dtype, J->num_states, J->head_dim,
              J->v_in ? (const unsigned char *)J->v_in + in_row * (size_t)J->head_dim * es : NULL,
              J->lse_in ? J->lse_in + in_row : NULL,
              (unsigned char *)J->v_out + (size_t)r * (size_t)J->head_dim * es,
              J->lse_out ? J->lse_out + r : NULL);
}

kva_status kva__cpu_merge_states(kva_context *ctx, int32_t num_rows, int32_t num_states,
                                 int32_t head_dim, kva_dtype dtype, const void *v_in,
                                 const float *lse_in, void *v_out, float *lse_out) {
    /* Threads pay off only past a few hundred KB of input. */
    const int64_t elems = (int64_t)num_rows * ((int64_t)num_states + 1) * head_dim;
    const int threads = elems > (1 << 16) ? ctx->num_threads : 1;
    merge_job J = {num_states, head_dim, dtype, v_in, lse_in, v_out, lse_out};
    /* rows in contiguous shares, a few per thread so a late worker costs little */
    kva__pool_for(&ctx->cpu_pool, threads, num_rows, kva__ceil_div64(num_rows, 4 * (int64_t)threads), merge_one_row,
                  &J);
    return KVA_OK;
}
