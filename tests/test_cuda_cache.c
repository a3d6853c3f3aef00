/*
 * test_cuda_cache.c -- the KV-cache manager on a CUDA context: prompts appended in one batch
 * (the append kernel scatters rows into device pages), a fork whose shared partial last page is
 * copied on write (the page-copy kernel), decode steps appending one token per sequence, then a
 * GPU decode of every sequence and layer compared against the float64 reference over host
 * mirrors of what was appended. Both page layouts, two page sizes.
 */
#include "harness.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "../src/common/dtype_convert.h"
#include "../src/reference/reference.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SEQ 4
#define MAX_TOK 80
#define LAYERS 2

typedef struct mirror {
    int32_t len;
    double *k[LAYERS], *v[LAYERS]; /* [MAX_TOK][Hk][D] */
} mirror;

/* Appends num_new[i] random rows per sequence to layer `layer` of the cache and the mirrors. */
static void append_rows(kva_context *ctx, kva_cache *cache, kva_rng *rng, kva_dtype dt, int32_t Hk,
                        int32_t D, int32_t n, const int32_t *ids, const int32_t *num_new,
                        mirror *mir, int layer) {
    int32_t total = 0;
    for (int32_t i = 0; i < n; ++i) total += num_new[i];
    const size_t row = (size_t)Hk * D, es = kva_dtype_size(dt);
    void *kh = kva_test_alloc(total * row * es), *vh = kva_test_alloc(total * row * es);
    kva_fill_random(rng, kh, dt, total * row, -1.f, 1.f);
    kva_fill_random(rng, vh, dt, total * row, -1.f, 1.f);
    void *kd = cuda_test_upload(ctx, kh, total * row * es), *vd = cuda_test_upload(ctx, vh, total * row * es);
    CHECK_OK(kva_cache_append(cache, layer, n, ids, num_new, kva_tensor_nhd(kd, dt, Hk, D),
                              kva_tensor_nhd(vd, dt, Hk, D)));
    int32_t r = 0;
    for (int32_t i = 0; i < n; ++i) {
        mirror *m = &mir[ids[i]];
        int32_t first = m->len - num_new[i]; /* mirrors' lengths were advanced at reserve */
        for (int32_t t = 0; t < num_new[i]; ++t, ++r)
            for (size_t e = 0; e < row; ++e) {
                m->k[layer][(size_t)(first + t) * row + e] = kva__load_f32(kh, dt, (int64_t)(r * row + e));
                m->v[layer][(size_t)(first + t) * row + e] = kva__load_f32(vh, dt, (int64_t)(r * row + e));
            }
    }
    CHECK_OK(kva_synchronize(ctx));
    kva_free(ctx, kd);
    kva_free(ctx, vd);
    free(kh);
    free(vh);
}

static void reserve(kva_cache *cache, int32_t n, const int32_t *ids, const int32_t *num_new, mirror *mir) {
    CHECK_OK(kva_cache_reserve(cache, n, ids, num_new));
    for (int32_t i = 0; i < n; ++i) mir[ids[i]].len += num_new[i];
}

static void cache_case(kva_context *ctx, kva_rng *rng, kva_layout layout, int32_t ps) {
    const kva_dtype dt = KVA_BF16;
    const int32_t Hk = 2, Hq = 8, D = 64;
    kva_cache_config cfg = {LAYERS, Hk, D, ps, 64, dt, layout, MAX_SEQ, 64};
    kva_cache *cache = NULL;
    mirror mir[MAX_SEQ];
    memset(mir, 0, sizeof mir);
    for (int s = 0; s < MAX_SEQ; ++s)
        for (int l = 0; l < LAYERS; ++l) {
            mir[s].k[l] = kva_test_alloc(sizeof(double) * MAX_TOK * Hk * D);
            mir[s].v[l] = kva_test_alloc(sizeof(double) * MAX_TOK * Hk * D);
        }
    kva_status st = kva_cache_create(ctx, &cfg, &cache);
    CHECK_OK(st);
    if (st != KVA_OK) goto out;

    int32_t ids[MAX_SEQ];
    for (int i = 0; i < 3; ++i) CHECK_OK(kva_cache_add_sequence(cache, &ids[i]));
    const int32_t prompt[3] = {37, ps, 5};
    reserve(cache, 3, ids, prompt, mir);
    for (int l = 0; l < LAYERS; ++l) append_rows(ctx, cache, rng, dt, Hk, D, 3, ids, prompt, mir, l);
    CHECK_OK(kva_cache_prefault(cache)); /* (device memory: nothing to do; the rows must survive it) */

    /* Fork sequence 0 (partial last page shared), then a few decode steps for all four. */
    CHECK_OK(kva_cache_fork(cache, ids[0], &ids[3]));
    mir[ids[3]].len = mir[ids[0]].len;
    for (int l = 0; l < LAYERS; ++l) {
        memcpy(mir[ids[3]].k[l], mir[ids[0]].k[l], sizeof(double) * MAX_TOK * Hk * D);
        memcpy(mir[ids[3]].v[l], mir[ids[0]].v[l], sizeof(double) * MAX_TOK * Hk * D);
    }
    const int32_t one[MAX_SEQ] = {1, 1, 1, 1};
    for (int step = 0; step < 3; ++step) {
        reserve(cache, MAX_SEQ, ids, one, mir);
        for (int l = 0; l < LAYERS; ++l) append_rows(ctx, cache, rng, dt, Hk, D, MAX_SEQ, ids, one, mir, l);
    }
    kva_cache_stats stats;
    CHECK_OK(kva_cache_get_stats(cache, &stats));
    CHECK_MSG(stats.cow_copies >= 1, "expected a copy-on-write, got %lld", (long long)stats.cow_copies);

    /* Decode every sequence of every layer on the GPU. */
    int32_t indptr[MAX_SEQ + 1], indices[64], last[MAX_SEQ];
    kva_page_table table;
    CHECK_OK(kva_cache_page_table(cache, MAX_SEQ, ids, indptr, indices, 64, last, &table));
    kva_plan_limits lim = {MAX_SEQ, 64, 0, 0, Hq, Hk, D, ps, 0};
    cuda_test_workspace w;
    if (!cuda_test_workspace_make(ctx, &lim, &w)) goto out;
    kva_plan plan;
    CHECK_OK(kva_decode_plan(ctx, &lim, &table, cfg.num_pages, NULL, w.ws, &plan));
    const size_t nq = (size_t)MAX_SEQ * Hq * D;
    void *qh = kva_test_alloc(nq * 2);
    kva_fill_random(rng, qh, dt, nq, -1.f, 1.f);
    void *q = cuda_test_upload(ctx, qh, nq * 2);
    double *qd = kva_test_alloc(sizeof(double) * nq), *o_ref = kva_test_alloc(sizeof(double) * nq);
    for (size_t i = 0; i < nq; ++i) qd[i] = kva__load_f32(qh, dt, (int64_t)i);
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D);
    for (int l = 0; l < LAYERS; ++l) {
        kva_kv_pages pages;
        CHECK_OK(kva_cache_layer_pages(cache, l, &pages));
        void *o = cuda_test_poisoned(ctx, nq * 2);
        CHECK_OK(kva_decode_run(ctx, &plan, &p, kva_tensor_nhd(q, dt, Hq, D), &pages,
                                kva_tensor_nhd(o, dt, Hq, D), NULL));
        void *oh = cuda_test_download(ctx, o, nq * 2);
        for (int s = 0; s < MAX_SEQ; ++s) {
            const mirror *m = &mir[ids[s]];
            kva_ref_attention(&p, 1, m->len, qd + (size_t)s * Hq * D, m->k[l], m->v[l],
                              o_ref + (size_t)s * Hq * D, NULL);
        }
        int before = kva_test_failures;
        kva_compare("cache decode o", oh, dt, o_ref, nq, kva_tol_for(dt), NULL);
        if (kva_test_failures != before)
            printf("    layout %s, page size %d, layer %d\n", layout == KVA_LAYOUT_HND ? "HND" : "NHD", ps, l);
        free(oh);
        kva_free(ctx, o);
    }
    free(qh);
    free(qd);
    free(o_ref);
    kva_free(ctx, q);
    cuda_test_workspace_free(ctx, &w);
out:
    kva_cache_destroy(cache);
    for (int s = 0; s < MAX_SEQ; ++s)
        for (int l = 0; l < LAYERS; ++l) {
            free(mir[s].k[l]);
            free(mir[s].v[l]);
        }
}

KVA_TEST(cuda_cache_append_fork_decode_matches_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    cache_case(ctx, &rng, KVA_LAYOUT_NHD, 16);
    cache_case(ctx, &rng, KVA_LAYOUT_HND, 3);
    kva_context_destroy(ctx);
}
