/*
 * test_plan_validation.c -- what plan and sizing calls accept and what they leave behind:
 * workspaces sized for fixed chunk sizes, plans made stale by later plan calls (successful or
 * not), sizing calls that fail without writing, limits / options refused like the runs would
 * refuse them, limits whose workspace size would wrap around, and empty batches.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { PV_HQ = 2, PV_HK = 1, PV_D = 16, PV_PS = 16, PV_POOL = 64, PV_MAXB = 8 };

typedef struct pv_fixture {
    kva_context *ctx;
    kva_plan_limits lim;
    kva_workspace ws;
    float *k, *v, *q, *o;
    kva_kv_pages pages;
} pv_fixture;

static bool pv_open(pv_fixture *f, int32_t threads, int32_t min_fixed_chunk) {
    memset(f, 0, sizeof *f);
    if (kva_context_create(KVA_DEVICE_CPU, 0, &f->ctx) != KVA_OK) return false;
    if (threads > 0) kva_context_set_threads(f->ctx, threads);
    kva_plan_limits lim = {.max_batch = PV_MAXB, .max_total_pages = PV_POOL, .num_qo_heads = PV_HQ,
                           .num_kv_heads = PV_HK, .head_dim = PV_D, .page_size = PV_PS,
                           .min_fixed_chunk = min_fixed_chunk};
    f->lim = lim;
    if (kva_decode_workspace_size(f->ctx, &f->lim, &f->ws.device_bytes, &f->ws.host_bytes) != KVA_OK)
        return false;
    kva_malloc(f->ctx, f->ws.device_bytes, &f->ws.device);
    kva_host_alloc(f->ctx, f->ws.host_bytes, &f->ws.host);
    size_t pool = (size_t)PV_POOL * PV_PS * PV_HK * PV_D;
    f->k = kva_test_alloc(pool * sizeof(float));
    f->v = kva_test_alloc(pool * sizeof(float));
    f->q = kva_test_alloc((size_t)PV_MAXB * PV_HQ * PV_D * sizeof(float));
    f->o = kva_test_alloc((size_t)PV_MAXB * PV_HQ * PV_D * sizeof(float));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_fill_random(&rng, f->k, KVA_F32, pool, -1, 1);
    kva_fill_random(&rng, f->v, KVA_F32, pool, -1, 1);
    kva_fill_random(&rng, f->q, KVA_F32, (size_t)PV_MAXB * PV_HQ * PV_D, -1, 1);
    f->pages = kva_kv_pages_separate(f->k, f->v, KVA_F32, PV_POOL, PV_PS, PV_HK, PV_D,
                                     KVA_LAYOUT_NHD);
    return f->ws.device && f->ws.host;
}

static void pv_close(pv_fixture *f) {
    kva_free(f->ctx, f->ws.device);
    kva_host_free(f->ctx, f->ws.host);
    free(f->k);
    free(f->v);
    free(f->q);
    free(f->o);
    kva_context_destroy(f->ctx);
}

static kva_status pv_run(pv_fixture *f, const kva_plan *plan) {
    kva_attn_params p = kva_attn_params_default(PV_HQ, PV_HK, PV_D);
    return kva_decode_run(f->ctx, plan, &p, kva_tensor_nhd(f->q, KVA_F32, PV_HQ, PV_D), &f->pages,
                          kva_tensor_nhd(f->o, KVA_F32, PV_HQ, PV_D), NULL);
}

/* Output of request b of `table` against the float64 reference; returns mismatches. */
static int64_t pv_check(pv_fixture *f, const kva_page_table *t) {
    kva_attn_params p = kva_attn_params_default(PV_HQ, PV_HK, PV_D);
    int64_t bad = 0;
    for (int32_t b = 0; b < t->batch_size; ++b) {
        int32_t len = kva_ref_paged_len(t, PV_PS, b);
        double *k = malloc(sizeof(double) * (size_t)(len + 1) * PV_HK * PV_D);
        double *v = malloc(sizeof(double) * (size_t)(len + 1) * PV_HK * PV_D);
        double q[PV_HQ * PV_D], o[PV_HQ * PV_D];
        kva_ref_read_paged(&f->pages, t, b, k, v);
        for (int i = 0; i < PV_HQ * PV_D; ++i) q[i] = f->q[(size_t)b * PV_HQ * PV_D + i];
        kva_ref_attention(&p, 1, len, q, k, v, o, NULL);
        bad += kva_compare("decode", f->o + (size_t)b * PV_HQ * PV_D, KVA_F32, o, PV_HQ * PV_D,
                           kva_tol_for(KVA_F32), NULL);
        free(k);
        free(v);
    }
    return bad;
}

/* n requests of `pages_each` full pages, pages first..first+n*pages_each-1. */
typedef struct pv_table {
    int32_t indptr[PV_MAXB + 1], indices[PV_POOL], last[PV_MAXB];
    kva_page_table t;
} pv_table;

static void pv_table_make(pv_table *pt, int32_t n, int32_t pages_each, int32_t first, int32_t last) {
    pt->indptr[0] = 0;
    for (int32_t b = 0; b < n; ++b) {
        pt->indptr[b + 1] = pt->indptr[b] + pages_each;
        pt->last[b] = last;
    }
    for (int32_t i = 0; i < n * pages_each; ++i) pt->indices[i] = (first + i) % PV_POOL;
    pt->t = (kva_page_table){n, pt->indptr, pt->indices, pt->last};
}

/* Defect 4: a fixed chunk size made more work items than the searched capacity, which depends
 * on the core count, so the sized workspace was "too small". limits.min_fixed_chunk sizes for
 * it; the plan then fits on every thread count. */
KVA_TEST(plan_fixed_chunk_fits_workspace_sized_for_it) {
    const int32_t threads[] = {1, 2, 3, 64};
    for (int i = 0; i < 4; ++i) {
        pv_fixture f;
        if (!pv_open(&f, threads[i], 1)) {
            CHECK_MSG(0, "fixture: %s", kva_last_error());
            pv_close(&f);
            return;
        }
        pv_table pt;
        pv_table_make(&pt, PV_MAXB, PV_POOL / PV_MAXB, 0, PV_PS); /* 8 x 128 keys */
        kva_plan_options opt = {0, 1, KVA_DECODE_PARTIAL_ROWMAX};  /* 1024 work items */
        kva_plan plan;
        CHECK_OK(kva_decode_plan(f.ctx, &f.lim, &pt.t, PV_POOL, &opt, f.ws, &plan));
        CHECK_OK(pv_run(&f, &plan));
        CHECK(pv_check(&f, &pt.t) == 0);
        opt.fixed_chunk_size = 7;
        CHECK_OK(kva_decode_plan(f.ctx, &f.lim, &pt.t, PV_POOL, &opt, f.ws, &plan));
        CHECK_OK(pv_run(&f, &plan));
        CHECK(pv_check(&f, &pt.t) == 0);
        pv_close(&f);
    }
    /* Sized without it, the failure says what to do; a chunk below min_fixed_chunk is refused. */
    pv_fixture f;
    if (!pv_open(&f, 1, 0)) {
        pv_close(&f);
        return;
    }
    pv_table pt;
    pv_table_make(&pt, PV_MAXB, PV_POOL / PV_MAXB, 0, PV_PS);
    kva_plan_options opt = {0, 1, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan;
    CHECK_STATUS(kva_decode_plan(f.ctx, &f.lim, &pt.t, PV_POOL, &opt, f.ws, &plan),
                 KVA_ERR_WORKSPACE_TOO_SMALL);
    CHECK_MSG(strstr(kva_last_error(), "min_fixed_chunk") != NULL, "message: %s", kva_last_error());
    pv_close(&f);
    if (!pv_open(&f, 1, 4)) {
        pv_close(&f);
        return;
    }
    opt.fixed_chunk_size = 2;
    CHECK_STATUS(kva_decode_plan(f.ctx, &f.lim, &pt.t, PV_POOL, &opt, f.ws, &plan),
                 KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "limits.min_fixed_chunk") != NULL);
    pv_close(&f);
}

/* Defect 4 for prefill: ragged and paged prefill sized with min_fixed_chunk take chunk 1. */
KVA_TEST(plan_prefill_fixed_chunk_fits) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {.max_batch = 2, .max_total_pages = 8, .max_total_kv = 100,
                           .max_total_qo = 40, .num_qo_heads = 2, .num_kv_heads = 1,
                           .head_dim = 16, .page_size = 16, .min_fixed_chunk = 1};
    kva_workspace ws = {0};
    REQUIRE_OK(kva_prefill_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes));
    REQUIRE_OK(kva_malloc(ctx, ws.device_bytes, &ws.device));
    REQUIRE_OK(kva_host_alloc(ctx, ws.host_bytes, &ws.host));
    int32_t qo[3] = {0, 20, 40}, kv[3] = {0, 50, 100};
    kva_plan_options opt = {0, 1, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan;
    CHECK_OK(kva_prefill_plan(ctx, &lim, 2, qo, kv, NULL, 0, &opt, ws, &plan));
    int32_t indptr[3] = {0, 4, 8}, idx[8] = {0, 1, 2, 3, 4, 5, 6, 7}, last[2] = {16, 16};
    kva_page_table t = {2, indptr, idx, last};
    CHECK_OK(kva_prefill_plan(ctx, &lim, 2, qo, NULL, &t, 8, &opt, ws, &plan));
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    kva_context_destroy(ctx);
}

/* Defect 5: plan A, then plan B of the same shape into the same workspace. Running A used to
 * run B's page table without an error. */
KVA_TEST(plan_stale_same_shape_is_refused) {
    pv_fixture f;
    if (!pv_open(&f, 0, 0)) {
        pv_close(&f);
        return;
    }
    pv_table ta, tb;
    pv_table_make(&ta, 2, 2, 0, 5);
    pv_table_make(&tb, 2, 2, 20, 5); /* same lengths, other pages */
    kva_plan a, b;
    REQUIRE_OK(kva_decode_plan(f.ctx, &f.lim, &ta.t, PV_POOL, NULL, f.ws, &a));
    CHECK_OK(pv_run(&f, &a));
    CHECK(pv_check(&f, &ta.t) == 0);
    REQUIRE_OK(kva_decode_plan(f.ctx, &f.lim, &tb.t, PV_POOL, NULL, f.ws, &b));
    CHECK_STATUS(pv_run(&f, &a), KVA_ERR_BAD_STATE);
    CHECK_OK(pv_run(&f, &b));
    CHECK(pv_check(&f, &tb.t) == 0);
    pv_close(&f);
}

/* Defect 5: a plan call that fails early (too small a workspace, bad option, batch too large,
 * bad page table) still retires the plan the workspace held. */
KVA_TEST(plan_failed_replan_makes_old_plan_stale) {
    pv_fixture f;
    if (!pv_open(&f, 0, 0)) {
        pv_close(&f);
        return;
    }
    pv_table ta, big, bad;
    pv_table_make(&ta, 2, 2, 0, 5);
    pv_table_make(&big, PV_MAXB, 1, 0, 5);
    big.t.batch_size = PV_MAXB + 1; /* beyond max_batch (indptr is only read after the check) */
    pv_table_make(&bad, 2, 2, 0, 5);
    bad.indices[3] = 9000;
    for (int which = 0; which < 5; ++which) {
        kva_plan a, b;
        REQUIRE_OK(kva_decode_plan(f.ctx, &f.lim, &ta.t, PV_POOL, NULL, f.ws, &a));
        CHECK_OK(pv_run(&f, &a));
        kva_workspace small = f.ws;
        small.device_bytes = 64;
        kva_plan_options bad_algo = {0, 0, (kva_decode_algo)7};
        kva_plan_options bad_flags = {1u << 9, 0, KVA_DECODE_PARTIAL_ROWMAX};
        kva_status st = KVA_OK;
        switch (which) {
        case 0: st = kva_decode_plan(f.ctx, &f.lim, &ta.t, PV_POOL, NULL, small, &b); break;
        case 1: st = kva_decode_plan(f.ctx, &f.lim, &ta.t, PV_POOL, &bad_algo, f.ws, &b); break;
        case 2: st = kva_decode_plan(f.ctx, &f.lim, &big.t, PV_POOL, NULL, f.ws, &b); break;
        case 3: st = kva_decode_plan(f.ctx, &f.lim, &bad.t, PV_POOL, NULL, f.ws, &b); break;
        case 4: st = kva_decode_plan(f.ctx, &f.lim, &ta.t, PV_POOL, &bad_flags, f.ws, &b); break;
        }
        CHECK_MSG(st != KVA_OK, "case %d: the bad re-plan succeeded", which);
        CHECK_MSG(pv_run(&f, &a) == KVA_ERR_BAD_STATE, "case %d: old plan still runs", which);
    }
    pv_close(&f);
}

/* Defect 6: sizing for ragged succeeds, for paged fails: the outputs stay untouched. */
KVA_TEST(plan_prefill_workspace_size_writes_nothing_on_failure) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {.max_batch = 2, .max_total_pages = -1, .max_total_qo = 16,
                           .num_qo_heads = 2, .num_kv_heads = 1, .head_dim = 16, .page_size = 16};
    size_t dev = 12345, host = 54321;
    CHECK_STATUS(kva_prefill_workspace_size(ctx, &lim, &dev, &host), KVA_ERR_INVALID_ARG);
    CHECK(dev == 12345 && host == 54321);
    dev = 12345, host = 54321;
    CHECK_STATUS(kva_decode_workspace_size(ctx, &lim, &dev, &host), KVA_ERR_INVALID_ARG);
    CHECK(dev == 12345 && host == 54321);
    kva_context_destroy(ctx);
}

/* Defect 8: limits, options and pools are held to the documented ranges, and a plan is refused
 * for a head_dim its run would refuse. */
KVA_TEST(plan_limits_and_options_validated_like_runs) {
    pv_fixture f;
    if (!pv_open(&f, 0, 0)) {
        pv_close(&f);
        return;
    }
    size_t dev, host;
    kva_plan_limits lim = f.lim;
    lim.page_size = 65537;
    CHECK_STATUS(kva_decode_workspace_size(f.ctx, &lim, &dev, &host), KVA_ERR_INVALID_ARG);
    CHECK_STATUS(kva_prefill_workspace_size(f.ctx, &lim, &dev, &host), KVA_ERR_INVALID_ARG);
    lim.page_size = 65536;
    CHECK_OK(kva_decode_workspace_size(f.ctx, &lim, &dev, &host));

    pv_table ta;
    pv_table_make(&ta, 2, 2, 0, 5);
    kva_plan plan;
    lim = f.lim;
    lim.page_size = 70000;
    CHECK_STATUS(kva_decode_plan(f.ctx, &lim, &ta.t, PV_POOL, NULL, f.ws, &plan), KVA_ERR_INVALID_ARG);

    /* head_dim 24 is not a multiple of 16: the CPU runs refuse it, so must sizing and plans */
    lim = f.lim;
    lim.head_dim = 24;
    CHECK_STATUS(kva_decode_workspace_size(f.ctx, &lim, &dev, &host), KVA_ERR_UNSUPPORTED);
    CHECK_STATUS(kva_decode_plan(f.ctx, &lim, &ta.t, PV_POOL, NULL, f.ws, &plan), KVA_ERR_UNSUPPORTED);

    const uint32_t unknown[] = {1u << 3, 1u << 31, 0xffffffffu};
    for (int i = 0; i < 3; ++i) {
        kva_plan_options opt = {unknown[i], 0, KVA_DECODE_PARTIAL_ROWMAX};
        CHECK_STATUS(kva_decode_plan(f.ctx, &f.lim, &ta.t, PV_POOL, &opt, f.ws, &plan),
                     KVA_ERR_INVALID_ARG);
    }
    /* (KVA_PLAN_FULL_ATTENTION is a prefill hint: decode plans accept and ignore it) */
    kva_plan_options known = {KVA_PLAN_NO_SPLIT | KVA_PLAN_GRAPH | KVA_PLAN_FULL_ATTENTION, 0,
                              KVA_DECODE_PARTIAL_ROWMAX};
    CHECK_OK(kva_decode_plan(f.ctx, &f.lim, &ta.t, PV_POOL, &known, f.ws, &plan));

    /* a run with a pool whose page_size is out of range names it */
    kva_kv_pages pg = f.pages;
    pg.page_size = 70000;
    kva_attn_params p = kva_attn_params_default(PV_HQ, PV_HK, PV_D);
    CHECK_STATUS(kva_decode_run(f.ctx, &plan, &p, kva_tensor_nhd(f.q, KVA_F32, PV_HQ, PV_D), &pg,
                                kva_tensor_nhd(f.o, KVA_F32, PV_HQ, PV_D), NULL),
                 KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "pages.page_size") != NULL);

    /* the 64-byte workspace alignment rule (documented on kva_workspace) */
    kva_workspace mis = f.ws;
    mis.host = (unsigned char *)f.ws.host + 16; /* refused before anything is written */
    CHECK_STATUS(kva_decode_plan(f.ctx, &f.lim, &ta.t, PV_POOL, NULL, mis, &plan), KVA_ERR_INVALID_ARG);
    pv_close(&f);
}

/* A decode plan struct made before a re-plan into the same workspace must be refused when the
 * new plan differs in batch size, even if it happens to have the same number of work items:
 * the run reads the header's batch, while q / o were checked against the stale struct's. */
KVA_TEST(plan_stale_decode_plan_same_num_work_is_refused) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {PV_MAXB, PV_POOL, 0, 0, PV_HQ, PV_HK, PV_D, PV_PS, 0};
    size_t dev_bytes = 0, host_bytes = 0;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &dev_bytes, &host_bytes));
    kva_workspace ws = {NULL, dev_bytes, NULL, host_bytes};
    REQUIRE_OK(kva_malloc(ctx, dev_bytes, &ws.device));
    REQUIRE_OK(kva_host_alloc(ctx, host_bytes, &ws.host));

    size_t pool_elems = (size_t)PV_POOL * PV_PS * PV_HK * PV_D;
    float *k = kva_test_alloc(pool_elems * sizeof(float));
    float *v = kva_test_alloc(pool_elems * sizeof(float));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_fill_random(&rng, k, KVA_F32, pool_elems, -1.0f, 1.0f);
    kva_fill_random(&rng, v, KVA_F32, pool_elems, -1.0f, 1.0f);
    kva_kv_pages pages =
        kva_kv_pages_separate(k, v, KVA_F32, PV_POOL, PV_PS, PV_HK, PV_D, KVA_LAYOUT_NHD);

    /* Plan A: 2 requests of 2 pages each, chunk 16 -> 4 work items. */
    int32_t a_indptr[3] = {0, 2, 4}, a_idx[4] = {0, 1, 2, 3}, a_last[2] = {PV_PS, PV_PS};
    kva_page_table a = {2, a_indptr, a_idx, a_last};
    kva_plan_options opt = {0, PV_PS, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan_a;
    REQUIRE_OK(kva_decode_plan(ctx, &lim, &a, PV_POOL, &opt, ws, &plan_a));
    CHECK(plan_a.num_work == 4);

    /* Plan B into the same workspace: 4 requests of 1 page each -> also 4 work items. */
    int32_t b_indptr[5] = {0, 1, 2, 3, 4}, b_idx[4] = {4, 5, 6, 7};
    int32_t b_last[4] = {3, 5, 7, 9};
    kva_page_table bt = {4, b_indptr, b_idx, b_last};
    kva_plan plan_b;
    REQUIRE_OK(kva_decode_plan(ctx, &lim, &bt, PV_POOL, &opt, ws, &plan_b));
    CHECK(plan_b.num_work == 4);

    /* q / o sized for 4 requests so that an unfixed library does not corrupt memory here. */
    size_t row_elems = (size_t)4 * PV_HQ * PV_D;
    float *q = kva_test_alloc(row_elems * sizeof(float));
    float *o = kva_test_alloc(row_elems * sizeof(float));
    kva_fill_random(&rng, q, KVA_F32, row_elems, -1.0f, 1.0f);
    kva_poison(o, row_elems * sizeof(float));
    kva_attn_params params = kva_attn_params_default(PV_HQ, PV_HK, PV_D);
    kva_tensor tq = kva_tensor_nhd(q, KVA_F32, PV_HQ, PV_D);
    kva_tensor to = kva_tensor_nhd(o, KVA_F32, PV_HQ, PV_D);
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
KVA_TEST(plan_huge_limits_are_refused) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    size_t dev_bytes = 0, host_bytes = 0;

    /* Page count beyond int32: the CSR totals are int32, and 4 * 2^62 bytes wraps to 0. */
    kva_plan_limits lim = {4, (int64_t)1 << 62, 0, 0, PV_HQ, PV_HK, PV_D, PV_PS, 0};
    CHECK(kva_decode_workspace_size(ctx, &lim, &dev_bytes, &host_bytes) != KVA_OK);
    lim.max_total_pages = 64;
    lim.max_total_qo = (int64_t)1 << 62;
    CHECK(kva_prefill_workspace_size(ctx, &lim, &dev_bytes, &host_bytes) != KVA_OK);
    lim.max_total_qo = 64;
    lim.max_total_kv = (int64_t)1 << 62;
    CHECK(kva_decode_workspace_size(ctx, &lim, &dev_bytes, &host_bytes) != KVA_OK);

    /* Each field in range, but partial O = batch x heads x head_dim x 4 bytes overflows 64 bits. */
    kva_plan_limits wide = {INT32_MAX, 64, 0, 0, 1 << 30, 1, 256, PV_PS, 0};
    kva_status st = kva_decode_workspace_size(ctx, &wide, &dev_bytes, &host_bytes);
    CHECK_MSG(st != KVA_OK, "2^31 x 2^30 x 256 x 4 bytes reported as %zu device bytes", dev_bytes);

    /* Sane limits still work. */
    kva_plan_limits ok = {4, 64, 0, 16, PV_HQ, PV_HK, PV_D, PV_PS, 0};
    CHECK_OK(kva_decode_workspace_size(ctx, &ok, &dev_bytes, &host_bytes));
    CHECK_OK(kva_prefill_workspace_size(ctx, &ok, &dev_bytes, &host_bytes));
    kva_context_destroy(ctx);
}

/* A batch of 0 plans and runs as a no-op (decode and prefill). */
KVA_TEST(plan_empty_batch_plans_and_runs) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {PV_MAXB, PV_POOL, 64, 64, PV_HQ, PV_HK, PV_D, PV_PS, 0};
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
    CHECK_OK(kva_decode_plan(ctx, &lim, &empty, PV_POOL, NULL, ws, &plan));
    CHECK(plan.num_work == 0);
    kva_attn_params params = kva_attn_params_default(PV_HQ, PV_HK, PV_D);
    float dummy[PV_HK * PV_D] __attribute__((aligned(16)));
    kva_kv_pages pages =
        kva_kv_pages_separate(dummy, dummy, KVA_F32, PV_POOL, PV_PS, PV_HK, PV_D, KVA_LAYOUT_NHD);
    kva_tensor none = {NULL, KVA_F32, PV_HQ * PV_D, PV_D};
    CHECK_OK(kva_decode_run(ctx, &plan, &params, none, &pages, none, NULL));
    CHECK_OK(kva_prefill_plan(ctx, &lim, 0, zero, zero, NULL, 0, NULL, ws, &plan));
    CHECK_OK(kva_prefill_run_ragged(ctx, &plan, &params, none, none, none, none, NULL));
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    kva_context_destroy(ctx);
}

/* The header: "limits->page_size = 0 sizes for ragged (kv_indptr) plans only" -- whatever
 * max_total_pages holds (a limits struct shared with decode sizing, say). */
KVA_TEST(plan_prefill_workspace_page_size_zero_is_ragged_only) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {4, 64, 256, 64, PV_HQ, PV_HK, PV_D, 0, 0};
    size_t db = 0, hb = 0, rdb = 0, rhb = 0;
    CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &db, &hb));
    lim.max_total_pages = 0;
    CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &rdb, &rhb));
    CHECK(db == rdb && hb == rhb);
    kva_context_destroy(ctx);
}
