/*
 * cache.c -- kva_cache lifecycle (create / destroy) and its read-only queries: statistics,
 * page reference counts, sequence lengths and per-layer pool views. See cache_internal.h for
 * the state and the conventions every entry point follows.
 */
#include "cache_internal.h"
#include "../cpu/cpu_backend.h"
#include "../cuda/cuda_backend.h"

#include <stdlib.h>
#include <string.h>

/* Slots start with this many page entries at least, so short sequences never grow. */
enum { KVA__CACHE_MIN_SEQ_CAPACITY = 4 };

static kva_status check_config(const kva_cache_config *c) {
    if (c->num_layers < 1 || c->num_kv_heads < 1 || c->head_dim < 1 || c->num_pages < 1 ||
        c->max_sequences < 1 || c->max_append_tokens < 1)
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "kva_cache_create: num_layers (%d), num_kv_heads (%d), head_dim (%d), "
                         "num_pages (%d), max_sequences (%d), max_append_tokens (%d) must be >= 1",
                         c->num_layers, c->num_kv_heads, c->head_dim, c->num_pages,
                         c->max_sequences, c->max_append_tokens);
    if (c->page_size < 1 || c->page_size > 65536)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_create: page_size %d outside 1..65536",
                         c->page_size);
    if (!kva__dtype_valid(c->dtype))
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_create: unknown dtype %d", (int)c->dtype);
    if (c->layout != KVA_LAYOUT_NHD && c->layout != KVA_LAYOUT_HND)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_create: unknown layout %d", (int)c->layout);
    /* Rows are moved as 16-byte vectors: every page, K/V half, head and token must start on a
     * 16-byte boundary, which holds for both layouts exactly when head_dim rows are 16 bytes. */
    int32_t vec = (int32_t)(16 / kva_dtype_size(c->dtype));
    if (c->head_dim % vec != 0)
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "kva_cache_create: head_dim %d must be a multiple of %d for %s", c->head_dim,
                         vec, kva_dtype_name(c->dtype));
    return KVA_OK;
}

/* Bytes of one layer's pool, or 0 if the pool (all layers) would not be addressable. */
static size_t layer_bytes_of(const kva_cache_config *c) {
    uint64_t elems = 2, bytes, total;
    if (__builtin_mul_overflow(elems, (uint64_t)c->page_size, &elems) ||
        __builtin_mul_overflow(elems, (uint64_t)c->num_kv_heads, &elems) ||
        __builtin_mul_overflow(elems, (uint64_t)c->head_dim, &elems) ||
        __builtin_mul_overflow(elems, (uint64_t)c->num_pages, &elems) ||
        __builtin_mul_overflow(elems, (uint64_t)kva_dtype_size(c->dtype), &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)c->num_layers, &total) ||
        total > (uint64_t)PTRDIFF_MAX)
        return 0;
    return (size_t)bytes;
}

kva_status kva_cache_create(kva_context *ctx, const kva_cache_config *config, kva_cache **out) {
    KVA_CHECK_NULL(out);
    *out = NULL;
    KVA_CHECK_NULL(ctx);
    KVA_CHECK_NULL(config);
    KVA_TRY(check_config(config));
    size_t layer_bytes = layer_bytes_of(config);
    if (layer_bytes == 0)
        return kva__fail(KVA_ERR_OUT_OF_MEMORY,
                         "kva_cache_create: a pool of %d layers x %d pages of %d x %d x %d is too "
                         "large to address",
                         config->num_layers, config->num_pages, config->page_size,
                         config->num_kv_heads, config->head_dim);

    kva_cache *c = calloc(1, sizeof *c);
    if (!c) return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_cache_create: out of host memory");
    c->ctx = ctx;
    ctx->live_caches += 1; /* released by kva_cache_destroy, even on the failure paths below */
    c->cfg = *config;
    c->layer_bytes = layer_bytes;

    const int32_t P = config->num_pages, S = config->max_sequences;
    c->free_pages = malloc((size_t)P * sizeof(int32_t));
    c->refcount = calloc((size_t)P, sizeof(int32_t));
    c->seqs = calloc((size_t)S, sizeof(kva__cache_seq));
    c->free_slots = malloc((size_t)S * sizeof(int32_t));
    c->slots_host = malloc((size_t)config->max_append_tokens * sizeof(int64_t));
    c->batch_stamp = calloc((size_t)S, sizeof(uint32_t));
    c->cow_src = malloc((size_t)S * sizeof(int32_t));
    c->cow_dst = malloc((size_t)S * sizeof(int32_t));
    c->cow_seq = malloc((size_t)S * sizeof(int32_t));
    bool ok = c->free_pages && c->refcount && c->seqs && c->free_slots && c->slots_host &&
              c->batch_stamp && c->cow_src && c->cow_dst && c->cow_seq;

    /* A fair share of the pool per slot: without forks, all sequences together then fit. */
    int32_t share = (int32_t)kva__ceil_div64(P, S);
    share = kva__min32(P, kva__max32(share, KVA__CACHE_MIN_SEQ_CAPACITY));
    for (int32_t s = 0; ok && s < S; ++s) {
        c->seqs[s].pages = malloc((size_t)share * sizeof(int32_t));
        c->seqs[s].capacity = share;
        ok = c->seqs[s].pages != NULL;
    }
    if (!ok) {
        kva_cache_destroy(c);
        return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_cache_create: out of host memory");
    }
    /* Stacks ordered so the first pages / ids handed out are 0, 1, 2, ... */
    for (int32_t i = 0; i < P; ++i) c->free_pages[i] = P - 1 - i;
    c->num_free = P;
    for (int32_t i = 0; i < S; ++i) c->free_slots[i] = S - 1 - i;
    c->num_free_slots = S;

    kva_status st = kva_malloc(ctx, layer_bytes * (size_t)config->num_layers, &c->pool);
    if (st == KVA_OK && ctx->device == KVA_DEVICE_CUDA)
        st = kva__cuda_malloc(ctx, (size_t)config->max_append_tokens * sizeof(int64_t),
                              (void **)&c->slots_device);
    if (st != KVA_OK) {
        kva_cache_destroy(c);
        return st;
    }
    *out = c;
    return KVA_OK;
}

void kva_cache_destroy(kva_cache *c) {
    if (!c) return;
    if (c->seqs)
        for (int32_t s = 0; s < c->cfg.max_sequences; ++s) free(c->seqs[s].pages);
    free(c->seqs);
    free(c->free_pages);
    free(c->refcount);
    free(c->free_slots);
    free(c->slots_host);
    free(c->batch_stamp);
    free(c->cow_src);
    free(c->cow_dst);
    free(c->cow_seq);
    kva_free(c->ctx, c->pool);
    if (c->slots_device) kva__cuda_free(c->ctx, c->slots_device);
    kva_context *ctx = c->ctx;
    free(c);
    kva__context_cache_released(ctx);
}

kva_status kva_cache_prefault(kva_cache *c) {
    KVA__CACHE_CHECK_NULL(c);
    const size_t bytes = c->layer_bytes * (size_t)c->cfg.num_layers;
    if (c->ctx->device == KVA_DEVICE_CPU && bytes > 0) kva__cpu_prefault(c->ctx, c->pool, bytes);
    return KVA_OK;
}

kva_status kva__cache_check_batch(kva_cache *c, int32_t n, const int32_t *ids, const char *what) {
    if (n < 0) return kva__fail(KVA_ERR_INVALID_ARG, "%s: n = %d < 0", what, n);
    if (n > 0 && !ids) return kva__fail(KVA_ERR_INVALID_ARG, "%s: seq_ids is NULL", what);
    /* A fresh stamp marks the ids of this batch; the array is cleared only on wrap-around. */
    if (++c->stamp == 0) {
        memset(c->batch_stamp, 0, (size_t)c->cfg.max_sequences * sizeof(uint32_t));
        c->stamp = 1;
    }
    for (int32_t i = 0; i < n; ++i) {
        KVA_TRY(kva__cache_check_seq(c, ids[i], what));
        if (c->batch_stamp[ids[i]] == c->stamp)
            return kva__fail(KVA_ERR_INVALID_ARG, "%s: sequence %d appears twice in the batch",
                             what, ids[i]);
        c->batch_stamp[ids[i]] = c->stamp;
    }
    return KVA_OK;
}

kva_status kva__cache_seq_grow(kva_cache *c, kva__cache_seq *s, int32_t need) {
    if (need <= s->capacity) return KVA_OK;
    int64_t cap = (int64_t)s->capacity * 2;
    if (cap < need) cap = need;
    if (cap > c->cfg.num_pages) cap = c->cfg.num_pages;
    int32_t *p = realloc(s->pages, (size_t)cap * sizeof(int32_t));
    if (!p)
        return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_cache: cannot grow a page list to %lld entries",
                         (long long)cap);
    s->pages = p;
    s->capacity = (int32_t)cap;
    return KVA_OK;
}

kva_status kva_cache_seq_len(const kva_cache *c, int32_t seq_id, int32_t *len) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_CHECK_NULL(len);
    KVA_TRY(kva__cache_check_seq(c, seq_id, "kva_cache_seq_len"));
    *len = c->seqs[seq_id].len;
    return KVA_OK;
}

kva_status kva_cache_layer_pages(const kva_cache *c, int32_t layer, kva_kv_pages *pages) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_CHECK_NULL(pages);
    if (layer < 0 || layer >= c->cfg.num_layers)
        return kva__fail(KVA_ERR_OUT_OF_RANGE, "kva_cache_layer_pages: layer %d outside 0..%d",
                         layer, c->cfg.num_layers - 1);
    void *base = (unsigned char *)c->pool + (size_t)layer * c->layer_bytes;
    *pages = kva_kv_pages_interleaved(base, c->cfg.dtype, c->cfg.num_pages, c->cfg.page_size,
                                      c->cfg.num_kv_heads, c->cfg.head_dim, c->cfg.layout);
    return KVA_OK;
}

kva_status kva_cache_get_stats(const kva_cache *c, kva_cache_stats *stats) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_CHECK_NULL(stats);
    memset(stats, 0, sizeof *stats);
    stats->num_pages = c->cfg.num_pages;
    stats->free_pages = c->num_free;
    stats->used_pages = c->cfg.num_pages - c->num_free;
    stats->shared_pages = c->shared_pages;
    stats->peak_used_pages = c->peak_used_pages;
    stats->num_sequences = c->cfg.max_sequences - c->num_free_slots;
    stats->num_tokens = c->num_tokens;
    stats->cow_copies = c->cow_copies;
    return KVA_OK;
}

kva_status kva_cache_page_refcount(const kva_cache *c, int32_t page, int32_t *refcount) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_CHECK_NULL(refcount);
    if (page < 0 || page >= c->cfg.num_pages)
        return kva__fail(KVA_ERR_OUT_OF_RANGE, "kva_cache_page_refcount: page %d outside 0..%d",
                         page, c->cfg.num_pages - 1);
    *refcount = c->refcount[page];
    return KVA_OK;
}
