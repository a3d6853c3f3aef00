/*
 * test_threads.c -- several contexts used from several threads at once, as kvattn.h allows (one
 * context per calling thread; contexts independent). Each thread owns a context, a cache, a
 * workspace and its buffers, and runs append -> plan -> decode and dense attention repeatedly,
 * checking every result against the float64 reference and its own thread-local error message.
 * `make test-tsan` runs this under ThreadSanitizer (CPU). With a GPU, the CUDA half runs too:
 * one CUDA context per thread on device 0 (each on its own stream).
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TH_THREADS = 4, TH_ROUNDS = 6, TH_HQ = 4, TH_HK = 2, TH_D = 64, TH_PS = 8, TH_PAGES = 32,
       TH_SEQS = 3 };

typedef struct th_job {
    kva_device_type device;
    int index;
    uint64_t seed;
    int failures;
    char first_failure[256];
} th_job;

static void th_fail(th_job *j, const char *what) {
    if (j->failures++ == 0)
        snprintf(j->first_failure, sizeof j->first_failure, "thread %d: %s (%s)", j->index, what,
                 kva_last_error());
}

#define TH_TRY(j, expr)                                                                        \
    do {                                                                                       \
        if ((expr) != KVA_OK) {                                                                \
            th_fail(j, #expr);                                                                 \
            goto done;                                                                         \
        }                                                                                      \
    } while (0)

/* Host <-> device copies that are plain memcpy on the CPU. */
static void *th_device_copy(kva_context *ctx, const void *host, size_t bytes) {
    void *p = NULL;
    if (kva_malloc(ctx, bytes, &p) != KVA_OK) return NULL;
    kva_memcpy(ctx, p, host, bytes, KVA_COPY_HOST_TO_DEVICE);
    return p;
}

static void *th_main(void *arg) {
    th_job *j = arg;
    kva_rng rng;
    kva_rng_seed(&rng, j->seed);
    kva_context *ctx = NULL;
    kva_cache *cache = NULL;
    kva_workspace ws = {0};
    void *kd = NULL, *vd = NULL, *qd = NULL, *od = NULL;
    const size_t rows = TH_SEQS * 16, kv_elems = rows * TH_HK * TH_D;
    float *k = kva_test_alloc(kv_elems * sizeof(float)), *v = kva_test_alloc(kv_elems * sizeof(float));
    float *q = kva_test_alloc((size_t)TH_SEQS * TH_HQ * TH_D * sizeof(float));
    float *o = kva_test_alloc((size_t)TH_SEQS * TH_HQ * TH_D * sizeof(float));
    size_t pool_elems = (size_t)TH_PAGES * 2 * TH_PS * TH_HK * TH_D;
    float *pool_host = kva_test_alloc(pool_elems * sizeof(float));
    double *dk = kva_test_alloc(sizeof(double) * TH_PAGES * TH_PS * TH_HK * TH_D);
    double *dv = kva_test_alloc(sizeof(double) * TH_PAGES * TH_PS * TH_HK * TH_D);
    double dq[TH_HQ * TH_D], dout[TH_HQ * TH_D];

    TH_TRY(j, kva_context_create(j->device, 0, &ctx));
    if (j->device == KVA_DEVICE_CPU) TH_TRY(j, kva_context_set_threads(ctx, 1 + j->index % 2));
    kva_cache_config cc = {.num_layers = 1, .num_kv_heads = TH_HK, .head_dim = TH_D,
                           .page_size = TH_PS, .num_pages = TH_PAGES, .dtype = KVA_F32,
                           .layout = KVA_LAYOUT_NHD, .max_sequences = TH_SEQS,
                           .max_append_tokens = (int32_t)rows};
    TH_TRY(j, kva_cache_create(ctx, &cc, &cache));
    int32_t seq[TH_SEQS];
    for (int s = 0; s < TH_SEQS; ++s) TH_TRY(j, kva_cache_add_sequence(cache, &seq[s]));
    kva_plan_limits lim = {.max_batch = TH_SEQS, .max_total_pages = TH_PAGES,
                           .num_qo_heads = TH_HQ, .num_kv_heads = TH_HK, .head_dim = TH_D,
                           .page_size = TH_PS};
    TH_TRY(j, kva_decode_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes));
    TH_TRY(j, kva_malloc(ctx, ws.device_bytes, &ws.device));
    TH_TRY(j, kva_host_alloc(ctx, ws.host_bytes, &ws.host));
    TH_TRY(j, kva_malloc(ctx, (size_t)TH_SEQS * TH_HQ * TH_D * sizeof(float), &od));

    for (int round = 0; round < TH_ROUNDS; ++round) {
        /* grow each sequence by a few tokens, write them, plan, run */
        int32_t n_new[TH_SEQS], total = 0;
        for (int s = 0; s < TH_SEQS; ++s) total += n_new[s] = kva_rng_int(&rng, 1, 5);
        kva_fill_random(&rng, k, KVA_F32, (size_t)total * TH_HK * TH_D, -1, 1);
        kva_fill_random(&rng, v, KVA_F32, (size_t)total * TH_HK * TH_D, -1, 1);
        kva_fill_random(&rng, q, KVA_F32, (size_t)TH_SEQS * TH_HQ * TH_D, -1, 1);
        kva_free(ctx, kd), kva_free(ctx, vd), kva_free(ctx, qd);
        kd = th_device_copy(ctx, k, (size_t)total * TH_HK * TH_D * sizeof(float));
        vd = th_device_copy(ctx, v, (size_t)total * TH_HK * TH_D * sizeof(float));
        qd = th_device_copy(ctx, q, (size_t)TH_SEQS * TH_HQ * TH_D * sizeof(float));
        if (!kd || !vd || !qd) {
            th_fail(j, "device buffers");
            goto done;
        }
        TH_TRY(j, kva_cache_reserve(cache, TH_SEQS, seq, n_new));
        TH_TRY(j, kva_cache_append(cache, 0, TH_SEQS, seq, n_new,
                                   kva_tensor_nhd(kd, KVA_F32, TH_HK, TH_D),
                                   kva_tensor_nhd(vd, KVA_F32, TH_HK, TH_D)));
        int32_t indptr[TH_SEQS + 1], indices[TH_PAGES], last[TH_SEQS];
        kva_page_table table;
        TH_TRY(j, kva_cache_page_table(cache, TH_SEQS, seq, indptr, indices, TH_PAGES, last, &table));
        kva_plan plan;
        TH_TRY(j, kva_decode_plan(ctx, &lim, &table, TH_PAGES, NULL, ws, &plan));
        kva_kv_pages pages;
        TH_TRY(j, kva_cache_layer_pages(cache, 0, &pages));
        kva_attn_params p = kva_attn_params_default(TH_HQ, TH_HK, TH_D);
        TH_TRY(j, kva_decode_run(ctx, &plan, &p, kva_tensor_nhd(qd, KVA_F32, TH_HQ, TH_D), &pages,
                                 kva_tensor_nhd(od, KVA_F32, TH_HQ, TH_D), NULL));
        TH_TRY(j, kva_memcpy(ctx, o, od, (size_t)TH_SEQS * TH_HQ * TH_D * sizeof(float),
                             KVA_COPY_DEVICE_TO_HOST));
        /* reference: read the pool back to the host and gather each sequence */
        TH_TRY(j, kva_memcpy(ctx, pool_host, pages.k_data, pool_elems * sizeof(float),
                             KVA_COPY_DEVICE_TO_HOST));
        kva_kv_pages host_pages = pages;
        host_pages.k_data = pool_host;
        host_pages.v_data = pool_host + ((float *)pages.v_data - (float *)pages.k_data);
        for (int s = 0; s < TH_SEQS; ++s) {
            int32_t len = kva_ref_read_paged(&host_pages, &table, s, dk, dv);
            for (int i = 0; i < TH_HQ * TH_D; ++i) dq[i] = q[(size_t)s * TH_HQ * TH_D + i];
            kva_ref_attention(&p, 1, len, dq, dk, dv, dout, NULL);
            if (kva_compare("thread decode", o + (size_t)s * TH_HQ * TH_D, KVA_F32, dout,
                            TH_HQ * TH_D, kva_tol_for(KVA_F32), NULL) != 0)
                th_fail(j, "decode differs from the reference");
        }
        /* this thread's error message is its own */
        char want[64];
        snprintf(want, sizeof want, "page %d", 1000 + j->index);
        int32_t rc;
        if (kva_cache_page_refcount(cache, 1000 + j->index, &rc) != KVA_ERR_OUT_OF_RANGE ||
            !strstr(kva_last_error(), want))
            th_fail(j, "thread-local error message");
    }
done:
    kva_free(ctx, kd), kva_free(ctx, vd), kva_free(ctx, qd), kva_free(ctx, od);
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    free(k), free(v), free(q), free(o), free(pool_host), free(dk), free(dv);
    return NULL;
}

static void run_threads(kva_device_type device) {
    pthread_t t[TH_THREADS];
    th_job jobs[TH_THREADS];
    uint64_t seed = kva_test_seed();
    for (int i = 0; i < TH_THREADS; ++i) {
        jobs[i] = (th_job){.device = device, .index = i, .seed = seed + 7919u * (uint64_t)i};
        if (pthread_create(&t[i], NULL, th_main, &jobs[i]) != 0) {
            CHECK_MSG(0, "pthread_create");
            return;
        }
    }
    for (int i = 0; i < TH_THREADS; ++i) pthread_join(t[i], NULL);
    for (int i = 0; i < TH_THREADS; ++i)
        CHECK_MSG(jobs[i].failures == 0, "%d failures; first: %s", jobs[i].failures,
                  jobs[i].first_failure);
}

KVA_TEST(threads_cpu_contexts_in_parallel) { run_threads(KVA_DEVICE_CPU); }

KVA_TEST(threads_cuda_contexts_in_parallel) {
    if (!kva_cuda_available()) {
        kva_test_skip("no CUDA device");
        return;
    }
    run_threads(KVA_DEVICE_CUDA);
}
