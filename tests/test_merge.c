/*
 * test_merge.c -- kva_merge_states on the CPU against kva_ref_merge_states: every dtype, odd
 * head dims, 0..many states, states with LSE -inf (filled with NaN, which must not leak), rows
 * whose states are all -inf (0 and -inf out), optional lse_out, poisoned outputs and a poisoned
 * tail that must stay untouched; plus the merge identity itself: merging the attention states
 * of two halves of the keys gives the attention over all keys.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct merge_case {
    int32_t rows, states, head_dim;
    kva_dtype dtype;
    int with_lse_out;
} merge_case;

static void run_merge_case(kva_context *ctx, kva_rng *rng, const merge_case *c) {
    const int32_t R = c->rows, S = c->states, D = c->head_dim;
    const size_t es = kva_dtype_size(c->dtype);
    size_t n_in = (size_t)R * (size_t)S * (size_t)D;
    size_t n_out = (size_t)R * (size_t)D;
    void *v_in = kva_test_alloc(n_in * es + 1);
    float *lse_in = kva_test_alloc(sizeof(float) * ((size_t)R * S + 1));
    void *v_out = kva_test_alloc((n_out + 16) * es);
    float *lse_out = kva_test_alloc(sizeof(float) * ((size_t)R + 1));
    kva_fill_random(rng, v_in, c->dtype, n_in, -2.0f, 2.0f);
    for (int32_t r = 0; r < R; ++r) {
        int all_empty = kva_rng_int(rng, 0, 5) == 0;
        for (int32_t s = 0; s < S; ++s) {
            float *l = &lse_in[(size_t)r * S + s];
            *l = kva_rng_uniform(rng, -6.0f, 6.0f);
            if (all_empty || kva_rng_int(rng, 0, 3) == 0) {
                *l = -INFINITY;
                /* an empty state's values are meaningless: make them NaN */
                kva_poison((unsigned char *)v_in + ((size_t)r * S + s) * D * es, (size_t)D * es);
            }
        }
    }
    kva_poison(v_out, (n_out + 16) * es);
    kva_poison(lse_out, sizeof(float) * ((size_t)R + 1));

    double *vd = malloc(sizeof(double) * (n_in + 1));
    double *ld = malloc(sizeof(double) * ((size_t)R * S + 1));
    double *vo = malloc(sizeof(double) * (n_out + 1));
    double *lo = malloc(sizeof(double) * ((size_t)R + 1));
    for (size_t i = 0; i < n_in; ++i) {
        float f;
        CHECK_OK(kva_convert((const unsigned char *)v_in + i * es, c->dtype, &f, KVA_F32, 1));
        vd[i] = f;
    }
    for (size_t i = 0; i < (size_t)R * S; ++i) {
        ld[i] = lse_in[i];
        /* the reference multiplies empty states by their zero weight: give it zeros, not NaN */
        if (ld[i] == -INFINITY)
            for (int32_t d = 0; d < D; ++d) vd[i * D + d] = 0.0;
    }
    kva_ref_merge_states(R, S, D, vd, ld, vo, lo);

    char what[128];
    snprintf(what, sizeof what, "merge %s rows %d states %d D %d", kva_dtype_name(c->dtype), R, S, D);
    CHECK_OK(kva_merge_states(ctx, R, S, D, c->dtype, v_in, lse_in, v_out,
                              c->with_lse_out ? lse_out : NULL));
    kva_compare(what, v_out, c->dtype, vo, n_out, kva_tol_for(c->dtype), NULL);
    if (c->with_lse_out) {
        kva_compare_lse(what, lse_out, lo, (size_t)R, KVA_F32, NULL);
        uint32_t bits;
        memcpy(&bits, lse_out + R, 4);
        CHECK_MSG(bits == 0xFFFFFFFFu, "%s: lse_out written past its end", what);
    } else {
        for (int32_t r = 0; r <= R; ++r) {
            uint32_t bits;
            memcpy(&bits, lse_out + r, 4);
            CHECK_MSG(bits == 0xFFFFFFFFu, "%s: lse_out written although NULL was passed", what);
        }
    }
    const unsigned char *tail = (const unsigned char *)v_out + n_out * es;
    for (size_t i = 0; i < 16 * es; ++i)
        if (tail[i] != 0xFF) {
            kva_test_fail(__FILE__, __LINE__, "%s: v_out written past its end", what);
            break;
        }
    free(vd);
    free(ld);
    free(vo);
    free(lo);
    free(v_in);
    free(lse_in);
    free(v_out);
    free(lse_out);
}

KVA_TEST(merge_states_matches_reference) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t rows[] = {1, 5, 33};
    const int32_t states[] = {0, 1, 2, 7};
    const int32_t dims[] = {1, 7, 64, 130, 256};
    for (int d = 0; d < 3; ++d)
        for (int i = 0; i < 3; ++i)
            for (int s = 0; s < 4; ++s)
                for (int h = 0; h < 5; ++h) {
                    if ((i + s + h + d) % 3 != 0) continue; /* a third of the grid is plenty */
                    merge_case c = {rows[i], states[s], dims[h], (kva_dtype)d, (i + h) % 2};
                    run_merge_case(ctx, &rng, &c);
                }
    /* large enough to be split across threads, and the widest head_dim */
    merge_case big = {700, 5, 128, KVA_BF16, 1};
    run_merge_case(ctx, &rng, &big);
    merge_case wide = {3, 4, 1024, KVA_F32, 1};
    run_merge_case(ctx, &rng, &wide);
    kva_context_destroy(ctx);
}

KVA_TEST(merge_states_zero_rows_and_states) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    CHECK_OK(kva_merge_states(ctx, 0, 3, 64, KVA_F16, NULL, NULL, NULL, NULL));
    /* no states: every row is empty */
    float out[2 * 16];
    float lse[2];
    kva_poison(out, sizeof out);
    kva_poison(lse, sizeof lse);
    CHECK_OK(kva_merge_states(ctx, 2, 0, 16, KVA_F32, NULL, NULL, out, lse));
    for (int i = 0; i < 32; ++i) CHECK(out[i] == 0.0f);
    CHECK(lse[0] == -INFINITY && lse[1] == -INFINITY);
    kva_context_destroy(ctx);
}

/* Attention over keys [0, n) equals the merge of attention over [0, k) and [k, n). */
KVA_TEST(merge_states_of_split_attention) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const int32_t H = 4, D = 32, N = 50, K = 19;
    kva_attn_params p = kva_attn_params_default(H, H, D);
    double q[4 * 32], k[50 * 4 * 32], v[50 * 4 * 32];
    for (int i = 0; i < H * D; ++i) q[i] = kva_rng_uniform(&rng, -1, 1);
    for (int i = 0; i < N * H * D; ++i) {
        k[i] = kva_rng_uniform(&rng, -1, 1);
        v[i] = kva_rng_uniform(&rng, -1, 1);
    }
    double o_all[4 * 32], l_all[4], o1[4 * 32], l1[4], o2[4 * 32], l2[4];
    kva_ref_attention(&p, 1, N, q, k, v, o_all, l_all);
    /* a query at position N-1 sees both halves; without causal masking each part is a plain
     * attention over its keys */
    kva_ref_attention(&p, 1, K, q, k, v, o1, l1);
    kva_ref_attention(&p, 1, N - K, q, k + (size_t)K * H * D, v + (size_t)K * H * D, o2, l2);
    float vin[4 * 2 * 32], lin[4 * 2], vout[4 * 32], lout[4];
    for (int h = 0; h < H; ++h) {
        for (int d = 0; d < D; ++d) {
            vin[(h * 2 + 0) * D + d] = (float)o1[h * D + d];
            vin[(h * 2 + 1) * D + d] = (float)o2[h * D + d];
        }
        lin[h * 2] = (float)l1[h];
        lin[h * 2 + 1] = (float)l2[h];
    }
    REQUIRE_OK(kva_merge_states(ctx, H, 2, D, KVA_F32, vin, lin, vout, lout));
    kva_compare("merged halves", vout, KVA_F32, o_all, (size_t)H * D, kva_tol_for(KVA_F32), NULL);
    kva_compare_lse("merged halves LSE", lout, l_all, (size_t)H, KVA_F32, NULL);
    kva_context_destroy(ctx);
}
