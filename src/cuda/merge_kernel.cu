/*
 * merge_kernel.cu -- kva_merge_states on CUDA: combines num_states partial attention states per
 * row by their LSE (see kvattn.h). The decode kernel fuses its own merge; this one serves the
 * public API (e.g. merging a cached-prefix result with a new-tokens result).
 *
 * Work split: one 128-thread block per row (grid-stride over rows); every thread finds the row's
 * max and total LSE over the states (the f32 LSE row is small and stays in L1), then threads
 * stride over head_dim, each summing its element over the states with weights
 * exp(lse_s - lse_total). Traffic: v_in and lse_in read once, v_out and lse_out written once.
 * States with lse = -inf weigh 0; a row with no finite state gets 0 and -inf; a NaN LSE (a
 * state whose scores left f32 range) makes the row NaN, as on the CPU.
 */
#include "cuda_common.cuh"

#define KVA__MERGE_THREADS 128

template <typename T>
__global__ void __launch_bounds__(KVA__MERGE_THREADS)
    kva__merge_states_kernel(int num_rows, int num_states, int head_dim, const T *__restrict__ v_in,
                             const float *__restrict__ lse_in, T *__restrict__ v_out,
                             float *__restrict__ lse_out) {
    const float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;
    for (int r = blockIdx.x; r < num_rows; r += gridDim.x) {
        const float *lse_r = lse_in + (int64_t)r * num_states;
        float m = -INFINITY;
        for (int s = 0; s < num_states; ++s) m = fmaxf(m, __fmul_rn(__ldg(lse_r + s), LOG2E));
        /* max ignores NaN; the sum does not, so a NaN state still makes total NaN. __fmul_rn:
         * the log2 LSE is rounded the same way in the max and the weights (never fused). */
        const float m_use = m == -INFINITY ? 0.0f : m;
        float sum = 0.0f;
        for (int s = 0; s < num_states; ++s) sum += exp2f(__fmul_rn(__ldg(lse_r + s), LOG2E) - m_use);
        const float total = sum > 0.0f ? m_use + __log2f(sum) : (sum == 0.0f ? -INFINITY : NAN); /* log2 */
        const T *v_r = v_in + (int64_t)r * num_states * head_dim;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float acc = 0.0f;
            if (total != -INFINITY)
                for (int s = 0; s < num_states; ++s) {
                    const float w = exp2f(__fmul_rn(__ldg(lse_r + s), LOG2E) - total);
                    acc += w * kva__to_f32(v_r[(int64_t)s * head_dim + d]);
                }
            v_out[(int64_t)r * head_dim + d] = kva__from_f32<T>(acc);
        }
        if (lse_out && threadIdx.x == 0) lse_out[r] = total == -INFINITY ? -INFINITY : total * LN2;
    }
}

extern "C" kva_status kva__cuda_merge_states(kva_context *ctx, int32_t num_rows, int32_t num_states,
                                             int32_t head_dim, kva_dtype dtype, const void *v_in,
                                             const float *lse_in, void *v_out, float *lse_out) {
    if (num_rows <= 0) return KVA_OK;
    KVA_TRY(kva__cuda_use_device(ctx));
    const unsigned grid = (unsigned)(num_rows < 65536 ? num_rows : 65536);
    cudaStream_t s = kva__stream(ctx);
    switch (dtype) {
    case KVA_F32:
        kva__merge_states_kernel<float><<<grid, KVA__MERGE_THREADS, 0, s>>>(
            num_rows, num_states, head_dim, (const float *)v_in, lse_in, (float *)v_out, lse_out);
        break;
    case KVA_F16:
        kva__merge_states_kernel<__half><<<grid, KVA__MERGE_THREADS, 0, s>>>(
            num_rows, num_states, head_dim, (const __half *)v_in, lse_in, (__half *)v_out, lse_out);
        break;
    default:
        kva__merge_states_kernel<__nv_bfloat16><<<grid, KVA__MERGE_THREADS, 0, s>>>(
            num_rows, num_states, head_dim, (const __nv_bfloat16 *)v_in, lse_in,
            (__nv_bfloat16 *)v_out, lse_out);
        break;
    }
    KVA_CUDA_LAUNCHED("the merge kernel");
    return KVA_OK;
}
