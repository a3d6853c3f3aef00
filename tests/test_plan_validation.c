/*
 * test_plan_validation.c -- what plan and sizing calls accept and what they leave behind:
 * workspaces sized for fixed chunk sizes, plans made stale by later plan calls (successful or
 * not), sizing calls that fail without writing, limits / options refused like the runs would
 * refuse them, limits whose workspace size would wrap around, and empty batches.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"
#include "../src/plan/workspace_layout.h"

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

/* ---- Checks a mutation audit of plan.c / workspace_layout.c found missing: each fails under
 * the mutant named in its comment. ---- */

/* A workspace for `lim` on a CPU context: decode sizing, or prefill sizing (ragged and paged). */
static kva_status pv_ws_alloc(kva_context *ctx, const kva_plan_limits *lim, bool decode,
                              kva_workspace *ws) {
    memset(ws, 0, sizeof *ws);
    kva_status st = decode ? kva_decode_workspace_size(ctx, lim, &ws->device_bytes, &ws->host_bytes)
                           : kva_prefill_workspace_size(ctx, lim, &ws->device_bytes, &ws->host_bytes);
    if (st == KVA_OK) st = kva_malloc(ctx, ws->device_bytes, &ws->device);
    if (st == KVA_OK) st = kva_host_alloc(ctx, ws->host_bytes, &ws->host);
    return st;
}

static void pv_ws_free(kva_context *ctx, kva_workspace *ws) {
    kva_free(ctx, ws->device);
    kva_host_free(ctx, ws->host);
    memset(ws, 0, sizeof *ws);
}

/* An empty batch (kind: a KVA__PLAN_* value): enough for make_plan to write the header's layout
 * fields. */
static kva_status pv_plan_empty(kva_context *ctx, const kva_plan_limits *lim, int kind,
                                kva_workspace ws, kva_plan *plan) {
    static const int32_t zero[1] = {0};
    kva_page_table empty = {0, zero, NULL, NULL};
    if (kind == KVA__PLAN_DECODE) return kva_decode_plan(ctx, lim, &empty, 1, NULL, ws, plan);
    if (kind == KVA__PLAN_PREFILL_PAGED)
        return kva_prefill_plan(ctx, lim, 0, zero, NULL, &empty, 1, NULL, ws, plan);
    return kva_prefill_plan(ctx, lim, 0, zero, zero, NULL, 0, NULL, ws, plan);
}

/* A request of (pages - 1) x page_size + last keys is refused once it passes 2^31 - 1 (kv_len is
 * int32: 32768 x 65536 + 1 would wrap negative), by decode and paged prefill alike; one key less
 * plans. Mutant: plan.c's `len > INT32_MAX` check removed. */
KVA_TEST(plan_request_keys_beyond_int32_are_refused) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    enum { NP = 32769 };
    /* max_total_kv bounds the CPU decode scratch (else heads x 2^31 keys x 4 bytes) */
    kva_plan_limits lim = {.max_batch = 1, .max_total_pages = NP, .max_total_kv = 64,
                           .max_total_qo = 1, .num_qo_heads = PV_HQ, .num_kv_heads = PV_HK,
                           .head_dim = PV_D, .page_size = 65536};
    kva_workspace dws, pws;
    REQUIRE_OK(pv_ws_alloc(ctx, &lim, true, &dws));
    REQUIRE_OK(pv_ws_alloc(ctx, &lim, false, &pws));
    int32_t *idx = kva_test_alloc(sizeof(int32_t) * NP);
    memset(idx, 0, sizeof(int32_t) * NP); /* every entry page 0 of a 1-page pool */
    int32_t indptr[2] = {0, NP}, last[1] = {1}, qo[2] = {0, 1};
    kva_page_table t = {1, indptr, idx, last};
    kva_plan plan;
    CHECK_STATUS(kva_decode_plan(ctx, &lim, &t, 1, NULL, dws, &plan), KVA_ERR_OUT_OF_RANGE);
    CHECK_MSG(strstr(kva_last_error(), "2^31") != NULL, "message: %s", kva_last_error());
    CHECK_STATUS(kva_prefill_plan(ctx, &lim, 1, qo, NULL, &t, 1, NULL, pws, &plan),
                 KVA_ERR_OUT_OF_RANGE);
    /* 32767 x 65536 + 65535 = 2^31 - 1 keys: the largest request, accepted by both. (Decode's
     * cost estimate once added the int item cost to a 2^31 - 1 key item in int: UBSan's signed
     * overflow in decode_scheduler.c, found by this test.) */
    indptr[1] = NP - 1;
    last[0] = 65535;
    CHECK_OK(kva_decode_plan(ctx, &lim, &t, 1, NULL, dws, &plan));
    CHECK_OK(kva_prefill_plan(ctx, &lim, 1, qo, NULL, &t, 1, NULL, pws, &plan));
    free(idx);
    pv_ws_free(ctx, &dws);
    pv_ws_free(ctx, &pws);
    kva_context_destroy(ctx);
}

/* fixed_chunk_size == limits.min_fixed_chunk is what the workspace was sized for: accepted; one
 * below is refused. Mutant: `<` -> `<=` in plan.c's min_fixed_chunk check. */
KVA_TEST(plan_fixed_chunk_equal_to_min_fixed_chunk_is_accepted) {
    pv_fixture f;
    if (!pv_open(&f, 0, 64)) {
        CHECK_MSG(0, "fixture: %s", kva_last_error());
        pv_close(&f);
        return;
    }
    pv_table pt;
    pv_table_make(&pt, 2, 8, 0, PV_PS); /* 2 x 128 keys */
    kva_plan_options opt = {0, 63, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan;
    CHECK_STATUS(kva_decode_plan(f.ctx, &f.lim, &pt.t, PV_POOL, &opt, f.ws, &plan),
                 KVA_ERR_INVALID_ARG);
    opt.fixed_chunk_size = 64;
    kva_status st = kva_decode_plan(f.ctx, &f.lim, &pt.t, PV_POOL, &opt, f.ws, &plan);
    CHECK_MSG(st == KVA_OK, "chunk 64: %s (%s)", kva_status_str(st), kva_last_error());
    if (st == KVA_OK) {
        CHECK(plan.kv_chunk_size == 64 && plan.num_work == 4);
        CHECK_OK(pv_run(&f, &plan));
        CHECK(pv_check(&f, &pt.t) == 0);
    }
    pv_close(&f);
}

/* Global-rowmax decode keeps scores for limits.max_total_kv keys: a batch of exactly that many
 * plans and runs, one more key is refused. Mutant: `>` -> `>=` in plan.c's max_total_kv check. */
KVA_TEST(plan_global_rowmax_max_total_kv_boundary) {
    pv_fixture f;
    if (!pv_open(&f, 0, 0)) {
        CHECK_MSG(0, "fixture: %s", kva_last_error());
        pv_close(&f);
        return;
    }
    kva_plan_limits lim = f.lim;
    lim.max_total_kv = 63;
    kva_workspace ws;
    if (pv_ws_alloc(f.ctx, &lim, true, &ws) != KVA_OK) {
        CHECK_MSG(0, "workspace: %s", kva_last_error());
        pv_ws_free(f.ctx, &ws);
        pv_close(&f);
        return;
    }
    pv_table pt;
    pv_table_make(&pt, 2, 2, 0, PV_PS); /* 2 x 32 = 64 keys */
    kva_plan_options opt = {0, 0, KVA_DECODE_GLOBAL_ROWMAX};
    kva_plan plan;
    CHECK_STATUS(kva_decode_plan(f.ctx, &lim, &pt.t, PV_POOL, &opt, ws, &plan),
                 KVA_ERR_WORKSPACE_TOO_SMALL);
    CHECK_MSG(strstr(kva_last_error(), "max_total_kv") != NULL, "message: %s", kva_last_error());
    pt.last[1] = PV_PS - 1; /* 63 keys */
    kva_status st = kva_decode_plan(f.ctx, &lim, &pt.t, PV_POOL, &opt, ws, &plan);
    CHECK_MSG(st == KVA_OK, "63 keys: %s (%s)", kva_status_str(st), kva_last_error());
    if (st == KVA_OK) {
        CHECK_OK(pv_run(&f, &plan));
        CHECK(pv_check(&f, &pt.t) == 0);
    }
    pv_ws_free(f.ctx, &ws);
    pv_close(&f);
}

/* The unit records start at a multiple of 8 ints (32-byte records, the int section 64-byte
 * aligned) and end inside the host part the sizing reported, for every max_batch (the int
 * arrays before them have every length mod 8). Mutants: plan.c's `off = (off + 7) / 8 * 8`
 * removed; workspace_layout.c's `8 +` padding ints removed (the records then end past
 * host_bytes for some batches). */
KVA_TEST(plan_unit_records_aligned_and_inside_host_part) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const int kinds[3] = {KVA__PLAN_DECODE, KVA__PLAN_PREFILL_RAGGED, KVA__PLAN_PREFILL_PAGED};
    for (int k = 0; k < 3; ++k) {
        const int kind = kinds[k];
        for (int32_t mb = 1; mb <= 64; ++mb) {
            /* odd page / token counts, so that nothing but the padding aligns the records */
            kva_plan_limits lim = {.max_batch = mb, .max_total_pages = 3 * mb + 1,
                                   .max_total_kv = 5 * mb + 3, .max_total_qo = 7 * mb + 1,
                                   .num_qo_heads = PV_HQ, .num_kv_heads = PV_HK, .head_dim = PV_D,
                                   .page_size = kind == KVA__PLAN_PREFILL_RAGGED ? 0 : PV_PS};
            kva_workspace ws;
            kva_plan plan;
            kva_status st = pv_ws_alloc(ctx, &lim, kind == KVA__PLAN_DECODE, &ws);
            if (st == KVA_OK) st = pv_plan_empty(ctx, &lim, kind, ws, &plan);
            CHECK_MSG(st == KVA_OK, "kind %d max_batch %d: %s", kind, mb, kva_last_error());
            if (st == KVA_OK) {
                const kva__plan_header *h = kva__plan_header_of(ws.host);
                const size_t ints_at = (size_t)((unsigned char *)kva__plan_ints(ws.host) -
                                                (unsigned char *)ws.host);
                const size_t rec_at = ints_at + sizeof(int32_t) * (size_t)h->off_unit_records;
                const size_t end = rec_at + sizeof(int32_t) * KVA__UNIT_RECORD_INTS * (size_t)h->cap_work;
                CHECK_MSG(h->off_unit_records % 8 == 0 && rec_at % 32 == 0 && end <= ws.host_bytes,
                          "kind %d max_batch %d: records at int %lld, end at byte %zu of %zu",
                          kind, mb, (long long)h->off_unit_records, end, ws.host_bytes);
            }
            pv_ws_free(ctx, &ws);
        }
    }
    kva_context_destroy(ctx);
}

/* A decode plan writes every field a run reads, whatever the host part held before: the query
 * tile of each work item is 0 and merge_groups is 0 unsplit, every group split. Mutants:
 * plan.c's `qt[i] = 0` loop removed (a reused workspace kept stale tiles); merge_groups set to
 * the group count (or left 0) regardless of split. */
KVA_TEST(plan_decode_fields_written_over_a_poisoned_workspace) {
    pv_fixture f;
    if (!pv_open(&f, 0, 0)) {
        CHECK_MSG(0, "fixture: %s", kva_last_error());
        pv_close(&f);
        return;
    }
    pv_table pt;
    pv_table_make(&pt, 2, 2, 0, PV_PS); /* 2 x 32 keys: searched, too short to split */
    for (int fixed = 0; fixed <= 1; ++fixed) {
        memset(f.ws.host, 0xff, f.ws.host_bytes);
        kva_plan_options opt = {0, fixed ? PV_PS : 0, KVA_DECODE_PARTIAL_ROWMAX};
        kva_plan plan;
        kva_status st = kva_decode_plan(f.ctx, &f.lim, &pt.t, PV_POOL, &opt, f.ws, &plan);
        CHECK_MSG(st == KVA_OK, "fixed %d: %s (%s)", fixed, kva_status_str(st), kva_last_error());
        if (st != KVA_OK) continue;
        const kva__plan_header *h = kva__plan_header_of(f.ws.host);
        CHECK_MSG(plan.split_kv == fixed && plan.num_work == (fixed ? 4 : 2),
                  "fixed %d: split_kv %d, %d work items", fixed, plan.split_kv, plan.num_work);
        for (int32_t i = 0; i < plan.num_work; ++i)
            CHECK_MSG(plan.qo_tile_indices[i] == 0, "fixed %d: qo_tile_indices[%d] = %d", fixed, i,
                      plan.qo_tile_indices[i]);
        CHECK_MSG(h->merge_groups == (fixed ? h->num_groups : 0) && h->num_groups == 2,
                  "fixed %d: merge_groups %d of %d groups", fixed, h->merge_groups, h->num_groups);
        CHECK_OK(pv_run(&f, &plan));
        CHECK(pv_check(&f, &pt.t) == 0);
    }
    pv_close(&f);
}

/* min_fixed_chunk 1 over 2^30 pages of 4 keys allows 2^32 work items: refused, never sized
 * (the int32 counts would wrap). Mutant: workspace_layout.c's `bound > INT32_MAX` guard removed
 * (the sizing then succeeds). */
KVA_TEST(plan_min_fixed_chunk_work_beyond_int32_is_refused) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {.max_batch = 1, .max_total_pages = (int64_t)1 << 30,
                           .num_qo_heads = PV_HQ, .num_kv_heads = PV_HK, .head_dim = PV_D,
                           .page_size = 4, .min_fixed_chunk = 1};
    size_t dev = 12345, host = 54321;
    CHECK_STATUS(kva_decode_workspace_size(ctx, &lim, &dev, &host), KVA_ERR_INVALID_ARG);
    CHECK_MSG(strstr(kva_last_error(), "min_fixed_chunk") != NULL, "message: %s", kva_last_error());
    CHECK(dev == 12345 && host == 54321);
    kva_context_destroy(ctx);
}

/* A decode workspace holds at least the block budget's work items, so a fixed chunk planned
 * without limits.min_fixed_chunk fits where the by-keys bound alone (64 keys / 128: 0 extra
 * items, cap 1) would not: 64 keys in chunks of 16 are 4 work items. Mutant: workspace_layout.c's
 * `cap_work < budget_items` floor removed. */
KVA_TEST(plan_decode_fixed_chunk_fits_block_budget) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {.max_batch = 1, .max_total_pages = 4, .num_qo_heads = 1,
                           .num_kv_heads = 1, .head_dim = PV_D, .page_size = 16};
    kva_workspace ws;
    if (pv_ws_alloc(ctx, &lim, true, &ws) == KVA_OK) {
        int32_t indptr[2] = {0, 4}, idx[4] = {0, 1, 2, 3}, last[1] = {16};
        kva_page_table t = {1, indptr, idx, last};
        kva_plan_options opt = {0, 16, KVA_DECODE_PARTIAL_ROWMAX};
        kva_plan plan;
        CHECK_OK(kva_decode_plan(ctx, &lim, &t, 4, &opt, ws, &plan));
        CHECK_MSG(plan.num_work == 4 && plan.split_kv == 1, "%d work items, split_kv %d",
                  plan.num_work, plan.split_kv);
    } else {
        CHECK_MSG(0, "workspace: %s", kva_last_error());
    }
    pv_ws_free(ctx, &ws);
    kva_context_destroy(ctx);
}

/* A prefill workspace keeps at least 8 partial-state slots, so a forced chunk splits a small
 * batch (64 queries x 4096 keys in chunks of 512: 8 split work items) even where the block
 * budget (max_blocks / kv_heads) is below 8. The CPU policy's max_blocks is 4 x cores (>= 16),
 * fixed by the core count on purpose (kva_context_set_threads does not change it, so a
 * workspace sized once stays valid): instead the test takes kv_heads > cores / 2, which puts
 * the budget below 8 on any machine. Mutant: workspace_layout.c's 8-slot floor on
 * cap_split_work removed (then only the budget counts). */
KVA_TEST(plan_prefill_fixed_chunk_split_fits_eight_slots) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const int64_t max_blocks = 4 * (int64_t)kva_context_threads(ctx) > 16
                                   ? 4 * (int64_t)kva_context_threads(ctx) : 16; /* cpu_policy.c */
    int32_t heads = 64;
    while (max_blocks / heads >= 8) heads *= 2;
    kva_plan_limits lim = {.max_batch = 1, .max_total_kv = 4096, .max_total_qo = 4096,
                           .num_qo_heads = heads, .num_kv_heads = heads, .head_dim = PV_D};
    kva_workspace ws;
    if (pv_ws_alloc(ctx, &lim, false, &ws) == KVA_OK) {
        int32_t qo[2] = {0, 64}, kv[2] = {0, 4096};
        kva_plan_options opt = {0, 512, KVA_DECODE_PARTIAL_ROWMAX};
        kva_plan plan;
        CHECK_OK(kva_prefill_plan(ctx, &lim, 1, qo, kv, NULL, 0, &opt, ws, &plan));
        CHECK_MSG(plan.num_work == 8 && plan.split_kv == 1, "%d work items, split_kv %d (%d heads)",
                  plan.num_work, plan.split_kv, heads);
    } else {
        CHECK_MSG(0, "workspace: %s", kva_last_error());
    }
    pv_ws_free(ctx, &ws);
    kva_context_destroy(ctx);
}

/* Decode merge counters are per (request, query head): u32 [max_batch][num_qo_heads] (the
 * kernels count sub-groups of <= 16 query heads per KV head). Mutant: workspace_layout.c sizes
 * them by KV heads, as prefill does. */
KVA_TEST(plan_decode_counters_sized_per_query_head) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const int32_t cfg[3][3] = {{16, 8, 1}, {16, 16, 2}, {5, 32, 4}}; /* max_batch, qo, kv heads */
    for (int c = 0; c < 3; ++c) {
        kva_plan_limits lim = {.max_batch = cfg[c][0], .max_total_pages = 64,
                               .num_qo_heads = cfg[c][1], .num_kv_heads = cfg[c][2],
                               .head_dim = PV_D, .page_size = PV_PS};
        kva_workspace ws;
        kva_plan plan;
        kva_status st = pv_ws_alloc(ctx, &lim, true, &ws);
        if (st == KVA_OK) st = pv_plan_empty(ctx, &lim, KVA__PLAN_DECODE, ws, &plan);
        CHECK_MSG(st == KVA_OK, "config %d: %s", c, kva_last_error());
        if (st == KVA_OK) {
            const kva__plan_header *h = kva__plan_header_of(ws.host);
            const int64_t need = 4 * (int64_t)lim.max_batch * lim.num_qo_heads;
            CHECK_MSG(h->off_run_counters - h->off_counters >= need,
                      "config %d: %lld counter bytes, need %lld", c,
                      (long long)(h->off_run_counters - h->off_counters), (long long)need);
        }
        pv_ws_free(ctx, &ws);
    }
    kva_context_destroy(ctx);
}

/* Every device region starts 256-byte aligned (odd head / batch counts make the regions' sizes
 * odd multiples of 4 bytes), and the CPU decode global-rowmax scratch holds
 * num_qo_heads x max_total_kv floats when max_total_kv is set (0: the pool's keys, pages x
 * page_size). Mutants: workspace_layout.c's region rounding to 4 instead of 256 bytes; the
 * scratch sized from the pool regardless of max_total_kv. */
KVA_TEST(plan_workspace_regions_aligned_and_scratch_bounded) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const int kinds[3] = {KVA__PLAN_DECODE, KVA__PLAN_PREFILL_RAGGED, KVA__PLAN_PREFILL_PAGED};
    const int32_t cfg[3][3] = {{3, 3, 1}, {5, 5, 5}, {7, 9, 3}}; /* max_batch, qo, kv heads */
    for (int k = 0; k < 3; ++k)
        for (int c = 0; c < 3; ++c) {
            const int kind = kinds[k];
            kva_plan_limits lim = {.max_batch = cfg[c][0], .max_total_pages = 37,
                                   .max_total_kv = 1001, .max_total_qo = 37,
                                   .num_qo_heads = cfg[c][1], .num_kv_heads = cfg[c][2],
                                   .head_dim = PV_D,
                                   .page_size = kind == KVA__PLAN_PREFILL_RAGGED ? 0 : PV_PS};
            kva_workspace ws;
            kva_plan plan;
            kva_status st = pv_ws_alloc(ctx, &lim, kind == KVA__PLAN_DECODE, &ws);
            if (st == KVA_OK) st = pv_plan_empty(ctx, &lim, kind, ws, &plan);
            CHECK_MSG(st == KVA_OK, "kind %d config %d: %s", kind, c, kva_last_error());
            if (st != KVA_OK) {
                pv_ws_free(ctx, &ws);
                continue;
            }
            const kva__plan_header *h = kva__plan_header_of(ws.host);
            const int64_t off[7] = {h->off_partial_o, h->off_partial_lse, h->off_counters,
                                    h->off_run_counters, h->off_run_lse, h->off_sched, h->off_scores};
            for (int i = 0; i < 7; ++i)
                CHECK_MSG(off[i] % 256 == 0, "kind %d config %d: region %d at byte %lld", kind, c, i,
                          (long long)off[i]);
            CHECK_MSG(ws.device_bytes % 256 == 0, "kind %d config %d: %zu device bytes", kind, c,
                      ws.device_bytes);
            pv_ws_free(ctx, &ws);
        }

    /* the scratch: 3 heads x 1000 keys x 4 bytes = 12000, rounded to 12032, not the pool's
     * 3 x 4096 x 16 keys */
    kva_plan_limits lim = {.max_batch = 2, .max_total_pages = 4096, .max_total_kv = 1000,
                           .num_qo_heads = 3, .num_kv_heads = 1, .head_dim = PV_D,
                           .page_size = PV_PS};
    kva_workspace ws;
    kva_plan plan;
    size_t bounded = 0, pool = 0, pool_host = 0;
    if (pv_ws_alloc(ctx, &lim, true, &ws) == KVA_OK &&
        pv_plan_empty(ctx, &lim, KVA__PLAN_DECODE, ws, &plan) == KVA_OK) {
        bounded = ws.device_bytes;
        const int64_t off_scores = kva__plan_header_of(ws.host)->off_scores;
        CHECK_MSG((int64_t)bounded - off_scores == 12032, "scratch of %lld bytes",
                  (long long)((int64_t)bounded - off_scores));
    } else {
        CHECK_MSG(0, "workspace: %s", kva_last_error());
    }
    pv_ws_free(ctx, &ws);
    lim.max_total_kv = 0;
    CHECK_OK(kva_decode_workspace_size(ctx, &lim, &pool, &pool_host));
    CHECK_MSG(bounded < pool && pool - bounded == (size_t)3 * 4096 * 16 * 4 - 12032,
              "device bytes: %zu with max_total_kv 1000, %zu without", bounded, pool);
    kva_context_destroy(ctx);
}
