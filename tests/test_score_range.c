/*
 * test_score_range.c -- parameters and scores at the edge of f32: a soft cap of +inf (no cap),
 * infinite scales (refused), and scores so large that s * log2(e) leaves f32 (the kernels keep
 * scores in log2 units). Such rows must come back NaN, never as an empty row or a finite wrong
 * LSE; scores just inside the range must match the float64 reference, which itself must not
 * share the kernels' blind spots (inf * 0).
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SR_D = 16, SR_KEYS = 40, SR_PS = 16, SR_PAGES = 3 };

/* One query, SR_KEYS keys, one head: s_j = a * b_j exactly (only dimension 0 is non-zero). */
typedef struct sr_case {
    float q[SR_D], k[SR_PAGES * SR_PS * SR_D], v[SR_PAGES * SR_PS * SR_D];
    float o[SR_D], lse;
} sr_case;

static void sr_make(sr_case *c, float a, const float *b, kva_rng *rng) {
    memset(c, 0, sizeof *c);
    c->q[0] = a;
    for (int j = 0; j < SR_KEYS; ++j) c->k[j * SR_D] = b[j];
    kva_fill_random(rng, c->v, KVA_F32, SR_KEYS * SR_D, -1, 1);
}

/* A new case of query a against keys drawn uniformly from [-spread, spread) (rng seeded). */
static sr_case *sr_random(kva_rng *rng, float a, float spread) {
    kva_rng_seed(rng, kva_test_seed());
    sr_case *c = kva_test_alloc(sizeof *c);
    float b[SR_KEYS];
    for (int j = 0; j < SR_KEYS; ++j) b[j] = kva_rng_uniform(rng, -spread, spread);
    sr_make(c, a, b, rng);
    return c;
}

static void sr_reference(const sr_case *c, const kva_attn_params *p, double *o, double *lse) {
    double q[SR_D], k[SR_KEYS * SR_D], v[SR_KEYS * SR_D];
    for (int i = 0; i < SR_D; ++i) q[i] = c->q[i];
    for (int i = 0; i < SR_KEYS * SR_D; ++i) k[i] = c->k[i], v[i] = c->v[i];
    kva_ref_attention(p, 1, SR_KEYS, q, k, v, o, lse);
}

static bool all_nan(const float *x, int n) {
    for (int i = 0; i < n; ++i)
        if (!isnan(x[i])) return false;
    return true;
}

/* Runs c through every CPU path into c->o / c->lse, path by path; `check` compares each. */
typedef void (*sr_check_fn)(const char *path, const sr_case *c, const kva_attn_params *p);

static void sr_all_paths(kva_context *ctx, sr_case *c, const kva_attn_params *p, sr_check_fn check) {
    /* dense (the prefill engine) */
    memset(c->o, 0, sizeof c->o);
    c->lse = 0;
    kva_status st = kva_attention(ctx, p, 1, SR_KEYS, kva_tensor_nhd(c->q, KVA_F32, 1, SR_D),
                                  kva_tensor_nhd(c->k, KVA_F32, 1, SR_D),
                                  kva_tensor_nhd(c->v, KVA_F32, 1, SR_D),
                                  kva_tensor_nhd(c->o, KVA_F32, 1, SR_D), &c->lse);
    CHECK_MSG(st == KVA_OK, "kva_attention: %s", kva_last_error());
    check("attention", c, p);

    /* paged decode: unsplit, split (partial rowmax), global rowmax split and unsplit */
    kva_plan_limits lim = {.max_batch = 1, .max_total_pages = SR_PAGES, .num_qo_heads = 1,
                           .num_kv_heads = 1, .head_dim = SR_D, .page_size = SR_PS,
                           .min_fixed_chunk = 8};
    kva_workspace ws = {0};
    if (kva_decode_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes) != KVA_OK) {
        CHECK_MSG(0, "%s", kva_last_error());
        return;
    }
    kva_malloc(ctx, ws.device_bytes, &ws.device);
    kva_host_alloc(ctx, ws.host_bytes, &ws.host);
    int32_t indptr[2] = {0, SR_PAGES}, idx[SR_PAGES] = {0, 1, 2}, last[1] = {SR_KEYS - 2 * SR_PS};
    kva_page_table t = {1, indptr, idx, last};
    kva_kv_pages pages = kva_kv_pages_separate(c->k, c->v, KVA_F32, SR_PAGES, SR_PS, 1, SR_D,
                                               KVA_LAYOUT_NHD);
    const kva_plan_options opts[4] = {{KVA_PLAN_NO_SPLIT, 0, KVA_DECODE_PARTIAL_ROWMAX},
                                      {0, 8, KVA_DECODE_PARTIAL_ROWMAX},
                                      {KVA_PLAN_NO_SPLIT, 0, KVA_DECODE_GLOBAL_ROWMAX},
                                      {0, 8, KVA_DECODE_GLOBAL_ROWMAX}};
    const char *names[4] = {"decode", "decode split", "decode global-rowmax",
                            "decode global-rowmax split"};
    for (int m = 0; m < 4; ++m) {
        kva_plan plan;
        if (kva_decode_plan(ctx, &lim, &t, SR_PAGES, &opts[m], ws, &plan) != KVA_OK) {
            CHECK_MSG(0, "%s: %s", names[m], kva_last_error());
            continue;
        }
        memset(c->o, 0, sizeof c->o);
        c->lse = 0;
        st = kva_decode_run(ctx, &plan, p, kva_tensor_nhd(c->q, KVA_F32, 1, SR_D), &pages,
                            kva_tensor_nhd(c->o, KVA_F32, 1, SR_D), &c->lse);
        CHECK_MSG(st == KVA_OK, "%s: %s", names[m], kva_last_error());
        check(names[m], c, p);
    }
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
}

static void expect_reference(const char *path, const sr_case *c, const kva_attn_params *p) {
    double o[SR_D], lse;
    sr_reference(c, p, o, &lse);
    char what[96];
    snprintf(what, sizeof what, "%s output", path);
    CHECK(kva_compare(what, c->o, KVA_F32, o, SR_D, kva_tol_for(KVA_F32), NULL) == 0);
    snprintf(what, sizeof what, "%s lse", path);
    CHECK(kva_compare_lse(what, &c->lse, &lse, 1, KVA_F32, NULL) == 0);
}

static void expect_nan(const char *path, const sr_case *c, const kva_attn_params *p) {
    (void)p;
    CHECK_MSG(all_nan(c->o, SR_D) && isnan(c->lse),
              "%s: out-of-range scores gave o[0] = %g, lse = %g instead of NaN", path,
              (double)c->o[0], (double)c->lse);
}

/* Defect 2: a soft cap of +inf is no cap (it was inf * tanh(0) = NaN -> output 0, LSE -inf, and
 * the reference agreed); an infinite scale is refused. */
KVA_TEST_CPU_VARIANTS(score_range_infinite_soft_cap_means_none) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    sr_case *c = sr_random(&rng, 1.5f, 2.0f);
    kva_attn_params p = kva_attn_params_default(1, 1, SR_D);
    p.logits_soft_cap = INFINITY;
    /* the reference itself: a cap of +inf equals no cap */
    kva_attn_params none = p;
    none.logits_soft_cap = 0;
    double o1[SR_D], o2[SR_D], l1, l2;
    sr_reference(c, &p, o1, &l1);
    sr_reference(c, &none, o2, &l2);
    CHECK(isfinite(l1) && l1 == l2);
    for (int i = 0; i < SR_D; ++i) CHECK(o1[i] == o2[i]);
    sr_all_paths(ctx, c, &p, expect_reference);

    kva_attn_params inf_scale = kva_attn_params_default(1, 1, SR_D);
    inf_scale.sm_scale = INFINITY;
    CHECK_STATUS(kva_attention(ctx, &inf_scale, 1, SR_KEYS, kva_tensor_nhd(c->q, KVA_F32, 1, SR_D),
                               kva_tensor_nhd(c->k, KVA_F32, 1, SR_D),
                               kva_tensor_nhd(c->v, KVA_F32, 1, SR_D),
                               kva_tensor_nhd(c->o, KVA_F32, 1, SR_D), &c->lse),
                 KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "params.sm_scale") != NULL);
    inf_scale.sm_scale = NAN;
    CHECK_STATUS(kva_attention(ctx, &inf_scale, 1, SR_KEYS, kva_tensor_nhd(c->q, KVA_F32, 1, SR_D),
                               kva_tensor_nhd(c->k, KVA_F32, 1, SR_D),
                               kva_tensor_nhd(c->v, KVA_F32, 1, SR_D),
                               kva_tensor_nhd(c->o, KVA_F32, 1, SR_D), &c->lse),
                 KVA_ERR_INVALID_ARG);
    free(c);
    kva_context_destroy(ctx);
}

static float identity_mod(float s, int32_t q_pos, int32_t kv_pos, int32_t qo_head, void *user) {
    (void)q_pos, (void)kv_pos, (void)qo_head, (void)user;
    return s;
}

/* Defect 3: scores up to ~2e38 are computed right; beyond f32 range in log2 units (or an
 * overflowing dot product) the row is NaN, not an empty row (0, -inf) nor a finite LSE. Every CPU
 * kernel variant (each has its own compiled overflow check). */
KVA_TEST_CPU_VARIANTS(score_range_huge_scores_are_exact_or_nan) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    sr_case *c = kva_test_alloc(sizeof *c);
    float b[SR_KEYS];
    kva_attn_params p = kva_attn_params_default(1, 1, SR_D);
    p.sm_scale = 1.0f;
    kva_attn_params via_mod = p; /* the variants path: same scores through score_mod */
    via_mod.score_mod = identity_mod;

    /* inside the range: scores 2e38, 1e38, ... -2e38 */
    for (int j = 0; j < SR_KEYS; ++j) b[j] = 2e19f - 4e19f * (float)j / SR_KEYS;
    sr_make(c, 1e19f, b, &rng);
    sr_all_paths(ctx, c, &p, expect_reference);
    /* all keys hugely negative but in range: a finite LSE near -1e38 */
    for (int j = 0; j < SR_KEYS; ++j) b[j] = -1e19f - 1e17f * (float)j;
    sr_make(c, 1e19f, b, &rng);
    sr_all_paths(ctx, c, &p, expect_reference);

    /* one score of 3e38 (finite, but 4.3e38 in log2 units) */
    for (int j = 0; j < SR_KEYS; ++j) b[j] = kva_rng_uniform(&rng, -1, 1);
    b[SR_KEYS / 2] = 3e19f;
    sr_make(c, 1e19f, b, &rng);
    sr_all_paths(ctx, c, &p, expect_nan);
    sr_all_paths(ctx, c, &via_mod, expect_nan);
    /* every score huge and positive: LSE used to be -inf */
    for (int j = 0; j < SR_KEYS; ++j) b[j] = 3e19f + 1e17f * (float)j;
    sr_make(c, 1e19f, b, &rng);
    sr_all_paths(ctx, c, &p, expect_nan);
    /* every score huge and negative: used to come back as an empty row */
    for (int j = 0; j < SR_KEYS; ++j) b[j] = -3e19f;
    sr_make(c, 1e19f, b, &rng);
    sr_all_paths(ctx, c, &p, expect_nan);
    /* a dot product that overflows f32 itself */
    for (int j = 0; j < SR_KEYS; ++j) b[j] = 1e30f;
    sr_make(c, 1e30f, b, &rng);
    sr_all_paths(ctx, c, &p, expect_nan);
    free(c);
    kva_context_destroy(ctx);
}

static float plus_inf_at_key_7(float s, int32_t q_pos, int32_t kv_pos, int32_t qo_head, void *user) {
    (void)q_pos, (void)qo_head, (void)user;
    return kv_pos == 7 ? INFINITY : s;
}

static float nan_at_key_7(float s, int32_t q_pos, int32_t kv_pos, int32_t qo_head, void *user) {
    (void)q_pos, (void)qo_head, (void)user;
    return kv_pos == 7 ? NAN : s;
}

/* A score_mod that returns +inf or NaN for a visible key puts the row out of range: NaN, as the
 * float64 reference gives, never an empty row (+inf used to give o = 0, LSE -inf) nor a finite
 * row that silently dropped the key (NaN did). Only -inf masks a key. Every CPU kernel variant. */
KVA_TEST_CPU_VARIANTS(score_range_score_mod_inf_or_nan_gives_nan) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    sr_case *c = sr_random(&rng, 1.0f, 1.0f);
    kva_attn_params p = kva_attn_params_default(1, 1, SR_D);
    const kva_score_mod_fn mods[2] = {plus_inf_at_key_7, nan_at_key_7};
    for (int m = 0; m < 2; ++m) {
        p.score_mod = mods[m];
        double o[SR_D], lse;
        sr_reference(c, &p, o, &lse);
        CHECK(isnan(lse) && isnan(o[0])); /* the oracle's answer */
        sr_all_paths(ctx, c, &p, expect_nan);
        p.logits_soft_cap = 30.0f; /* the same through the soft-cap path */
        sr_all_paths(ctx, c, &p, expect_nan);
        p.logits_soft_cap = 0.0f;
    }
    free(c);
    kva_context_destroy(ctx);
}

/* sm_scale / logits_soft_cap = +inf pass the NaN check but turn every score into NaN
 * (inf * tanh(s / inf) = inf * 0): the call must be refused, or give finite output. */
KVA_TEST(score_range_infinite_scale_or_soft_cap_never_gives_nan) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    enum { QL = 3, KL = 5, IS_HQ = 2, IS_HK = 1, IS_D = 16 };
    size_t nq = (size_t)QL * IS_HQ * IS_D, nk = (size_t)KL * IS_HK * IS_D;
    float *q = kva_test_alloc(nq * 4), *o = kva_test_alloc(nq * 4);
    float *k = kva_test_alloc(nk * 4), *v = kva_test_alloc(nk * 4);
    float lse[QL * IS_HQ];
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_fill_random(&rng, q, KVA_F32, nq, -1.0f, 1.0f);
    kva_fill_random(&rng, k, KVA_F32, nk, -1.0f, 1.0f);
    kva_fill_random(&rng, v, KVA_F32, nk, -1.0f, 1.0f);
    kva_tensor tq = kva_tensor_nhd(q, KVA_F32, IS_HQ, IS_D), to = kva_tensor_nhd(o, KVA_F32, IS_HQ, IS_D);
    kva_tensor tk = kva_tensor_nhd(k, KVA_F32, IS_HK, IS_D), tv = kva_tensor_nhd(v, KVA_F32, IS_HK, IS_D);
    for (int which = 0; which < 2; ++which) {
        kva_attn_params p = kva_attn_params_default(IS_HQ, IS_HK, IS_D);
        if (which == 0) p.logits_soft_cap = INFINITY;
        else p.sm_scale = INFINITY;
        kva_poison(o, nq * 4);
        kva_status st = kva_attention(ctx, &p, QL, KL, tq, tk, tv, to, lse);
        if (st == KVA_OK) {
            int bad = 0;
            for (size_t i = 0; i < nq; ++i) bad += !isfinite(o[i]);
            CHECK_MSG(bad == 0, "%s = inf: %d non-finite outputs", which ? "sm_scale" : "soft cap", bad);
        } else {
            CHECK(st == KVA_ERR_INVALID_ARG);
        }
    }
    free(q); free(o); free(k); free(v);
    kva_context_destroy(ctx);
}
