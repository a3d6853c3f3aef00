/*
 * test_cuda_score_range.c -- scores at the edge of f32 on the GPU (kvattn.h, kva_attn_params,
 * "Range"): the kernels keep scores in log2 units, so a score beyond ~2.36e38 leaves f32. Such a
 * row must come back NaN on every CUDA path -- dense attention (the prefill kernel), paged decode
 * unsplit and split (fused merge), ragged prefill split over key chunks (the prefill merge) --
 * never as an empty row (0, -inf) nor with a finite wrong LSE; scores inside the range (decode:
 * up to 2.3e38; prefill: up to 2^28 in log2 units, NaN beyond), and huge scores tamed by a soft
 * cap, must match the float64 reference. A soft cap of +inf means none. The merge of a NaN state
 * with empty ones stays NaN. Each case is one query head and 40 keys on three shuffled pages;
 * score j is a * b_j * sm_scale with a tiny random remainder in the other dimensions.
 */
#include "harness.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "../src/common/dtype_convert.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CS_D = 64, CS_KEYS = 40, CS_PS = 16, CS_PAGES = 3, CS_CHUNK = 8 };

typedef struct cs_case {
    kva_dtype dt;
    float q[CS_D], k[CS_PAGES * CS_PS * CS_D], v[CS_PAGES * CS_PS * CS_D]; /* page order 2, 0, 1 */
} cs_case;

static const int32_t cs_pages[CS_PAGES] = {2, 0, 1}; /* logical page i lives in physical page */

/* Offset of key's row in a pool, in elements. */
static size_t cs_offset(int32_t key) {
    return ((size_t)cs_pages[key / CS_PS] * CS_PS + (size_t)(key % CS_PS)) * CS_D;
}
static float *cs_row(float *pool, int32_t key) { return pool + cs_offset(key); }

/* Fills the output and its LSE with the NaN-pattern poison again (0xff bytes). */
static void cs_poison(kva_context *ctx, void *o, size_t o_bytes, float *lse) {
    unsigned char ff[CS_D * 4];
    memset(ff, 0xff, sizeof ff);
    CHECK_OK(kva_memcpy(ctx, o, ff, o_bytes, KVA_COPY_HOST_TO_DEVICE));
    CHECK_OK(kva_memcpy(ctx, lse, ff, sizeof(float), KVA_COPY_HOST_TO_DEVICE));
}

/* q[0] = a, k_j[0] = b_j, other dimensions tiny random values (never exactly zero data). */
static void cs_make(cs_case *c, kva_dtype dt, float a, const float *b, kva_rng *rng) {
    c->dt = dt;
    kva_fill_random(rng, c->q, KVA_F32, CS_D, -1e-3f, 1e-3f);
    kva_fill_random(rng, c->k, KVA_F32, CS_PAGES * CS_PS * CS_D, -1e-3f, 1e-3f);
    kva_fill_random(rng, c->v, KVA_F32, CS_PAGES * CS_PS * CS_D, -1.f, 1.f);
    c->q[0] = a;
    for (int32_t j = 0; j < CS_KEYS; ++j) cs_row(c->k, j)[0] = b[j];
    /* the values the kernels see: round through the dtype */
    float *all[3] = {c->q, c->k, c->v};
    const size_t n[3] = {CS_D, (size_t)CS_PAGES * CS_PS * CS_D, (size_t)CS_PAGES * CS_PS * CS_D};
    for (int t = 0; t < 3; ++t) {
        void *tmp = kva_test_alloc(n[t] * kva_dtype_size(dt));
        kva_convert(all[t], KVA_F32, tmp, dt, n[t]);
        kva_convert(tmp, dt, all[t], KVA_F32, n[t]);
        free(tmp);
    }
}

static void cs_reference(const cs_case *c, const kva_attn_params *p, double *o, double *lse) {
    double q[CS_D], *k = kva_test_alloc(sizeof(double) * CS_KEYS * CS_D),
                    *v = kva_test_alloc(sizeof(double) * CS_KEYS * CS_D);
    for (int i = 0; i < CS_D; ++i) q[i] = c->q[i];
    for (int32_t j = 0; j < CS_KEYS; ++j)
        for (int i = 0; i < CS_D; ++i) {
            k[j * CS_D + i] = cs_row((float *)c->k, j)[i];
            v[j * CS_D + i] = cs_row((float *)c->v, j)[i];
        }
    kva_ref_attention(p, 1, CS_KEYS, q, k, v, o, lse);
    free(k);
    free(v);
}

typedef enum { CS_EXPECT_REFERENCE, CS_EXPECT_NAN } cs_expect;

static void cs_check(const char *path, const char *what, const cs_case *c, const kva_attn_params *p,
                     const void *o_dev, const float *lse_dev, kva_context *ctx, cs_expect want) {
    CHECK_OK(kva_synchronize(ctx));
    const size_t es = kva_dtype_size(c->dt);
    void *o = cuda_test_download(ctx, o_dev, CS_D * es);
    float *lse = cuda_test_download(ctx, lse_dev, sizeof(float));
    if (!o || !lse) goto out;
    int before = kva_test_failures;
    if (want == CS_EXPECT_NAN) {
        int nan_o = 0;
        for (int i = 0; i < CS_D; ++i) nan_o += isnan(kva__load_f32(o, c->dt, i)) ? 1 : 0;
        CHECK_MSG(nan_o == CS_D && isnan(lse[0]),
                  "%d of %d outputs NaN, lse = %g (want all NaN)", nan_o, CS_D, (double)lse[0]);
    } else {
        double ref[CS_D], ref_lse;
        cs_reference(c, p, ref, &ref_lse);
        kva_compare("output", o, c->dt, ref, CS_D, kva_tol_for(c->dt), NULL);
        kva_compare_lse("lse", lse, &ref_lse, 1, c->dt, NULL);
    }
    if (kva_test_failures != before)
        printf("    case: %s, %s, %s\n", kva_dtype_name(c->dt), what, path);
out:
    free(o);
    free(lse);
}

/* Every CUDA path on one case. */
static void cs_all_paths(kva_context *ctx, const cs_case *c, const kva_attn_params *p,
                         const char *what, cs_expect want_decode, cs_expect want_prefill) {
    const kva_dtype dt = c->dt;
    const size_t es = kva_dtype_size(dt), pool = (size_t)CS_PAGES * CS_PS * CS_D;
    void *hq = kva_test_alloc(CS_D * es), *hk = kva_test_alloc(pool * es), *hv = kva_test_alloc(pool * es);
    kva_convert(c->q, KVA_F32, hq, dt, CS_D);
    kva_convert(c->k, KVA_F32, hk, dt, pool);
    kva_convert(c->v, KVA_F32, hv, dt, pool);
    void *q = cuda_test_upload(ctx, hq, CS_D * es), *k = cuda_test_upload(ctx, hk, pool * es),
         *v = cuda_test_upload(ctx, hv, pool * es);
    void *o = cuda_test_poisoned(ctx, CS_D * es);
    float *lse = cuda_test_poisoned(ctx, sizeof(float));
    /* contiguous copies of the keys in logical order (dense and ragged paths) */
    void *hk_lin = kva_test_alloc((size_t)CS_KEYS * CS_D * es), *hv_lin = kva_test_alloc((size_t)CS_KEYS * CS_D * es);
    for (int32_t j = 0; j < CS_KEYS; ++j) {
        const size_t src = cs_offset(j);
        memcpy((char *)hk_lin + (size_t)j * CS_D * es, (char *)hk + src * es, CS_D * es);
        memcpy((char *)hv_lin + (size_t)j * CS_D * es, (char *)hv + src * es, CS_D * es);
    }
    void *k_lin = cuda_test_upload(ctx, hk_lin, (size_t)CS_KEYS * CS_D * es),
         *v_lin = cuda_test_upload(ctx, hv_lin, (size_t)CS_KEYS * CS_D * es);
    kva_workspace ws = {0};
    if (!q || !k || !v || !o || !lse || !k_lin || !v_lin) goto out;
    const kva_tensor tq = kva_tensor_nhd(q, dt, 1, CS_D), to = kva_tensor_nhd(o, dt, 1, CS_D);

    /* dense: the prefill kernel, one query over all keys */
    CHECK_OK(kva_attention(ctx, p, 1, CS_KEYS, tq, kva_tensor_nhd(k_lin, dt, 1, CS_D),
                           kva_tensor_nhd(v_lin, dt, 1, CS_D), to, lse));
    cs_check("attention", what, c, p, o, lse, ctx, want_prefill);

    /* paged decode, unsplit and split into CS_CHUNK-key chunks (the fused merge) */
    kva_plan_limits lim = {.max_batch = 1, .max_total_pages = CS_PAGES, .max_total_kv = CS_KEYS,
                           .max_total_qo = 1, .num_qo_heads = 1, .num_kv_heads = 1,
                           .head_dim = CS_D, .page_size = CS_PS, .min_fixed_chunk = CS_CHUNK};
    size_t dd = 0, dh = 0, pd = 0, ph = 0;
    if (kva_decode_workspace_size(ctx, &lim, &dd, &dh) != KVA_OK ||
        kva_prefill_workspace_size(ctx, &lim, &pd, &ph) != KVA_OK) {
        CHECK_MSG(0, "workspace size: %s", kva_last_error());
        goto out;
    }
    ws.device_bytes = dd > pd ? dd : pd;
    ws.host_bytes = dh > ph ? dh : ph;
    CHECK_OK(kva_malloc(ctx, ws.device_bytes, &ws.device));
    CHECK_OK(kva_host_alloc(ctx, ws.host_bytes, &ws.host));
    int32_t indptr[2] = {0, CS_PAGES}, last[1] = {CS_KEYS - (CS_PAGES - 1) * CS_PS};
    int32_t idx[CS_PAGES];
    memcpy(idx, cs_pages, sizeof idx);
    kva_page_table t = {1, indptr, idx, last};
    kva_kv_pages pages = kva_kv_pages_separate(k, v, dt, CS_PAGES, CS_PS, 1, CS_D, KVA_LAYOUT_NHD);
    const kva_plan_options opts[2] = {{KVA_PLAN_NO_SPLIT, 0, KVA_DECODE_PARTIAL_ROWMAX},
                                      {0, CS_CHUNK, KVA_DECODE_PARTIAL_ROWMAX}};
    const char *names[2] = {"decode", "decode split"};
    for (int m = 0; m < 2; ++m) {
        kva_plan plan;
        if (kva_decode_plan(ctx, &lim, &t, CS_PAGES, &opts[m], ws, &plan) != KVA_OK) {
            CHECK_MSG(0, "%s plan: %s", names[m], kva_last_error());
            continue;
        }
        cs_poison(ctx, o, CS_D * es, lse);
        CHECK_OK(kva_decode_run(ctx, &plan, p, tq, &pages, to, lse));
        cs_check(names[m], what, c, p, o, lse, ctx, want_decode);
    }

    /* ragged prefill split into CS_CHUNK-key chunks (the prefill merge) */
    int32_t qo_indptr[2] = {0, 1}, kv_indptr[2] = {0, CS_KEYS};
    kva_plan plan;
    if (kva_prefill_plan(ctx, &lim, 1, qo_indptr, kv_indptr, NULL, 0, &opts[1], ws, &plan) != KVA_OK) {
        CHECK_MSG(0, "prefill plan: %s", kva_last_error());
    } else {
        cs_poison(ctx, o, CS_D * es, lse);
        CHECK_OK(kva_prefill_run_ragged(ctx, &plan, p, tq, kva_tensor_nhd(k_lin, dt, 1, CS_D),
                                        kva_tensor_nhd(v_lin, dt, 1, CS_D), to, lse));
        cs_check("ragged prefill split", what, c, p, o, lse, ctx, want_prefill);
    }
out:
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    kva_free(ctx, q);
    kva_free(ctx, k);
    kva_free(ctx, v);
    kva_free(ctx, o);
    kva_free(ctx, lse);
    kva_free(ctx, k_lin);
    kva_free(ctx, v_lin);
    free(hq);
    free(hk);
    free(hv);
    free(hk_lin);
    free(hv_lin);
}

KVA_TEST(cuda_score_range_huge_scores_are_exact_or_nan) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    cs_case *c = kva_test_alloc(sizeof *c);
    float b[CS_KEYS];
    const kva_dtype dts[3] = {KVA_F32, KVA_F16, KVA_BF16};
    for (int di = 0; di < 3; ++di) {
        const kva_dtype dt = dts[di];
        /* a = 1 and b_j of order 1: sm_scale 1e38 puts the scores at 1e38 (f16 cannot hold
         * larger values; the scale reaches the edge for every dtype) */
        kva_attn_params p = kva_attn_params_default(1, 1, CS_D);
        p.sm_scale = 1e38f;

        /* distinct by 0.075 so no f32 rounding can swap the top two keys */
        int32_t order[CS_KEYS];
        for (int j = 0; j < CS_KEYS; ++j) order[j] = j;
        kva_rng_shuffle_i32(&rng, order, CS_KEYS);
        for (int j = 0; j < CS_KEYS; ++j) b[j] = 1.5f - 3.f * (float)order[j] / CS_KEYS;
        cs_make(c, dt, 1.f, b, &rng);
        /* decode and the f32 prefill kernel are exact up to the f32 limit; the f16/bf16
         * prefill kernels' one-FFMA exponent up to 2^28 in log2 units, NaN beyond (kvattn.h) */
        const cs_expect huge_prefill = dt == KVA_F32 ? CS_EXPECT_REFERENCE : CS_EXPECT_NAN;
        cs_all_paths(ctx, c, &p, "scores up to 1.5e38", CS_EXPECT_REFERENCE, huge_prefill);

        /* every key hugely negative but in range: a finite LSE near -1e38 */
        for (int j = 0; j < CS_KEYS; ++j) b[j] = -1.f - 0.0125f * (float)order[j];
        cs_make(c, dt, 1.f, b, &rng);
        cs_all_paths(ctx, c, &p, "scores near -1e38", CS_EXPECT_REFERENCE, huge_prefill);
        /* within the prefill kernels' range: scores up to 1.5e8 (2.2e8 in log2 units) */
        kva_attn_params p8 = p;
        p8.sm_scale = 1e8f;
        for (int j = 0; j < CS_KEYS; ++j) b[j] = 1.5f - 3.f * (float)order[j] / CS_KEYS;
        cs_make(c, dt, 1.f, b, &rng);
        cs_all_paths(ctx, c, &p8, "scores up to 1.5e8", CS_EXPECT_REFERENCE, CS_EXPECT_REFERENCE);
        for (int j = 0; j < CS_KEYS; ++j) b[j] = -1.f - 0.0125f * (float)order[j];
        cs_make(c, dt, 1.f, b, &rng);
        cs_all_paths(ctx, c, &p8, "scores near -1e8", CS_EXPECT_REFERENCE, CS_EXPECT_REFERENCE);

        for (int j = 0; j < CS_KEYS; ++j) b[j] = kva_rng_uniform(&rng, -1.f, 1.f);
        b[CS_KEYS / 2] = 3.f;
        cs_make(c, dt, 1.f, b, &rng);
        cs_all_paths(ctx, c, &p, "one score of 3e38", CS_EXPECT_NAN, CS_EXPECT_NAN);

        for (int j = 0; j < CS_KEYS; ++j) b[j] = 3.f + 0.01f * (float)j;
        cs_make(c, dt, 1.f, b, &rng);
        cs_all_paths(ctx, c, &p, "every score above 3e38", CS_EXPECT_NAN, CS_EXPECT_NAN);

        for (int j = 0; j < CS_KEYS; ++j) b[j] = -3.f - 0.01f * (float)j;
        cs_make(c, dt, 1.f, b, &rng);
        cs_all_paths(ctx, c, &p, "every score below -3e38", CS_EXPECT_NAN, CS_EXPECT_NAN);

        /* a soft cap of +inf is no cap (it was inf * tanh(0) = NaN on the prefill paths) */
        kva_attn_params inf_cap = kva_attn_params_default(1, 1, CS_D);
        inf_cap.logits_soft_cap = INFINITY;
        for (int j = 0; j < CS_KEYS; ++j) b[j] = kva_rng_uniform(&rng, -2.f, 2.f);
        cs_make(c, dt, 3.f, b, &rng);
        cs_all_paths(ctx, c, &inf_cap, "a soft cap of +inf", CS_EXPECT_REFERENCE, CS_EXPECT_REFERENCE);

        /* the same huge scores through a soft cap of 30 are in range */
        kva_attn_params capped = p;
        capped.logits_soft_cap = 30.f;
        for (int j = 0; j < CS_KEYS; ++j) b[j] = kva_rng_uniform(&rng, -3.f, 3.f);
        cs_make(c, dt, 1.f, b, &rng);
        cs_all_paths(ctx, c, &capped, "scores of 3e38 under a soft cap", CS_EXPECT_REFERENCE, CS_EXPECT_REFERENCE);

        if (dt != KVA_F16) { /* dot products that overflow f32 themselves */
            kva_attn_params plain = kva_attn_params_default(1, 1, CS_D);
            for (int j = 0; j < CS_KEYS; ++j) b[j] = 1e30f;
            cs_make(c, dt, 1e30f, b, &rng);
            cs_all_paths(ctx, c, &plain, "dot products of 1e60", CS_EXPECT_NAN, CS_EXPECT_NAN);
            /* under a soft cap the float64 reference saturates them too: the cap, not NaN (the
             * CPU returns NaN here; both are allowed by kvattn.h) */
            plain.logits_soft_cap = 30.f;
            cs_all_paths(ctx, c, &plain, "dot products of 1e60 under a soft cap", CS_EXPECT_REFERENCE,
                         CS_EXPECT_REFERENCE);
        }
    }
    free(c);
    kva_context_destroy(ctx);
}

/* kva_merge_states on CUDA: a NaN state stays NaN beside empty and finite ones. */
KVA_TEST(cuda_score_range_merge_keeps_nan) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    enum { ROWS = 2, STATES = 3 };
    float v[ROWS * STATES * CS_D], lse[ROWS * STATES] = {NAN, -INFINITY, -INFINITY, 0.5f, NAN, 1.f};
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_fill_random(&rng, v, KVA_F32, ROWS * STATES * CS_D, -1.f, 1.f);
    void *vd = cuda_test_upload(ctx, v, sizeof v), *ld = cuda_test_upload(ctx, lse, sizeof lse);
    void *od = cuda_test_poisoned(ctx, ROWS * CS_D * sizeof(float));
    float *lod = cuda_test_poisoned(ctx, ROWS * sizeof(float));
    if (vd && ld && od && lod) {
        CHECK_OK(kva_merge_states(ctx, ROWS, STATES, CS_D, KVA_F32, vd, ld, od, lod));
        CHECK_OK(kva_synchronize(ctx));
        float *o = cuda_test_download(ctx, od, ROWS * CS_D * sizeof(float));
        float *lo = cuda_test_download(ctx, lod, ROWS * sizeof(float));
        for (int r = 0; o && lo && r < ROWS; ++r) {
            int nan_o = 0;
            for (int i = 0; i < CS_D; ++i) nan_o += isnan(o[r * CS_D + i]) ? 1 : 0;
            CHECK_MSG(nan_o == CS_D && isnan(lo[r]), "row %d: %d NaN outputs, lse %g", r, nan_o,
                      (double)lo[r]);
        }
        free(o);
        free(lo);
    }
    kva_free(ctx, vd);
    kva_free(ctx, ld);
    kva_free(ctx, od);
    kva_free(ctx, lod);
    kva_context_destroy(ctx);
}
