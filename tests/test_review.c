/*
 * test_review.c -- regression tests for defects found in a correctness review of the public
 * contract (include/kvattn.h): stale plans that a re-plan silently replaced, and plan limits so
 * large that the workspace size arithmetic wraps around (an undersized workspace the planner
 * would then write past).
 */
#include "harness.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

enum { RV_HQ = 2, RV_HK = 1, RV_D = 16, RV_PS = 16, RV_POOL = 16, RV_MAXB = 8 };

/* A decode plan struct made before a re-plan into the same workspace must be refused when the
 * new plan differs in batch size, even if it happens to have the same number of work items:
 * the run reads the header's batch, while q / o were checked against the stale struct's. */
KVA_TEST(review_stale_decode_plan_same_num_work_is_refused) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {RV_MAXB, RV_POOL, 0, 0, RV_HQ, RV_HK, RV_D, RV_PS, 0};
    size_t dev_bytes = 0, host_bytes = 0;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &dev_bytes, &host_bytes));
    kva_workspace ws = {NULL, dev_bytes, NULL, host_bytes};
    REQUIRE_OK(kva_malloc(ctx, dev_bytes, &ws.device));
    REQUIRE_OK(kva_host_alloc(ctx, host_bytes, &ws.host));

    size_t pool_elems = (size_t)RV_POOL * RV_PS * RV_HK * RV_D;
    float *k = kva_test_alloc(pool_elems * sizeof(float));
    float *v = kva_test_alloc(pool_elems * sizeof(float));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_fill_random(&rng, k, KVA_F32, pool_elems, -1.0f, 1.0f);
    kva_fill_random(&rng, v, KVA_F32, pool_elems, -1.0f, 1.0f);
    kva_kv_pages pages =
        kva_kv_pages_separate(k, v, KVA_F32, RV_POOL, RV_PS, RV_HK, RV_D, KVA_LAYOUT_NHD);

    /* Plan A: 2 requests of 2 pages each, chunk 16 -> 4 work items. */
    int32_t a_indptr[3] = {0, 2, 4}, a_idx[4] = {0, 1, 2, 3}, a_last[2] = {RV_PS, RV_PS};
    kva_page_table a = {2, a_indptr, a_idx, a_last};
    kva_plan_options opt = {0, RV_PS, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan_a;
    REQUIRE_OK(kva_decode_plan(ctx, &lim, &a, RV_POOL, &opt, ws, &plan_a));
    CHECK(plan_a.num_work == 4);

    /* Plan B into the same workspace: 4 requests of 1 page each -> also 4 work items. */
    int32_t b_indptr[5] = {0, 1, 2, 3, 4}, b_idx[4] = {4, 5, 6, 7};
    int32_t b_last[4] = {3, 5, 7, 9};
    kva_page_table bt = {4, b_indptr, b_idx, b_last};
    kva_plan plan_b;
    REQUIRE_OK(kva_decode_plan(ctx, &lim, &bt, RV_POOL, &opt, ws, &plan_b));
    CHECK(plan_b.num_work == 4);

    /* q / o sized for 4 requests so that an unfixed library does not corrupt memory here. */
    size_t row_elems = (size_t)4 * RV_HQ * RV_D;
    float *q = kva_test_alloc(row_elems * sizeof(float));
    float *o = kva_test_alloc(row_elems * sizeof(float));
    kva_fill_random(&rng, q, KVA_F32, row_elems, -1.0f, 1.0f);
    kva_poison(o, row_elems * sizeof(float));
    kva_attn_params params = kva_attn_params_default(RV_HQ, RV_HK, RV_D);
    kva_tensor tq = kva_tensor_nhd(q, KVA_F32, RV_HQ, RV_D);
    kva_tensor to = kva_tensor_nhd(o, KVA_F32, RV_HQ, RV_D);
    CHECK_STATUS(kva_decode_run(ctx, &plan_a, &params, tq, &pages, to, NULL), KVA_ERR_BAD_STATE);
    /* The current plan still runs. */
    CHECK_OK(kva_decode_run(ctx, &plan_b, &params, tq, &pages, to, NULL));

    free(q);
    free(o);
    free(k);
    free(v);
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    kva_context_destroy(ctx);
}

/* Limits whose workspace would not be addressable must be refused, never answered with a size
 * that wrapped around (the planner then writes at offsets far past the buffer). */
KVA_TEST(review_huge_plan_limits_are_refused) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    size_t dev_bytes = 0, host_bytes = 0;

    /* Page count beyond int32: the CSR totals are int32, and 4 * 2^62 bytes wraps to 0. */
    kva_plan_limits lim = {4, (int64_t)1 << 62, 0, 0, RV_HQ, RV_HK, RV_D, RV_PS, 0};
    CHECK(kva_decode_workspace_size(ctx, &lim, &dev_bytes, &host_bytes) != KVA_OK);
    lim.max_total_pages = 64;
    lim.max_total_qo = (int64_t)1 << 62;
    CHECK(kva_prefill_workspace_size(ctx, &lim, &dev_bytes, &host_bytes) != KVA_OK);
    lim.max_total_qo = 64;
    lim.max_total_kv = (int64_t)1 << 62;
    CHECK(kva_decode_workspace_size(ctx, &lim, &dev_bytes, &host_bytes) != KVA_OK);

    /* Each field in range, but partial O = batch x heads x head_dim x 4 bytes overflows 64 bits. */
    kva_plan_limits wide = {INT32_MAX, 64, 0, 0, 1 << 30, 1, 256, RV_PS, 0};
    kva_status st = kva_decode_workspace_size(ctx, &wide, &dev_bytes, &host_bytes);
    CHECK_MSG(st != KVA_OK, "2^31 x 2^30 x 256 x 4 bytes reported as %zu device bytes", dev_bytes);

    /* Sane limits still work. */
    kva_plan_limits ok = {4, 64, 0, 16, RV_HQ, RV_HK, RV_D, RV_PS, 0};
    CHECK_OK(kva_decode_workspace_size(ctx, &ok, &dev_bytes, &host_bytes));
    CHECK_OK(kva_prefill_workspace_size(ctx, &ok, &dev_bytes, &host_bytes));
    kva_context_destroy(ctx);
}

/* A batch of 0 plans and runs as a no-op (decode and prefill). */
KVA_TEST(review_empty_batch_plans_and_runs) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {RV_MAXB, RV_POOL, 64, 64, RV_HQ, RV_HK, RV_D, RV_PS, 0};
    size_t db = 0, hb = 0, pdb = 0, phb = 0;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &db, &hb));
    REQUIRE_OK(kva_prefill_workspace_size(ctx, &lim, &pdb, &phb));
    if (pdb > db) db = pdb;
    if (phb > hb) hb = phb;
    kva_workspace ws = {NULL, db, NULL, hb};
    REQUIRE_OK(kva_malloc(ctx, db, &ws.device));
    REQUIRE_OK(kva_host_alloc(ctx, hb, &ws.host));
    int32_t zero[1] = {0};
    kva_page_table empty = {0, zero, NULL, NULL};
    kva_plan plan;
    CHECK_OK(kva_decode_plan(ctx, &lim, &empty, RV_POOL, NULL, ws, &plan));
    CHECK(plan.num_work == 0);
    kva_attn_params params = kva_attn_params_default(RV_HQ, RV_HK, RV_D);
    float dummy[RV_HK * RV_D] __attribute__((aligned(16)));
    kva_kv_pages pages =
        kva_kv_pages_separate(dummy, dummy, KVA_F32, RV_POOL, RV_PS, RV_HK, RV_D, KVA_LAYOUT_NHD);
    kva_tensor none = {NULL, KVA_F32, RV_HQ * RV_D, RV_D};
    CHECK_OK(kva_decode_run(ctx, &plan, &params, none, &pages, none, NULL));
    CHECK_OK(kva_prefill_plan(ctx, &lim, 0, zero, zero, NULL, 0, NULL, ws, &plan));
    CHECK_OK(kva_prefill_run_ragged(ctx, &plan, &params, none, none, none, none, NULL));
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    kva_context_destroy(ctx);
}

/* The header: "limits->page_size = 0 sizes for ragged (kv_indptr) plans only" -- whatever
 * max_total_pages holds (a limits struct shared with decode sizing, say). */
KVA_TEST(review_prefill_workspace_page_size_zero_is_ragged_only) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {4, 64, 256, 64, RV_HQ, RV_HK, RV_D, 0, 0};
    size_t db = 0, hb = 0, rdb = 0, rhb = 0;
    CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &db, &hb));
    lim.max_total_pages = 0;
    CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &rdb, &rhb));
    CHECK(db == rdb && hb == rhb);
    kva_context_destroy(ctx);
}

/* sm_scale / logits_soft_cap = +inf pass the NaN check but turn every score into NaN
 * (inf * tanh(s / inf) = inf * 0): the call must be refused, or give finite output. */
KVA_TEST(review_infinite_scale_or_soft_cap_never_gives_nan) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    enum { QL = 3, KL = 5 };
    size_t nq = (size_t)QL * RV_HQ * RV_D, nk = (size_t)KL * RV_HK * RV_D;
    float *q = kva_test_alloc(nq * 4), *o = kva_test_alloc(nq * 4);
    float *k = kva_test_alloc(nk * 4), *v = kva_test_alloc(nk * 4);
    float lse[QL * RV_HQ];
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_fill_random(&rng, q, KVA_F32, nq, -1.0f, 1.0f);
    kva_fill_random(&rng, k, KVA_F32, nk, -1.0f, 1.0f);
    kva_fill_random(&rng, v, KVA_F32, nk, -1.0f, 1.0f);
    kva_tensor tq = kva_tensor_nhd(q, KVA_F32, RV_HQ, RV_D), to = kva_tensor_nhd(o, KVA_F32, RV_HQ, RV_D);
    kva_tensor tk = kva_tensor_nhd(k, KVA_F32, RV_HK, RV_D), tv = kva_tensor_nhd(v, KVA_F32, RV_HK, RV_D);
    for (int which = 0; which < 2; ++which) {
        kva_attn_params p = kva_attn_params_default(RV_HQ, RV_HK, RV_D);
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
