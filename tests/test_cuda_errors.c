/*
 * test_cuda_errors.c -- bad inputs on a CUDA context fail with the documented status and leave
 * the output untouched: unsupported head dims, GQA groups and score_mod callbacks, dtype and
 * geometry mismatches, misaligned tensors, foreign plans, missing devices, CPU-only operations.
 */
#include "harness.h"
#include "test_cuda_util.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#if KVA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static float dummy_mod(float s, int32_t qp, int32_t kp, int32_t h, void *u) {
    (void)qp; (void)kp; (void)h; (void)u;
    return s;
}

/* KVA_PREFILL_PATH, read at context creation: mma everywhere, wgmma and hopper where the device
 * is sm_90 and the build holds sm_90a code; any other value, or a path the device or build lacks,
 * fails kva_context_create with a message naming the variable (a comparison run under a value
 * that was silently ignored would time the default path and report it as another). */
KVA_TEST(cuda_prefill_path_env) {
    if (!kva_cuda_available()) {
        kva_test_skip("no CUDA device");
        return;
    }
    bool sm90a = false;
#if KVA_HAVE_CUDA && defined(KVA_HAVE_SM90A)
    int major = 0;
    (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    sm90a = major == 9;
#endif
    static const struct {
        const char *value;
        int ok; /* 1: accepted everywhere, 2: where sm90a, 0: never */
    } cases[] = {{"mma", 1}, {"", 1}, {"wgmma", 2}, {"hopper", 2}, {"Hopper", 0}, {"mmma", 0}, {"sm80", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        kva_test_env env;
        kva_test_env_set(&env, "KVA_PREFILL_PATH", cases[i].value);
        kva_context *ctx = NULL;
        const kva_status st = kva_context_create(KVA_DEVICE_CUDA, 0, &ctx);
        const bool want_ok = cases[i].ok == 1 || (cases[i].ok == 2 && sm90a);
        if (want_ok) {
            CHECK_MSG(st == KVA_OK && ctx, "KVA_PREFILL_PATH=%s: %s (%s)", cases[i].value, kva_status_str(st),
                      kva_last_error());
        } else {
            CHECK_MSG(st == KVA_ERR_UNSUPPORTED && !ctx, "KVA_PREFILL_PATH=%s: %s, expected KVA_ERR_UNSUPPORTED",
                      cases[i].value, kva_status_str(st));
            CHECK_MSG(strstr(kva_last_error(), "kva_context_create: KVA_PREFILL_PATH=") != NULL,
                      "KVA_PREFILL_PATH=%s: message '%s'", cases[i].value, kva_last_error());
        }
        kva_context_destroy(ctx);
        kva_test_env_restore(&env);
    }
}

/* The other kernel-choice knobs: a CUDA context refuses a value it does not know (naming the
 * variable) and takes the ones it does. */
KVA_TEST(cuda_kernel_knobs_env) {
    if (!kva_cuda_available()) {
        kva_test_skip("no CUDA device");
        return;
    }
    static const struct {
        const char *name, *value;
        int ok;
    } cases[] = {
        {"KVA_DECODE_GROUP_PATH", "subgroups", 1}, {"KVA_DECODE_GROUP_PATH", "prefill", 1},
        {"KVA_DECODE_GROUP_PATH", "subgroup", 0},  {"KVA_PREFILL_PERSISTENT", "0", 1},
        {"KVA_PREFILL_PERSISTENT", "7", 1},        {"KVA_PREFILL_PERSISTENT", "on", 0},
        {"KVA_PREFILL_PERSISTENT", "-1", 0},       {"KVA_PREFILL_BALANCE_MIN_TILES", "4", 1},
        {"KVA_PREFILL_BALANCE_MIN_TILES", "4x", 0}, {"KVA_PREFILL_TMA_STRICT", "1", 1},
        {"KVA_PREFILL_TMA_STRICT", "yes", 0},      {"KVA_PREFILL_TURNS", "0", 1},
        {"KVA_PREFILL_TURNS", "on", 0},            {"KVA_DECODE_MERGE_WAIT_NS", "0", 1},
        {"KVA_DECODE_MERGE_WAIT_NS", "1e5", 0},   {"KVA_DECODE_SHARED_MERGE", "0", 1},
        {"KVA_DECODE_SHARED_MERGE", "off", 0},   {"KVA_DECODE_PAIR_HEADS", "1", 1},
        {"KVA_DECODE_PAIR_HEADS", "yes", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        kva_test_env env;
        kva_test_env_set(&env, cases[i].name, cases[i].value);
        kva_context *ctx = NULL;
        const kva_status st = kva_context_create(KVA_DEVICE_CUDA, 0, &ctx);
        if (cases[i].ok) {
            CHECK_MSG(st == KVA_OK && ctx, "%s=%s: %s (%s)", cases[i].name, cases[i].value, kva_status_str(st),
                      kva_last_error());
        } else {
            CHECK_MSG(st == KVA_ERR_UNSUPPORTED && !ctx, "%s=%s: %s, expected KVA_ERR_UNSUPPORTED", cases[i].name,
                      cases[i].value, kva_status_str(st));
            char want[96];
            snprintf(want, sizeof want, "kva_context_create: %s=%s is not one of", cases[i].name, cases[i].value);
            CHECK_MSG(strstr(kva_last_error(), want) != NULL, "%s=%s: message '%s'", cases[i].name, cases[i].value,
                      kva_last_error());
        }
        kva_context_destroy(ctx);
        kva_test_env_restore(&env);
    }
}

KVA_TEST(cuda_errors_are_reported) {
    kva_context *bad = NULL;
    if (kva_cuda_available()) {
        CHECK_STATUS(kva_context_create(KVA_DEVICE_CUDA, 4096, &bad), KVA_ERR_DEVICE);
        CHECK(bad == NULL);
    }
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t B = 3, Hq = 8, Hk = 2, D = 128, ps = 16;
    int32_t lens[3] = {40, 0, 17};
    cuda_paged_batch pb;
    cuda_test_workspace w = {0};
    void *q = NULL, *o = NULL;
    if (!cuda_paged_batch_make(ctx, &rng, KVA_BF16, B, lens, Hk, D, ps, CUDA_TEST_NHD, &pb)) goto out;
    kva_plan_limits lim = {B, pb.indptr[B], 0, 0, Hq, Hk, D, ps, 0};
    if (!cuda_test_workspace_make(ctx, &lim, &w)) goto out;
    size_t n = (size_t)B * Hq * D * 2;
    q = cuda_test_poisoned(ctx, n);
    o = cuda_test_poisoned(ctx, n);
    kva_plan plan;
    kva_status st = kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, NULL, w.ws, &plan);
    CHECK_OK(st);
    if (st != KVA_OK) goto out;
    kva_tensor qt = kva_tensor_nhd(q, KVA_BF16, Hq, D), ot = kva_tensor_nhd(o, KVA_BF16, Hq, D);
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D);

    kva_attn_params bad_p = p;
    bad_p.head_dim = 88; /* not a multiple of 16 */
    CHECK_STATUS(kva_decode_run(ctx, &plan, &bad_p, qt, &pb.dev_pages, ot, NULL), KVA_ERR_UNSUPPORTED);
    bad_p.head_dim = 272; /* above 256 */
    CHECK_STATUS(kva_decode_run(ctx, &plan, &bad_p, qt, &pb.dev_pages, ot, NULL), KVA_ERR_UNSUPPORTED);
    bad_p = p;
    /* Every multiple of 16 in 32..256 and every group decode on CUDA; a shape the plan was not
     * made for is a shape error. */
    bad_p.head_dim = 96;
    CHECK_STATUS(kva_decode_run(ctx, &plan, &bad_p, qt, &pb.dev_pages, ot, NULL), KVA_ERR_BAD_SHAPE);
    bad_p = p;
    bad_p.num_qo_heads = 64; /* group 32 */
    CHECK_STATUS(kva_decode_run(ctx, &plan, &bad_p, qt, &pb.dev_pages, ot, NULL), KVA_ERR_BAD_SHAPE);
    bad_p = p;
    bad_p.score_mod = dummy_mod;
    CHECK_STATUS(kva_decode_run(ctx, &plan, &bad_p, qt, &pb.dev_pages, ot, NULL), KVA_ERR_UNSUPPORTED);

    kva_tensor q16 = qt;
    q16.dtype = KVA_F16;
    CHECK_STATUS(kva_decode_run(ctx, &plan, &p, q16, &pb.dev_pages, ot, NULL), KVA_ERR_BAD_SHAPE);
    kva_tensor qmis = qt;
    qmis.data = (unsigned char *)q + 2;
    CHECK_STATUS(kva_decode_run(ctx, &plan, &p, qmis, &pb.dev_pages, ot, NULL), KVA_ERR_BAD_SHAPE);
    kva_kv_pages pages2 = pb.dev_pages;
    pages2.page_size = 32;
    CHECK_STATUS(kva_decode_run(ctx, &plan, &p, qt, &pages2, ot, NULL), KVA_ERR_BAD_SHAPE);
    pages2 = pb.dev_pages;
    pages2.num_pages = 1;
    CHECK_STATUS(kva_decode_run(ctx, &plan, &p, qt, &pages2, ot, NULL), KVA_ERR_OUT_OF_RANGE);
    kva_plan forged = plan;
    forged.magic = 0;
    CHECK_STATUS(kva_decode_run(ctx, &forged, &p, qt, &pb.dev_pages, ot, NULL), KVA_ERR_BAD_STATE);

    /* A page id outside the pool is caught by the plan. */
    int32_t saved = pb.indices[0];
    pb.indices[0] = pb.num_pages;
    kva_plan plan2;
    CHECK_STATUS(kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, NULL, w.ws, &plan2),
                 KVA_ERR_OUT_OF_RANGE);
    pb.indices[0] = saved;

    /* Decode and prefill workspaces serve every multiple of 16 in 32..256 (d96 on the d128
     * kernels) and refuse other head dims at sizing time, before any plan could succeed. */
    kva_plan_limits odd = lim;
    odd.head_dim = 96;
    odd.max_total_qo = 64;
    size_t db = 0, hb = 0;
    CHECK_OK(kva_prefill_workspace_size(ctx, &odd, &db, &hb));
    CHECK_OK(kva_decode_workspace_size(ctx, &odd, &db, &hb));
    odd.head_dim = 24;
    CHECK_STATUS(kva_decode_workspace_size(ctx, &odd, &db, &hb), KVA_ERR_UNSUPPORTED);
    CHECK_STATUS(kva_prefill_workspace_size(ctx, &odd, &db, &hb), KVA_ERR_UNSUPPORTED);
    odd.head_dim = 272;
    CHECK_STATUS(kva_prefill_workspace_size(ctx, &odd, &db, &hb), KVA_ERR_UNSUPPORTED);
    CHECK_STATUS(kva_merge_states(ctx, 4, 2, 0, KVA_BF16, q, (const float *)q, o, NULL), KVA_ERR_BAD_SHAPE);

    /* None of the failed calls wrote o: it is still all poison. */
    CHECK_OK(kva_synchronize(ctx));
    unsigned char *oh = cuda_test_download(ctx, o, n);
    size_t untouched = 0;
    for (size_t i = 0; i < n; ++i) untouched += oh[i] == 0xFF;
    CHECK_MSG(untouched == n, "%zu of %zu output bytes changed by failing calls", n - untouched, n);
    free(oh);

    /* A failed plan leaves the workspace holding no plan; after re-planning a run works. */
    CHECK_STATUS(kva_decode_run(ctx, &plan, &p, qt, &pb.dev_pages, ot, NULL), KVA_ERR_BAD_STATE);
    CHECK_OK(kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, NULL, w.ws, &plan));
    CHECK_OK(kva_decode_run(ctx, &plan, &p, qt, &pb.dev_pages, ot, NULL));
    CHECK_OK(kva_synchronize(ctx));
out:
    kva_free(ctx, q);
    kva_free(ctx, o);
    cuda_test_workspace_free(ctx, &w);
    cuda_paged_batch_free(ctx, &pb);
    kva_context_destroy(ctx);
}
