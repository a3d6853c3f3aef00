/*
 * test_cuda_graph.c -- a decode run captured in a CUDA graph with a KVA_PLAN_GRAPH plan replays
 * correctly after re-planning (host only) into the same workspace for other batches: smaller,
 * with empty requests, longer or shorter, split or not. Each replay's output is poisoned first
 * and compared against the float64 reference. Also with the global-rowmax algorithm (two
 * launches in the graph), with a GQA group of 48 at head dim 80 (sub-groups, padded dim), of
 * 71 at head dim 64 (on Hopper: the prefill kernel and the prefill merge), and with two KV heads
 * per unit (d96).
 */
#include "harness.h"
#include "test_cuda_util.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#if KVA_HAVE_CUDA
#include <cuda_runtime_api.h>

#define CUDA_CHECK(call)                                                                       \
    do {                                                                                       \
        cudaError_t e__ = (call);                                                              \
        if (e__ != cudaSuccess) {                                                              \
            kva_test_fail(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(e__));       \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)

static void graph_replay(kva_decode_algo algo, int32_t Hq, int32_t Hk, int32_t D) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t MAXB = 16, ps = 16, MAXLEN = 3000;
    const kva_dtype dt = KVA_BF16;
    cudaStream_t stream = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cuda_test_workspace w = {0};
    cuda_paged_batch pools[4];
    memset(pools, 0, sizeof pools);
    const size_t es = 2, n_q = (size_t)MAXB * Hq * D;
    void *q_dev = NULL, *o_dev = NULL, *q_host = kva_test_alloc(n_q * es);
    float *lse_dev = NULL;
    void *pool_dev = NULL;

    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_OK(kva_context_set_stream(ctx, stream));

    /* Batches to plan in turn: the captured one first. Each gets its own pool contents, copied
     * into one device pool buffer whose address the graph captured. */
    const int32_t sizes[4] = {MAXB, 5, MAXB, 1};
    int32_t lens[4][16];
    for (int i = 0; i < 4; ++i)
        for (int32_t b = 0; b < sizes[i]; ++b)
            lens[i][b] = i == 0 ? kva_rng_int(&rng, 1000, MAXLEN)      /* long */
                         : i == 1 ? cuda_test_pick_len(&rng, MAXLEN)  /* ragged, empties */
                         : i == 2 ? kva_rng_int(&rng, 1, 40)          /* short, unsplit */
                                  : MAXLEN;                           /* one long request */
    size_t pool_bytes = 0;
    int32_t max_pages = 0;
    for (int i = 0; i < 4; ++i) {
        if (!cuda_paged_batch_make(ctx, &rng, dt, sizes[i], lens[i], Hk, D, ps, CUDA_TEST_NHD, &pools[i]))
            goto out;
        if (pools[i].pool_bytes > pool_bytes) pool_bytes = pools[i].pool_bytes;
        if (pools[i].num_pages > max_pages) max_pages = pools[i].num_pages;
    }
    CHECK_OK(kva_malloc(ctx, pool_bytes, &pool_dev));
    kva_plan_limits lim = {MAXB, (int64_t)MAXB * ((MAXLEN + ps - 1) / ps), 0, 0, Hq, Hk, D, ps, 0};
    if (!cuda_test_workspace_make(ctx, &lim, &w)) goto out;
    q_dev = cuda_test_poisoned(ctx, n_q * es);
    o_dev = cuda_test_poisoned(ctx, n_q * es);
    lse_dev = cuda_test_poisoned(ctx, sizeof(float) * MAXB * Hq);
    if (!q_dev || !o_dev || !lse_dev) goto out;

    kva_attn_params p = kva_attn_params_default(Hq, Hk, D);
    kva_plan_options opt = {KVA_PLAN_GRAPH, 0, algo};
    /* bit 0: a split plan replayed, bit 1: an unsplit one (whether the captured batch splits is
     * the scheduler's call; the one long request splits, the short batch does not) */
    int kinds_seen = 0;
    /* The captured pool view: the largest pool's geometry at pool_dev. */
    kva_kv_pages pages = pools[0].dev_pages;
    pages.num_pages = max_pages;
    for (int i = 0; i < 4; ++i) {
        cuda_paged_batch *pb = &pools[i];
        /* Pool i's pages at the captured address (same layout, stride per page unchanged). */
        CHECK_OK(kva_memcpy(ctx, pool_dev, pb->host_pool, pb->pool_bytes, KVA_COPY_HOST_TO_DEVICE));
        pages.k_data = pool_dev;
        pages.v_data = (unsigned char *)pool_dev + ((unsigned char *)pb->host_pages.v_data -
                                                    (unsigned char *)pb->host_pool);
        if (i == 0) {
            pages.num_pages = pb->num_pages;
        } else {
            /* V's offset depends on the pool size; the graph baked in pool 0's. Rebuild this
             * pool with pool 0's V offset by copying V to that place. */
            size_t half = pb->pool_bytes / 2, half0 = pools[0].pool_bytes / 2;
            CHECK(half <= half0);
            CHECK_OK(kva_memcpy(ctx, (unsigned char *)pool_dev + half0,
                                (unsigned char *)pb->host_pool + half, half, KVA_COPY_HOST_TO_DEVICE));
            pages.v_data = (unsigned char *)pool_dev + half0;
        }
        kva_fill_random(&rng, q_host, dt, n_q, -1.f, 1.f);
        CHECK_OK(kva_memcpy(ctx, q_dev, q_host, n_q * es, KVA_COPY_HOST_TO_DEVICE));
        void *poison = kva_test_alloc(n_q * es);
        kva_poison(poison, n_q * es);
        CHECK_OK(kva_memcpy(ctx, o_dev, poison, n_q * es, KVA_COPY_HOST_TO_DEVICE));
        CHECK_OK(kva_memcpy(ctx, lse_dev, poison, sizeof(float) * MAXB * Hq, KVA_COPY_HOST_TO_DEVICE));
        free(poison);

        kva_plan plan;
        kva_status st = kva_decode_plan(ctx, &lim, &pb->table, pb->num_pages, &opt, w.ws, &plan);
        CHECK_MSG(st == KVA_OK, "plan %d: %s (%s)", i, kva_status_str(st), kva_last_error());
        if (st != KVA_OK) goto out;
        CHECK(plan.padded_work >= plan.num_work);
        kinds_seen |= plan.split_kv ? 1 : 2;
        if (i == 0) {
            CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            st = kva_decode_run(ctx, &plan, &p, kva_tensor_nhd(q_dev, dt, Hq, D), &pages,
                                kva_tensor_nhd(o_dev, dt, Hq, D), lse_dev);
            CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
            CHECK_MSG(st == KVA_OK, "captured run: %s (%s)", kva_status_str(st), kva_last_error());
            CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        }
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CHECK_OK(kva_synchronize(ctx));

        /* Reference from pool i's host copy. */
        double *o_ref = kva_test_alloc(sizeof(double) * n_q), *lse_ref = kva_test_alloc(sizeof(double) * MAXB * Hq);
        cuda_ref_decode(pb, &p, q_host, o_ref, lse_ref);
        void *o_host = cuda_test_download(ctx, o_dev, n_q * es);
        float *lse_host = cuda_test_download(ctx, lse_dev, sizeof(float) * MAXB * Hq);
        int before = kva_test_failures;
        kva_compare("graph replay o", o_host, dt, o_ref, (size_t)pb->batch * Hq * D, kva_tol_for(dt), NULL);
        kva_compare_lse("graph replay lse", lse_host, lse_ref, (size_t)pb->batch * Hq, dt, NULL);
        if (kva_test_failures != before)
            printf("    replay %d: batch %d, chunk %d, %d work items, split %d\n", i, pb->batch,
                   plan.kv_chunk_size, plan.num_work, plan.split_kv);
        free(o_ref);
        free(lse_ref);
        free(o_host);
        free(lse_host);
    }
    CHECK_MSG(kinds_seen == 3, "replays covered split and unsplit plans (seen mask %d)", kinds_seen);
out:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    free(q_host);
    kva_free(ctx, q_dev);
    kva_free(ctx, o_dev);
    kva_free(ctx, lse_dev);
    kva_free(ctx, pool_dev);
    cuda_test_workspace_free(ctx, &w);
    for (int i = 0; i < 4; ++i) cuda_paged_batch_free(ctx, &pools[i]);
    if (stream) {
        kva_context_set_stream(ctx, NULL);
        cudaStreamDestroy(stream);
    }
    kva_context_destroy(ctx);
}

KVA_TEST(cuda_graph_replay_after_replanning) { graph_replay(KVA_DECODE_PARTIAL_ROWMAX, 32, 8, 128); }
KVA_TEST(cuda_graph_replay_global_rowmax) { graph_replay(KVA_DECODE_GLOBAL_ROWMAX, 32, 8, 128); }
KVA_TEST(cuda_graph_replay_group48_d80) { graph_replay(KVA_DECODE_PARTIAL_ROWMAX, 48, 1, 80); }
/* a group above 16 at a prefill head dim: on Hopper the decode plan runs on the prefill kernel
 * and the prefill merge (both read the plan's counts from the workspace when replayed) */
KVA_TEST(cuda_graph_replay_group71_d64) { graph_replay(KVA_DECODE_PARTIAL_ROWMAX, 71, 1, 64); }
/* Two KV heads per unit (d96 at 2 bytes on NHD pools), made to pair every plan: the captured
 * launch keeps its pair geometry through replays of split and unsplit plans. */
KVA_TEST(cuda_graph_replay_paired_heads_d96) {
    kva_test_env env;
    kva_test_env_set(&env, "KVA_DECODE_PAIR_HEADS", "1");
    graph_replay(KVA_DECODE_PARTIAL_ROWMAX, 32, 16, 96);
    kva_test_env_restore(&env);
}

#else
KVA_TEST(cuda_graph_replay_after_replanning) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_graph_replay_global_rowmax) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_graph_replay_group48_d80) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_graph_replay_group71_d64) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_graph_replay_paired_heads_d96) { kva_test_skip("no CUDA device"); }
#endif
