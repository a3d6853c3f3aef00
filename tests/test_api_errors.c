/*
 * test_api_errors.c -- every public entry point (context, memory, convert, plans, runs, merge)
 * given bad input returns its documented status with a fresh, non-empty kva_last_error(), and
 * leaves what the caller passed in untouched: poisoned outputs stay poisoned, a valid plan
 * stays runnable or is refused (never half-overwritten and run). The cache manager's errors
 * are tested in test_cache.c.
 */
#include "harness.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Sets a known last error, so expect_error can tell that the call under test set its own. */
static void prime_error(void) {
    int x = 0;
    (void)kva_convert(&x, (kva_dtype)99, &x, (kva_dtype)99, 1);
}

#define EXPECT_ERROR(expr, expected)                                                           \
    do {                                                                                       \
        prime_error();                                                                         \
        char primed__[256];                                                                    \
        snprintf(primed__, sizeof primed__, "%s", kva_last_error());                          \
        kva_status st__ = (expr);                                                              \
        if (st__ != (expected))                                                                \
            kva_test_fail(__FILE__, __LINE__, "%s returned %s, expected %s (%s)", #expr,       \
                          kva_status_str(st__), kva_status_str(expected), kva_last_error());   \
        else if (kva_last_error()[0] == 0 || strcmp(kva_last_error(), primed__) == 0)          \
            kva_test_fail(__FILE__, __LINE__, "%s: no message of its own in kva_last_error()", \
                          #expr);                                                              \
    } while (0)

static int all_bytes(const void *p, size_t n, unsigned char v) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i)
        if (b[i] != v) return 0;
    return 1;
}

KVA_TEST(api_errors_status_strings) {
    for (int s = 0; s <= 10; ++s) {
        const char *name = kva_status_str((kva_status)s);
        CHECK(name != NULL && strncmp(name, "KVA_", 4) == 0);
    }
    CHECK(kva_status_str((kva_status)77) != NULL);
    CHECK(kva_dtype_size((kva_dtype)9) == 0);
    CHECK(strcmp(kva_dtype_name((kva_dtype)9), "?") == 0);
    CHECK(kva_last_error() != NULL);
}

KVA_TEST(api_errors_context_and_memory) {
    kva_context *ctx = (kva_context *)&ctx; /* must be reset to NULL on failure */
    EXPECT_ERROR(kva_context_create((kva_device_type)7, 0, &ctx), KVA_ERR_INVALID_ARG);
    CHECK(ctx == NULL);
    EXPECT_ERROR(kva_context_create(KVA_DEVICE_CPU, 0, NULL), KVA_ERR_INVALID_ARG);
    if (!kva_cuda_available()) {
        kva_status st = kva_context_create(KVA_DEVICE_CUDA, 0, &ctx);
        CHECK_MSG(st == KVA_ERR_NOT_BUILT || st == KVA_ERR_DEVICE, "CUDA context without CUDA: %s",
                  kva_status_str(st));
        CHECK(ctx == NULL && kva_last_error()[0] != 0);
        /* the message names the public call, not a backend function */
        CHECK_MSG(strncmp(kva_last_error(), "kva_context_create: ", 20) == 0, "CUDA context without CUDA: \"%s\"",
                  kva_last_error());
    }
    kva_context_destroy(NULL);
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    int threads = kva_context_threads(ctx);
    EXPECT_ERROR(kva_context_set_threads(ctx, -1), KVA_ERR_INVALID_ARG);
    CHECK(kva_context_threads(ctx) == threads);
    EXPECT_ERROR(kva_context_set_threads(NULL, 1), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_context_set_stream(NULL, NULL), KVA_ERR_INVALID_ARG);
    kva_device_info info;
    EXPECT_ERROR(kva_context_info(NULL, &info), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_context_info(ctx, NULL), KVA_ERR_INVALID_ARG);
    /* a CPU context describes itself (the CPU's model, its threads; no L2 figure, no free memory) */
    memset(&info, 0xff, sizeof info);
    CHECK_OK(kva_context_info(ctx, &info));
    CHECK(info.name[0] != 0 && memchr(info.name, 0, sizeof info.name) != NULL &&
          info.num_sms == kva_context_threads(ctx) && info.l2_bytes == 0 && info.free_memory == 0);
    CHECK_OK(kva_context_set_stream(ctx, NULL)); /* a CPU context keeps it and ignores it */
    kva_variant_stats vst;
    EXPECT_ERROR(kva_variant_get_stats(NULL, &vst), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_variant_get_stats: variant") != NULL);
    CHECK(kva_context_threads(NULL) == 0);

    void *p = (void *)&p;
    EXPECT_ERROR(kva_malloc(NULL, 64, &p), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_malloc(ctx, 64, NULL), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_host_alloc(NULL, 64, &p), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_host_alloc(ctx, 64, NULL), KVA_ERR_INVALID_ARG);
    kva_free(ctx, NULL);
    kva_free(NULL, NULL);
    kva_host_free(ctx, NULL);

    char src[16] = "0123456789abcde", dst[16];
    memset(dst, 0x5a, sizeof dst);
    EXPECT_ERROR(kva_memcpy(NULL, dst, src, 16, KVA_COPY_HOST_TO_DEVICE), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_memcpy(ctx, NULL, src, 16, KVA_COPY_HOST_TO_DEVICE), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_memcpy(ctx, dst, NULL, 16, KVA_COPY_HOST_TO_DEVICE), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_memcpy(ctx, dst, src, 16, (kva_copy_kind)5), KVA_ERR_INVALID_ARG);
    CHECK(all_bytes(dst, sizeof dst, 0x5a));
    CHECK_OK(kva_memcpy(ctx, NULL, NULL, 0, KVA_COPY_HOST_TO_DEVICE));
    EXPECT_ERROR(kva_memcpy(ctx, NULL, NULL, 0, (kva_copy_kind)5), KVA_ERR_INVALID_ARG); /* even for no bytes */
    EXPECT_ERROR(kva_synchronize(NULL), KVA_ERR_INVALID_ARG);
    kva_context_destroy(ctx);
}

KVA_TEST(api_errors_convert) {
    float src[4] = {1, 2, 3, 4};
    uint16_t dst[4];
    memset(dst, 0x5a, sizeof dst);
    EXPECT_ERROR(kva_convert(NULL, KVA_F32, dst, KVA_BF16, 4), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_convert(src, KVA_F32, NULL, KVA_BF16, 4), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_convert(src, (kva_dtype)3, dst, KVA_BF16, 4), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_convert(src, KVA_F32, dst, (kva_dtype)-1, 4), KVA_ERR_INVALID_ARG);
    CHECK(all_bytes(dst, sizeof dst, 0x5a));
    CHECK_OK(kva_convert(NULL, KVA_F32, NULL, KVA_F16, 0));
    EXPECT_ERROR(kva_convert(NULL, (kva_dtype)3, NULL, KVA_F16, 0), KVA_ERR_INVALID_ARG); /* even for none */
}

KVA_TEST(api_errors_merge_states) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    float v[2 * 3 * 16], lse[2 * 3], out[2 * 16], lse_out[2];
    for (int i = 0; i < 96; ++i) v[i] = 1.0f;
    for (int i = 0; i < 6; ++i) lse[i] = 0.0f;
    kva_poison(out, sizeof out);
    kva_poison(lse_out, sizeof lse_out);
    EXPECT_ERROR(kva_merge_states(NULL, 2, 3, 16, KVA_F32, v, lse, out, lse_out), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_merge_states(ctx, -1, 3, 16, KVA_F32, v, lse, out, lse_out), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_merge_states(ctx, 2, -3, 16, KVA_F32, v, lse, out, lse_out), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_merge_states(ctx, 2, 3, 0, KVA_F32, v, lse, out, lse_out), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_merge_states(ctx, 2, 3, 1025, KVA_F32, v, lse, out, lse_out), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_merge_states(ctx, 2, 3, 16, (kva_dtype)5, v, lse, out, lse_out), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_merge_states(ctx, 2, 3, 16, KVA_F32, NULL, lse, out, lse_out), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_merge_states(ctx, 2, 3, 16, KVA_F32, v, NULL, out, lse_out), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_merge_states(ctx, 2, 3, 16, KVA_F32, v, lse, NULL, lse_out), KVA_ERR_INVALID_ARG);
    CHECK(all_bytes(out, sizeof out, 0xFF) && all_bytes(lse_out, sizeof lse_out, 0xFF));
    CHECK_OK(kva_merge_states(ctx, 2, 3, 16, KVA_F32, v, lse, out, lse_out));
    CHECK(fabsf(out[0] - 1.0f) < 1e-6f && fabsf(lse_out[1] - logf(3.0f)) < 1e-5f);
    kva_context_destroy(ctx);
}

/* ---- plans and runs --------------------------------------------------------------------------- */

/* A small valid decode setup that each check breaks in one way. */
typedef struct fixture {
    kva_context *ctx;
    kva_plan_limits lim;
    int32_t indptr[4], indices[8], last[3];
    kva_page_table table;
    float *pool;
    kva_kv_pages pages;
    kva_attn_params params;
    float *q, *o, *lse;
    kva_workspace ws;
    kva_plan plan;
} fixture;

enum { FX_B = 3, FX_HQ = 4, FX_HK = 2, FX_D = 32, FX_PAGE = 4, FX_POOL = 10 };

static int fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    if (kva_context_create(KVA_DEVICE_CPU, 0, &f->ctx) != KVA_OK) return 0;
    kva_plan_limits lim = {FX_B, 8, 0, 0, FX_HQ, FX_HK, FX_D, FX_PAGE, 0};
    f->lim = lim;
    const int32_t indptr[4] = {0, 3, 3, 5}, indices[5] = {7, 2, 9, 0, 4}, last[3] = {2, 0, 4};
    memcpy(f->indptr, indptr, sizeof indptr);
    memcpy(f->indices, indices, sizeof indices);
    memcpy(f->last, last, sizeof last);
    f->table.batch_size = FX_B;
    f->table.indptr = f->indptr;
    f->table.indices = f->indices;
    f->table.last_page_len = f->last;
    size_t pool_elems = (size_t)FX_POOL * FX_PAGE * FX_HK * FX_D;
    f->pool = kva_test_alloc(2 * pool_elems * sizeof(float));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_fill_random(&rng, f->pool, KVA_F32, 2 * pool_elems, -1, 1);
    f->pages = kva_kv_pages_interleaved(f->pool, KVA_F32, FX_POOL, FX_PAGE, FX_HK, FX_D, KVA_LAYOUT_NHD);
    f->params = kva_attn_params_default(FX_HQ, FX_HK, FX_D);
    f->q = kva_test_alloc(sizeof(float) * FX_B * FX_HQ * FX_D);
    f->o = kva_test_alloc(sizeof(float) * FX_B * FX_HQ * FX_D);
    f->lse = kva_test_alloc(sizeof(float) * FX_B * FX_HQ);
    kva_fill_random(&rng, f->q, KVA_F32, FX_B * FX_HQ * FX_D, -1, 1);
    size_t db, hb;
    if (kva_decode_workspace_size(f->ctx, &f->lim, &db, &hb) != KVA_OK) return 0;
    f->ws.device = kva_test_alloc(db);
    f->ws.device_bytes = db;
    f->ws.host = kva_test_alloc(hb);
    f->ws.host_bytes = hb;
    return kva_decode_plan(f->ctx, &f->lim, &f->table, FX_POOL, NULL, f->ws, &f->plan) == KVA_OK;
}

static void fixture_free(fixture *f) {
    free(f->pool);
    free(f->q);
    free(f->o);
    free(f->lse);
    free(f->ws.device);
    free(f->ws.host);
    kva_context_destroy(f->ctx);
}

/* fixture_init, or the test failed with the reason and the fixture freed. */
static bool fixture_ready(fixture *f) {
    if (fixture_init(f)) return true;
    kva_test_fail(__FILE__, __LINE__, "fixture: %s", kva_last_error());
    fixture_free(f);
    return false;
}

static kva_tensor fq(const fixture *f) { return kva_tensor_nhd(f->q, KVA_F32, FX_HQ, FX_D); }
static kva_tensor fo(const fixture *f) { return kva_tensor_nhd(f->o, KVA_F32, FX_HQ, FX_D); }

static void poison_outputs(fixture *f) {
    kva_poison(f->o, sizeof(float) * FX_B * FX_HQ * FX_D);
    kva_poison(f->lse, sizeof(float) * FX_B * FX_HQ);
}
static int outputs_untouched(const fixture *f) {
    return all_bytes(f->o, sizeof(float) * FX_B * FX_HQ * FX_D, 0xFF) &&
           all_bytes(f->lse, sizeof(float) * FX_B * FX_HQ, 0xFF);
}

/* The fixture's plan still runs and writes every output (no NaN left). */
static void check_plan_still_runs(fixture *f, const char *after) {
    poison_outputs(f);
    kva_status st = kva_decode_run(f->ctx, &f->plan, &f->params, fq(f), &f->pages, fo(f), f->lse);
    CHECK_MSG(st == KVA_OK, "after %s the valid plan fails: %s (%s)", after, kva_status_str(st),
              kva_last_error());
    int nan = 0;
    for (int i = 0; i < FX_B * FX_HQ * FX_D; ++i) nan |= f->o[i] != f->o[i];
    CHECK_MSG(!nan, "after %s the valid plan leaves NaN in O", after);
}

KVA_TEST(api_errors_decode_plan) {
    fixture f;
    if (!fixture_ready(&f)) return;
    kva_plan p;
    size_t db, hb;
    kva_plan_limits bad = f.lim;
    EXPECT_ERROR(kva_decode_workspace_size(NULL, &f.lim, &db, &hb), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_decode_workspace_size(f.ctx, NULL, &db, &hb), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_decode_workspace_size(f.ctx, &f.lim, NULL, &hb), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_decode_workspace_size(f.ctx, &f.lim, &db, NULL), KVA_ERR_INVALID_ARG);
    bad.max_batch = 0;
    EXPECT_ERROR(kva_decode_workspace_size(f.ctx, &bad, &db, &hb), KVA_ERR_INVALID_ARG);
    bad = f.lim;
    bad.num_kv_heads = 3; /* does not divide 4 */
    EXPECT_ERROR(kva_decode_workspace_size(f.ctx, &bad, &db, &hb), KVA_ERR_BAD_SHAPE);
    bad = f.lim;
    bad.head_dim = 512;
    EXPECT_ERROR(kva_decode_workspace_size(f.ctx, &bad, &db, &hb), KVA_ERR_UNSUPPORTED);
    bad = f.lim;
    bad.page_size = 0;
    EXPECT_ERROR(kva_decode_workspace_size(f.ctx, &bad, &db, &hb), KVA_ERR_INVALID_ARG);
    bad = f.lim;
    bad.max_total_kv = -1;
    EXPECT_ERROR(kva_decode_workspace_size(f.ctx, &bad, &db, &hb), KVA_ERR_INVALID_ARG);

    EXPECT_ERROR(kva_decode_plan(NULL, &f.lim, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_decode_plan(f.ctx, NULL, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, NULL, FX_POOL, NULL, f.ws, &p), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, NULL), KVA_ERR_INVALID_ARG);
    kva_workspace ws = f.ws;
    ws.host = NULL;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, ws, &p), KVA_ERR_INVALID_ARG);
    ws = f.ws;
    ws.device_bytes -= 1;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, ws, &p), KVA_ERR_WORKSPACE_TOO_SMALL);
    ws = f.ws;
    unsigned char *roomy = kva_test_alloc(f.ws.host_bytes + 64);
    ws.host = roomy + 16; /* large enough, but not 64-byte aligned */
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, ws, &p), KVA_ERR_INVALID_ARG);
    free(roomy);

    kva_plan_options opt = {0, 0, (kva_decode_algo)9};
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, &opt, f.ws, &p), KVA_ERR_INVALID_ARG);
    opt.algo = KVA_DECODE_PARTIAL_ROWMAX;
    opt.fixed_chunk_size = -2;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, &opt, f.ws, &p), KVA_ERR_INVALID_ARG);

    /* page table problems; each is restored after its check */
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, 0, NULL, f.ws, &p), KVA_ERR_INVALID_ARG);
    f.indices[3] = FX_POOL; /* one past the pool */
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_OUT_OF_RANGE);
    f.indices[3] = -1;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_OUT_OF_RANGE);
    f.indices[3] = 0;
    /* the pool the plan is checked against may be smaller than the ids */
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, 9, NULL, f.ws, &p), KVA_ERR_OUT_OF_RANGE);
    /* last_page_len beyond the page, or 0 for a request with pages: the length does not fit
     * its pages (the header's comment on kva_decode_plan says BAD_SHAPE; the status enum and
     * the implementation say OUT_OF_RANGE) */
    f.last[0] = FX_PAGE + 1;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_OUT_OF_RANGE);
    f.last[0] = 0;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_OUT_OF_RANGE);
    f.last[0] = 2;
    f.indptr[0] = 1;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_BAD_SHAPE);
    f.indptr[0] = 0;
    f.indptr[2] = 2; /* decreasing: 3 -> 2 */
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_BAD_SHAPE);
    f.indptr[2] = 3;
    kva_page_table big = f.table;
    big.batch_size = FX_B + 1; /* batch > max_batch */
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &big, FX_POOL, NULL, f.ws, &p), KVA_ERR_BAD_SHAPE);
    big.batch_size = -1;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &big, FX_POOL, NULL, f.ws, &p), KVA_ERR_BAD_SHAPE);
    big = f.table;
    big.indices = NULL;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &big, FX_POOL, NULL, f.ws, &p), KVA_ERR_INVALID_ARG);
    big = f.table;
    big.last_page_len = NULL;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &big, FX_POOL, NULL, f.ws, &p), KVA_ERR_INVALID_ARG);
    big = f.table;
    big.indptr = NULL;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &big, FX_POOL, NULL, f.ws, &p), KVA_ERR_INVALID_ARG);

    /* A failed plan into the workspace of a valid plan: the old plan is refused, never run on
     * half-written arrays. Re-planning makes it valid again. */
    f.indices[0] = 99;
    EXPECT_ERROR(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, &p), KVA_ERR_OUT_OF_RANGE);
    f.indices[0] = 7;
    poison_outputs(&f);
    kva_status st = kva_decode_run(f.ctx, &f.plan, &f.params, fq(&f), &f.pages, fo(&f), f.lse);
    if (st != KVA_OK) {
        CHECK_MSG(st == KVA_ERR_BAD_STATE, "stale plan: %s", kva_status_str(st));
        CHECK(outputs_untouched(&f));
        REQUIRE_OK(kva_decode_plan(f.ctx, &f.lim, &f.table, FX_POOL, NULL, f.ws, &f.plan));
    }
    check_plan_still_runs(&f, "a failed re-plan");
    fixture_free(&f);
}

KVA_TEST(api_errors_decode_run) {
    fixture f;
    if (!fixture_ready(&f)) return;
    check_plan_still_runs(&f, "setup");
    kva_attn_params prm = f.params;
    kva_kv_pages pg = f.pages;
    kva_tensor q = fq(&f), o = fo(&f);
    poison_outputs(&f);
#define RUN(ctx_, plan_, prm_, q_, pg_, o_) kva_decode_run(ctx_, plan_, prm_, q_, pg_, o_, f.lse)
    EXPECT_ERROR(RUN(NULL, &f.plan, &prm, q, &pg, o), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(RUN(f.ctx, NULL, &prm, q, &pg, o), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(RUN(f.ctx, &f.plan, NULL, q, &pg, o), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, NULL, o), KVA_ERR_INVALID_ARG);
    /* params */
    prm.num_kv_heads = 3;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_BAD_SHAPE);
    prm = f.params;
    prm.num_qo_heads = 8; /* valid on its own, but not what the plan was made for */
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_BAD_SHAPE);
    prm = f.params;
    prm.head_dim = 24; /* not a multiple of 16 */
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_UNSUPPORTED);
    prm.head_dim = 288;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_UNSUPPORTED);
    prm = f.params;
    prm.causal = 2;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_INVALID_ARG);
    prm = f.params;
    prm.sm_scale = NAN;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_INVALID_ARG);
    prm = f.params;
    /* the plan */
    kva_plan zeroed;
    memset(&zeroed, 0, sizeof zeroed);
    EXPECT_ERROR(RUN(f.ctx, &zeroed, &prm, q, &pg, o), KVA_ERR_BAD_STATE);
    kva_plan wrong_kind = f.plan;
    wrong_kind.kind = 2; /* a prefill plan's kind */
    EXPECT_ERROR(RUN(f.ctx, &wrong_kind, &prm, q, &pg, o), KVA_ERR_BAD_STATE);
    /* the pages */
    pg.page_size = FX_PAGE * 2;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_BAD_SHAPE);
    pg = f.pages;
    pg.num_kv_heads = 1;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_BAD_SHAPE);
    pg = f.pages;
    pg.head_dim = 64;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_BAD_SHAPE);
    pg = f.pages;
    pg.num_pages = FX_POOL - 1; /* smaller than the pool the plan checked page ids against */
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_OUT_OF_RANGE);
    pg = f.pages;
    pg.k_data = NULL;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_INVALID_ARG);
    pg = f.pages;
    pg.dtype = (kva_dtype)4;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_INVALID_ARG);
    pg = f.pages;
    pg.stride_token += 2; /* not a multiple of 4 f32 elements */
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_BAD_SHAPE);
    pg = f.pages;
    pg.v_data = (char *)pg.v_data + 4; /* not 16-byte aligned */
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_BAD_SHAPE);
    pg = f.pages;
    pg.stride_head = -FX_D;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, o), KVA_ERR_BAD_SHAPE);
    pg = f.pages;
    /* q and o */
    kva_tensor t = q;
    t.dtype = KVA_BF16; /* pages are f32 */
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, t, &pg, o), KVA_ERR_BAD_SHAPE);
    t = q;
    t.data = NULL;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, t, &pg, o), KVA_ERR_INVALID_ARG);
    t = q;
    t.data = (char *)t.data + 4;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, t, &pg, o), KVA_ERR_BAD_SHAPE);
    t = q;
    t.stride_token = 130;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, t, &pg, o), KVA_ERR_BAD_SHAPE);
    t = o;
    t.stride_head = 6;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, t), KVA_ERR_BAD_SHAPE);
    t = o;
    t.dtype = KVA_F16;
    EXPECT_ERROR(RUN(f.ctx, &f.plan, &prm, q, &pg, t), KVA_ERR_BAD_SHAPE);
#undef RUN
    CHECK(outputs_untouched(&f));
    /* a decode plan given to the prefill runs */
    EXPECT_ERROR(kva_prefill_run_paged(f.ctx, &f.plan, &prm, q, &pg, o, f.lse), KVA_ERR_BAD_STATE);
    EXPECT_ERROR(kva_prefill_run_ragged(f.ctx, &f.plan, &prm, q, q, q, o, f.lse), KVA_ERR_BAD_STATE);
    CHECK(outputs_untouched(&f));
    check_plan_still_runs(&f, "the failed runs");
    fixture_free(&f);
}

KVA_TEST(api_errors_prefill_plan_and_attention) {
    fixture f;
    if (!fixture_ready(&f)) return;
    kva_plan_limits lim = f.lim;
    lim.max_total_qo = 16;
    lim.max_total_kv = 64;
    size_t db, hb;
    EXPECT_ERROR(kva_prefill_workspace_size(f.ctx, &lim, NULL, &hb), KVA_ERR_INVALID_ARG);
    REQUIRE_OK(kva_prefill_workspace_size(f.ctx, &lim, &db, &hb));
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    int32_t qo[4] = {0, 2, 3, 5}, kv[4] = {0, 4, 8, 10};
    kva_plan p;
    EXPECT_ERROR(kva_prefill_plan(f.ctx, &lim, 3, qo, kv, &f.table, FX_POOL, NULL, ws, &p), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_prefill_plan(f.ctx, &lim, 3, qo, NULL, NULL, FX_POOL, NULL, ws, &p), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_prefill_plan(f.ctx, &lim, 3, NULL, kv, NULL, 0, NULL, ws, &p), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_prefill_plan(f.ctx, &lim, 4, qo, kv, NULL, 0, NULL, ws, &p), KVA_ERR_BAD_SHAPE);
    kva_plan_options alg2 = {0, 0, KVA_DECODE_GLOBAL_ROWMAX};
    EXPECT_ERROR(kva_prefill_plan(f.ctx, &lim, 3, qo, kv, NULL, 0, &alg2, ws, &p), KVA_ERR_UNSUPPORTED);
    qo[2] = 1; /* decreasing */
    EXPECT_ERROR(kva_prefill_plan(f.ctx, &lim, 3, qo, kv, NULL, 0, NULL, ws, &p), KVA_ERR_BAD_SHAPE);
    qo[2] = 3;
    qo[3] = 17; /* more queries than max_total_qo */
    EXPECT_ERROR(kva_prefill_plan(f.ctx, &lim, 3, qo, kv, NULL, 0, NULL, ws, &p), KVA_ERR_WORKSPACE_TOO_SMALL);
    qo[3] = 5;
    REQUIRE_OK(kva_prefill_plan(f.ctx, &lim, 3, qo, kv, NULL, 0, NULL, ws, &p));
    /* a prefill plan given to the decode run */
    poison_outputs(&f);
    EXPECT_ERROR(kva_decode_run(f.ctx, &p, &f.params, fq(&f), &f.pages, fo(&f), f.lse), KVA_ERR_BAD_STATE);
    CHECK(outputs_untouched(&f));

    /* dense attention: argument checks happen before any backend work */
    kva_tensor q = fq(&f), o = fo(&f);
    kva_attn_params prm = f.params;
    EXPECT_ERROR(kva_attention(NULL, &prm, 1, 2, q, q, q, o, NULL), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_attention(f.ctx, NULL, 1, 2, q, q, q, o, NULL), KVA_ERR_INVALID_ARG);
    EXPECT_ERROR(kva_attention(f.ctx, &prm, -1, 2, q, q, q, o, NULL), KVA_ERR_BAD_SHAPE);
    kva_tensor bad = q;
    bad.dtype = (kva_dtype)7;
    EXPECT_ERROR(kva_attention(f.ctx, &prm, 1, 2, bad, bad, bad, bad, NULL), KVA_ERR_INVALID_ARG);
    bad = q;
    bad.dtype = KVA_F16;
    EXPECT_ERROR(kva_attention(f.ctx, &prm, 1, 2, q, bad, q, o, NULL), KVA_ERR_BAD_SHAPE);
    prm.num_kv_heads = 3;
    EXPECT_ERROR(kva_attention(f.ctx, &prm, 1, 2, q, q, q, o, NULL), KVA_ERR_BAD_SHAPE);
    CHECK(outputs_untouched(&f));
    free(ws.device);
    free(ws.host);
    fixture_free(&f);
}

/* Strides whose offsets overflow int64 / the address space (index x stride x element size) are
 * refused before any kernel computes one: they used to pass (non-negative multiples of 4) and
 * crash in the kernels' pointer arithmetic (UBSan: signed overflow). */
KVA_TEST(api_errors_overflowing_strides_are_refused) {
    fixture f;
    if (!fixture_ready(&f)) return;
    const int64_t huge = (int64_t)1 << 61; /* x 4 bytes already overflows int64 */
    kva_tensor q = fq(&f), o = fo(&f), t;
    kva_kv_pages pg = f.pages;
    poison_outputs(&f);
    pg.stride_page = huge;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &pg, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_decode_run: pages strides") != NULL);
    pg = f.pages;
    pg.stride_head = huge / 2;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &pg, o, f.lse), KVA_ERR_BAD_SHAPE);
    t = q;
    t.stride_token = huge;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, t, &f.pages, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_decode_run: q strides") != NULL);
    t = o;
    t.stride_head = INT64_MAX - 3;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &f.pages, t, f.lse), KVA_ERR_BAD_SHAPE);
    /* dense attention: q, k, v, o */
    kva_tensor k = kva_tensor_nhd(f.pool, KVA_F32, FX_HK, FX_D);
    t = k;
    t.stride_head = huge;
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 2, 2, q, t, k, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_attention: k strides") != NULL);
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 2, 2, q, k, t, o, f.lse), KVA_ERR_BAD_SHAPE);
    t = o;
    t.stride_token = huge;
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 2, 2, q, k, k, t, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(outputs_untouched(&f));
    check_plan_still_runs(&f, "the refused strides");
    fixture_free(&f);
}

/* An output whose (token, head) rows share elements (a zero or too small stride) would have
 * threads race on them and return one result for several rows: refused, nothing written; padded
 * rows and the HND order are fine. */
KVA_TEST(api_errors_overlapping_output_rows_are_refused) {
    fixture f;
    if (!fixture_ready(&f)) return;
    kva_tensor q = fq(&f), o = fo(&f), t;
    poison_outputs(&f);
    t = o;
    t.stride_token = 0; /* every request's rows on the first's */
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &f.pages, t, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_decode_run: o strides") != NULL);
    t = o;
    t.stride_head = FX_D / 2; /* heads half a row apart */
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &f.pages, t, f.lse), KVA_ERR_BAD_SHAPE);
    t = o;
    t.stride_token = FX_D; /* tokens inside the heads' span (heads FX_D apart, too) */
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &f.pages, t, f.lse), KVA_ERR_BAD_SHAPE);
    kva_tensor k = kva_tensor_nhd(f.pool, KVA_F32, FX_HK, FX_D);
    t = o;
    t.stride_head = 0;
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 2, 2, q, k, k, t, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_attention: o strides") != NULL);
    CHECK(outputs_untouched(&f));
    /* the same rows of one token and head: nothing to overlap */
    kva_attn_params one = f.params;
    one.num_qo_heads = one.num_kv_heads = 1;
    t = o;
    t.stride_token = t.stride_head = 0;
    CHECK_OK(kva_attention(f.ctx, &one, 1, 2, q, k, k, t, NULL));
    /* HND rows and padded NHD rows: accepted */
    CHECK_OK(kva_decode_run(f.ctx, &f.plan, &f.params, q, &f.pages, kva_tensor_hnd(f.o, KVA_F32, FX_B, FX_D), f.lse));
    t = kva_tensor_nhd(f.o, KVA_F32, FX_HQ / 2, FX_D); /* heads of one token spill into the next: overlap */
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &f.pages, t, f.lse), KVA_ERR_BAD_SHAPE);
    check_plan_still_runs(&f, "the refused output strides");
    fixture_free(&f);
}

/* Pointers the kernels access element by element must be aligned to their elements: a
 * misaligned src / dst of kva_convert, v_in / v_out / lse of kva_merge_states or the lse output
 * of a run used to be accepted and accessed as misaligned float / uint16_t (UBSan: misaligned
 * load / store). They are refused, and nothing is written. */
KVA_TEST(api_errors_misaligned_element_pointers_are_refused) {
    fixture f;
    if (!fixture_ready(&f)) return;
    unsigned char *buf = kva_test_alloc(4096);
    float *src = (float *)(void *)buf;
    for (int i = 0; i < 16; ++i) src[i] = 1.0f;
    unsigned char *dst = buf + 1024;
    kva_poison(dst, 256);
    EXPECT_ERROR(kva_convert(buf + 2, KVA_F32, dst, KVA_BF16, 4), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_convert(src, KVA_F32, dst + 1, KVA_F16, 4), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_convert(src, KVA_F32, dst + 2, KVA_F32, 4), KVA_ERR_BAD_SHAPE);
    CHECK(all_bytes(dst, 256, 0xFF));
    CHECK_OK(kva_convert(buf + 2, KVA_BF16, dst + 514, KVA_F16, 4)); /* 2-byte elements */

    /* merge: 2 rows x 2 states x 16, f32; lse at buf + 512 */
    float *lse_in = (float *)(void *)(buf + 512);
    for (int i = 0; i < 4; ++i) lse_in[i] = 0.0f;
    EXPECT_ERROR(kva_merge_states(f.ctx, 2, 2, 16, KVA_F32, buf + 2, lse_in, dst, NULL), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_merge_states(f.ctx, 2, 2, 16, KVA_F32, src, (const float *)(const void *)(buf + 514),
                                  dst, NULL), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_merge_states(f.ctx, 2, 2, 16, KVA_F32, src, lse_in, dst + 2, NULL), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_merge_states(f.ctx, 2, 2, 16, KVA_BF16, src, lse_in, dst + 1, NULL), KVA_ERR_BAD_SHAPE);
    EXPECT_ERROR(kva_merge_states(f.ctx, 2, 2, 16, KVA_F32, src, lse_in, dst, (float *)(void *)(dst + 257)),
                 KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_merge_states: lse_out") != NULL);
    CHECK(all_bytes(dst, 256, 0xFF));

    /* the lse output of the runs */
    float *bad_lse = (float *)(void *)(dst + 1);
    poison_outputs(&f);
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, fq(&f), &f.pages, fo(&f), bad_lse),
                 KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_decode_run: lse") != NULL);
    kva_tensor k = kva_tensor_nhd(f.pool, KVA_F32, FX_HK, FX_D);
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 2, 2, fq(&f), k, k, fo(&f), bad_lse), KVA_ERR_BAD_SHAPE);
    CHECK(outputs_untouched(&f) && all_bytes(dst, 256, 0xFF));
    check_plan_still_runs(&f, "the misaligned pointers");
    free(buf);
    fixture_free(&f);
}

/* Plan limits, run arguments and variant options that no other test reached (a coverage run of
 * 2026-11-29 found their checks never executed): each is refused with a message naming the
 * argument, and a refused run leaves the outputs untouched. */
KVA_TEST(api_errors_limits_params_and_pages_fields) {
    fixture f;
    if (!fixture_ready(&f)) return;
    size_t db, hb;
    kva_plan_limits lim = f.lim;
    lim.page_size = 0; /* ragged prefill */
    lim.max_total_qo = -1;
    EXPECT_ERROR(kva_prefill_workspace_size(f.ctx, &lim, &db, &hb), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "limits.max_total_qo") != NULL);
    lim.max_total_qo = 16;
    lim.min_fixed_chunk = -1;
    EXPECT_ERROR(kva_prefill_workspace_size(f.ctx, &lim, &db, &hb), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "limits.min_fixed_chunk") != NULL);
    lim.min_fixed_chunk = 64; /* fixed chunks on ragged K/V need a bound on the keys */
    lim.max_total_kv = 0;
    EXPECT_ERROR(kva_prefill_workspace_size(f.ctx, &lim, &db, &hb), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "limits.max_total_kv") != NULL);

    /* a fixed chunk that splits into more partial states than a workspace sized without
     * limits.min_fixed_chunk holds: refused, and the message says which limit to set. One head,
     * one query, 100000 keys in chunks of 16: 6250 work items, which the query-tile capacity of
     * max_total_qo = 2^21 holds but the partial states (a few per core) do not. */
    kva_plan_limits one = {1, 0, 100000, 1 << 21, 1, 1, FX_D, 0, 0};
    REQUIRE_OK(kva_prefill_workspace_size(f.ctx, &one, &db, &hb));
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    const int32_t qo[2] = {0, 1}, kv[2] = {0, 100000};
    kva_plan_options fixed = {0, 16, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan p;
    if (4 * (int64_t)sysconf(_SC_NPROCESSORS_ONLN) < 6250) { /* (the partial states: 4 per online CPU) */
        EXPECT_ERROR(kva_prefill_plan(f.ctx, &one, 1, qo, kv, NULL, 0, &fixed, ws, &p), KVA_ERR_WORKSPACE_TOO_SMALL);
        CHECK(strstr(kva_last_error(), "splits into 6250 work items") != NULL);
        CHECK(strstr(kva_last_error(), "limits.min_fixed_chunk = 16") != NULL);
    }
    free(ws.device);
    free(ws.host);
    one.max_total_qo = 1;
    one.min_fixed_chunk = 16; /* sized for it, the same plan fits */
    REQUIRE_OK(kva_prefill_workspace_size(f.ctx, &one, &db, &hb));
    ws = (kva_workspace){kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    CHECK_OK(kva_prefill_plan(f.ctx, &one, 1, qo, kv, NULL, 0, &fixed, ws, &p));
    free(ws.device);
    free(ws.host);
    /* a ragged run whose q has an unknown dtype (its plan: the fixture's heads, 2 + 2 tokens) */
    lim = f.lim;
    lim.page_size = 0;
    lim.max_total_qo = 16;
    lim.max_total_kv = 64;
    REQUIRE_OK(kva_prefill_workspace_size(f.ctx, &lim, &db, &hb));
    ws = (kva_workspace){kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    const int32_t qo2[2] = {0, 2}, kv2[2] = {0, 2};
    REQUIRE_OK(kva_prefill_plan(f.ctx, &lim, 1, qo2, kv2, NULL, 0, NULL, ws, &p));
    /* a ragged run whose q has an unknown dtype */
    kva_tensor badq = fq(&f);
    badq.dtype = (kva_dtype)9;
    kva_tensor k1 = kva_tensor_nhd(f.pool, KVA_F32, FX_HK, FX_D);
    EXPECT_ERROR(kva_prefill_run_ragged(f.ctx, &p, &f.params, badq, k1, k1, fo(&f), NULL), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "q.dtype") != NULL);
    free(ws.device);
    free(ws.host);

    /* decode run arguments */
    kva_tensor q = fq(&f), o = fo(&f), t;
    kva_attn_params prm = f.params;
    poison_outputs(&f);
    prm.logits_soft_cap = NAN;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &prm, q, &f.pages, o, f.lse), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "params.logits_soft_cap") != NULL);
    /* caps whose kernel constants cap * log2(e) and sm_scale / cap leave the normal floats
     * (CUDA kernels would flush or overflow them, the CPU divide by the cap): the largest
     * subnormal cap; FLT_MIN where sm_scale / cap overflows; one where sm_scale / cap is
     * subnormal; FLT_MAX, where cap * log2(e) overflows -- refused; FLT_MIN at the default
     * scale is a cap */
    prm.logits_soft_cap = nextafterf(FLT_MIN, 0.0f);
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &prm, q, &f.pages, o, f.lse), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "params.logits_soft_cap = 1.17549421e-38 is outside [1.17549435e-38,") != NULL);
    prm.logits_soft_cap = FLT_MIN;
    prm.sm_scale = 1e4f;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &prm, q, &f.pages, o, f.lse), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "(sm_scale 10000)") != NULL);
    prm.sm_scale = f.params.sm_scale;
    prm.logits_soft_cap = 1e38f;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &prm, q, &f.pages, o, f.lse), KVA_ERR_INVALID_ARG);
    prm.logits_soft_cap = FLT_MAX;
    prm.sm_scale = 1e30f; /* (sm_scale / cap normal: only cap * log2(e) overflows) */
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &prm, q, &f.pages, o, f.lse), KVA_ERR_INVALID_ARG);
    CHECK(outputs_untouched(&f));
    prm.sm_scale = f.params.sm_scale;
    prm.logits_soft_cap = FLT_MIN;
    REQUIRE_OK(kva_decode_run(f.ctx, &f.plan, &prm, q, &f.pages, o, f.lse));
    poison_outputs(&f);
    prm = f.params;
    prm.head_dim = 2 * FX_D; /* the plan was made for FX_D */
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &prm, q, &f.pages, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "plan was made for") != NULL);
    t = q;
    t.stride_head = -FX_D;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, t, &f.pages, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "q.data must be 16-byte aligned") != NULL);
    kva_kv_pages pg = f.pages;
    pg.page_size = (1 << 16) + 1;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &pg, o, f.lse), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "pages.page_size") != NULL);
    pg = f.pages;
    pg.v_data = (char *)pg.v_data + 4; /* element-aligned, not 16-byte aligned */
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &pg, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "pages.k_data / v_data must be 16-byte aligned") != NULL);
    pg = f.pages;
    pg.stride_token = -pg.stride_token;
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, q, &pg, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(outputs_untouched(&f));
    check_plan_still_runs(&f, "the refused runs");

    /* variant options are checked before the device is: a CPU context answers them */
    kva_variant *var = NULL;
    kva_variant_options vo = {0};
    vo.dtypes = 8;
    EXPECT_ERROR(kva_variant_create(f.ctx, "float m(float s, int q, int k, int h, const void *u) { return s; }", "m",
                                    &vo, &var),
                 KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "options.dtypes") != NULL && var == NULL);
    vo.dtypes = 0;
    vo.head_dim = -16;
    EXPECT_ERROR(kva_variant_create(f.ctx, "float m(float s, int q, int k, int h, const void *u) { return s; }", "m",
                                    &vo, &var),
                 KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "options.head_dim") != NULL && var == NULL);
    fixture_free(&f);
}

/* ---- a mutation audit of src/api (2026-11-29): each check below was the only one that failed
 * when its line of src/api was dropped or weakened; each refused call must also leave the
 * poisoned outputs untouched. ------------------------------------------------------------- */

/* kva_attention's params and tensors, at the bounds the other tests stepped over: no qo heads,
 * causal = -1, head_dim 0 (all 0 mod 16), a negative kv_len, q / k strides that are not
 * multiples of the vector width or are negative. head_dim 256, the largest CPU dim, runs. */
KVA_TEST(api_errors_attention_param_and_tensor_bounds) {
    fixture f;
    if (!fixture_ready(&f)) return;
    kva_tensor q = fq(&f), o = fo(&f), k = kva_tensor_nhd(f.pool, KVA_F32, FX_HK, FX_D), t;
    kva_attn_params prm = f.params;
    poison_outputs(&f);
    prm.num_qo_heads = 0; /* 0 % num_kv_heads == 0: the ">= 1" half must catch it */
    EXPECT_ERROR(kva_attention(f.ctx, &prm, 1, 2, q, k, k, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_attention: params.num_kv_heads") != NULL);
    prm = f.params;
    prm.causal = -1; /* not only values above 1 */
    EXPECT_ERROR(kva_attention(f.ctx, &prm, 1, 2, q, k, k, o, f.lse), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_attention: params.causal") != NULL);
    prm = f.params;
    prm.head_dim = 0; /* a multiple of 16, below the smallest dim */
    EXPECT_ERROR(kva_attention(f.ctx, &prm, 1, 2, q, k, k, o, f.lse), KVA_ERR_UNSUPPORTED);
    CHECK(strstr(kva_last_error(), "kva_attention: params.head_dim = 0") != NULL);
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 1, -1, q, k, k, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kv_len -1") != NULL);
    t = q;
    t.stride_head = FX_D + 2; /* an input: no overlap check would catch it */
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 1, 2, t, k, k, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_attention: q.data must be 16-byte aligned") != NULL);
    t = k;
    t.stride_token = -t.stride_token; /* a multiple of 4, but negative */
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 1, 2, q, t, k, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_attention: k.data must be 16-byte aligned") != NULL);
    t = k;
    t.stride_token = (int64_t)1 << 60; /* 2 keys x 4 B overflow; bounded over the 1 query, not */
    EXPECT_ERROR(kva_attention(f.ctx, &f.params, 1, 2, q, t, k, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_attention: k strides") != NULL);
    CHECK(outputs_untouched(&f));
    /* head_dim 256: the top of the CPU's range is served */
    float *buf = kva_test_alloc(4 * 256 * sizeof(float));
    for (int i = 0; i < 3 * 256; ++i) buf[i] = 0.01f * (float)(i % 7);
    kva_poison(buf + 3 * 256, 256 * sizeof(float));
    kva_attn_params big = kva_attn_params_default(1, 1, 256);
    CHECK_OK(kva_attention(f.ctx, &big, 1, 1, kva_tensor_nhd(buf, KVA_F32, 1, 256),
                           kva_tensor_nhd(buf + 256, KVA_F32, 1, 256), kva_tensor_nhd(buf + 512, KVA_F32, 1, 256),
                           kva_tensor_nhd(buf + 768, KVA_F32, 1, 256), NULL));
    CHECK(buf[768] == buf[512] && buf[1023] == buf[767]); /* one key: o = v */
    free(buf);
    fixture_free(&f);
}

/* The page pool's fields of a decode run that no test set alone: a NULL v_data, page_size 0, a
 * misaligned k_data, stride_page / stride_head off the vector width, a negative stride_page.
 * And a plan struct whose magic was overwritten (its workspace still valid), and q strides whose
 * offsets overflow over the qo heads (4) though not over the kv heads (2). */
KVA_TEST(api_errors_decode_run_pages_plan_and_q_fields) {
    fixture f;
    if (!fixture_ready(&f)) return;
    kva_tensor q = fq(&f), o = fo(&f), t;
    kva_kv_pages pg;
    poison_outputs(&f);
#define RUN(pg_) kva_decode_run(f.ctx, &f.plan, &f.params, q, pg_, o, f.lse)
    pg = f.pages;
    pg.v_data = NULL;
    EXPECT_ERROR(RUN(&pg), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_decode_run: pages.k_data / v_data is NULL") != NULL);
    pg = f.pages;
    pg.page_size = 0; /* outside 1..max, not merely another size than the plan's */
    EXPECT_ERROR(RUN(&pg), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_decode_run: pages.page_size 0 outside") != NULL);
    pg = f.pages;
    pg.k_data = (char *)pg.k_data + 4;
    EXPECT_ERROR(RUN(&pg), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_decode_run: pages.k_data / v_data must be 16-byte aligned") != NULL);
    pg = f.pages;
    pg.stride_page += 2;
    EXPECT_ERROR(RUN(&pg), KVA_ERR_BAD_SHAPE);
    pg = f.pages;
    pg.stride_head += 2;
    EXPECT_ERROR(RUN(&pg), KVA_ERR_BAD_SHAPE);
    pg = f.pages;
    pg.stride_page = -pg.stride_page;
    EXPECT_ERROR(RUN(&pg), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_decode_run: pages.k_data / v_data must be 16-byte aligned") != NULL);
#undef RUN
    kva_plan forged = f.plan;
    forged.magic ^= 1u; /* the header behind it still matches every other field */
    EXPECT_ERROR(kva_decode_run(f.ctx, &forged, &f.params, q, &f.pages, o, f.lse), KVA_ERR_BAD_STATE);
    CHECK(strstr(kva_last_error(), "kva_decode_run: plan was not made by") != NULL);
    t = q;
    t.stride_head = ((int64_t)3 << 58); /* 2 heads x 4 B fit in PTRDIFF_MAX, 4 heads do not */
    EXPECT_ERROR(kva_decode_run(f.ctx, &f.plan, &f.params, t, &f.pages, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_decode_run: q strides") != NULL);
    CHECK(outputs_untouched(&f));
    check_plan_still_runs(&f, "the refused pages and plan");
    fixture_free(&f);
}

/* The prefill runs' own checks: ragged v, o, lse and the k bound over the keys (2) rather than
 * the queries (1); a params/plan kv-head mismatch that only the plan check sees (no pages); the
 * paged run's pages and o. */
KVA_TEST(api_errors_prefill_runs_check_every_argument) {
    fixture f;
    if (!fixture_ready(&f)) return;
    size_t db, hb;
    kva_plan_limits lim = f.lim;
    lim.page_size = 0;
    lim.max_total_qo = 16;
    lim.max_total_kv = 64;
    REQUIRE_OK(kva_prefill_workspace_size(f.ctx, &lim, &db, &hb));
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    const int32_t qo[2] = {0, 1}, kv[2] = {0, 2};
    kva_plan rp, pp;
    REQUIRE_OK(kva_prefill_plan(f.ctx, &lim, 1, qo, kv, NULL, 0, NULL, ws, &rp));
    kva_tensor q = fq(&f), o = fo(&f), k = kva_tensor_nhd(f.pool, KVA_F32, FX_HK, FX_D), t;
    poison_outputs(&f);
    t = k;
    t.data = NULL;
    EXPECT_ERROR(kva_prefill_run_ragged(f.ctx, &rp, &f.params, q, k, t, o, f.lse), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_prefill_run_ragged: v.data is NULL") != NULL);
    t = o;
    t.stride_head = 0;
    EXPECT_ERROR(kva_prefill_run_ragged(f.ctx, &rp, &f.params, q, k, k, t, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_prefill_run_ragged: o strides") != NULL);
    EXPECT_ERROR(kva_prefill_run_ragged(f.ctx, &rp, &f.params, q, k, k, o, (float *)(void *)((char *)f.lse + 2)),
                 KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_prefill_run_ragged: lse") != NULL);
    t = k;
    t.stride_token = (int64_t)1 << 60; /* 2 keys x 4 B overflow; 1 key would not */
    EXPECT_ERROR(kva_prefill_run_ragged(f.ctx, &rp, &f.params, q, t, k, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_prefill_run_ragged: k strides") != NULL);
    kva_attn_params one_kv = f.params;
    one_kv.num_kv_heads = 1; /* valid (4 / 1), not what the plan was made for */
    EXPECT_ERROR(kva_prefill_run_ragged(f.ctx, &rp, &one_kv, q, k, k, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_prefill_run_ragged: plan was made for") != NULL);
    CHECK(outputs_untouched(&f));
    CHECK_OK(kva_prefill_run_ragged(f.ctx, &rp, &f.params, q, k, k, o, f.lse));

    /* paged: 3 requests of one query each on the fixture's page table */
    lim = f.lim;
    lim.max_total_qo = 16;
    free(ws.device);
    free(ws.host);
    REQUIRE_OK(kva_prefill_workspace_size(f.ctx, &lim, &db, &hb));
    ws = (kva_workspace){kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    const int32_t qo3[4] = {0, 1, 2, 3};
    REQUIRE_OK(kva_prefill_plan(f.ctx, &lim, FX_B, qo3, NULL, &f.table, FX_POOL, NULL, ws, &pp));
    poison_outputs(&f);
    kva_kv_pages pg = f.pages;
    pg.page_size = FX_PAGE * 2;
    EXPECT_ERROR(kva_prefill_run_paged(f.ctx, &pp, &f.params, q, &pg, o, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_prefill_run_paged: pages.page_size") != NULL);
    EXPECT_ERROR(kva_prefill_run_paged(f.ctx, &pp, &f.params, q, NULL, o, f.lse), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_prefill_run_paged: pages is NULL") != NULL);
    t = o;
    t.stride_token = 0;
    EXPECT_ERROR(kva_prefill_run_paged(f.ctx, &pp, &f.params, q, &f.pages, t, f.lse), KVA_ERR_BAD_SHAPE);
    CHECK(strstr(kva_last_error(), "kva_prefill_run_paged: o strides") != NULL);
    CHECK(outputs_untouched(&f));
    CHECK_OK(kva_prefill_run_paged(f.ctx, &pp, &f.params, q, &f.pages, o, f.lse));
    free(ws.device);
    free(ws.host);
    fixture_free(&f);
}

/* Variant arguments a CPU context still answers: a function name one past the 200-character
 * bound is not an identifier (INVALID_ARG, before the device's UNSUPPORTED); a NULL stats is
 * named "stats", not "variant" (the variant is not read when stats is NULL). */
KVA_TEST(api_errors_variant_identifier_length_and_stats) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    char name[202];
    memset(name, 'a', sizeof name);
    name[201] = 0;
    kva_variant *var = (kva_variant *)&var;
    EXPECT_ERROR(kva_variant_create(ctx, "float aaa(float s) { return s; }", name, NULL, &var),
                 KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_variant_create: function") != NULL && var == NULL);
    name[200] = 0; /* 200 characters: an identifier; the CPU context then refuses variants */
    EXPECT_ERROR(kva_variant_create(ctx, "float aaa(float s) { return s; }", name, NULL, &var),
                 KVA_ERR_UNSUPPORTED);
    int fake = 0;
    EXPECT_ERROR(kva_variant_get_stats((const kva_variant *)(const void *)&fake, NULL), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_variant_get_stats: stats is NULL") != NULL);
    kva_context_destroy(ctx);
}
