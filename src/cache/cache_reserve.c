/*
 * cache_reserve.c -- kva_cache_reserve: extend a batch of sequences by token slots, all or
 * nothing.
 *
 * Three passes so that a failure anywhere leaves the cache exactly as it was:
 *   1. count: fresh pages per sequence, plus one copy-on-write page for each sequence whose
 *      partly filled last page is still shared when its turn comes (counted exactly: when a
 *      parent and its fork both extend in one batch, the first copies and the second then owns
 *      the original page alone). Fail with KVA_ERR_NO_SPACE if the free stack is too short.
 *   2. prepare: grow page lists (host realloc) and copy the shared pages, every layer, into the
 *      pages the free stack will hand out next. Both are invisible until committed: the
 *      destination pages are still free, so a failing copy changes nothing.
 *   3. commit: take the pages, swap in the copies, drop references to the originals, append the
 *      fresh pages and advance the lengths. Nothing here can fail.
 */
#include "cache_internal.h"
#include "../cpu/cpu_backend.h"
#include "../cuda/cuda_backend.h"

static kva_status copy_pages_all_layers(kva_cache *c, int32_t n, const int32_t *src,
                                        const int32_t *dst) {
    for (int32_t layer = 0; layer < c->cfg.num_layers; ++layer) {
        kva_kv_pages pages;
        KVA_TRY(kva_cache_layer_pages(c, layer, &pages));
        if (c->ctx->device == KVA_DEVICE_CUDA)
            KVA_TRY(kva__cuda_copy_pages(c->ctx, &pages, n, src, dst));
        else
            KVA_TRY(kva__cpu_copy_pages(c->ctx, &pages, n, src, dst));
    }
    return KVA_OK;
}

kva_status kva_cache_reserve(kva_cache *c, int32_t n, const int32_t *seq_ids,
                             const int32_t *num_new) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_TRY(kva__cache_check_batch(c, n, seq_ids, "kva_cache_reserve"));
    if (n > 0 && !num_new) return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_reserve: num_new is NULL");
    const int32_t ps = c->cfg.page_size;

    /* 1. count */
    int64_t fresh = 0;
    for (int32_t i = 0; i < n; ++i) {
        const kva__cache_seq *s = &c->seqs[seq_ids[i]];
        if (num_new[i] < 0)
            return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_reserve: num_new[%d] = %d < 0", i,
                             num_new[i]);
        int64_t new_len = (int64_t)s->len + num_new[i];
        if (new_len > INT32_MAX)
            return kva__fail(KVA_ERR_OUT_OF_RANGE,
                             "kva_cache_reserve: sequence %d would hold %lld tokens (> 2^31 - 1)",
                             seq_ids[i], (long long)new_len);
        fresh += kva__ceil_div64(new_len, ps) - s->num_pages;
    }
    /* Copy-on-write candidates, in batch order. Each one's reference is dropped for the count
     * so a later sharer of the same page sees it as it will be; restored right after. */
    int32_t num_cow = 0;
    for (int32_t i = 0; i < n; ++i) {
        const kva__cache_seq *s = &c->seqs[seq_ids[i]];
        if (num_new[i] == 0 || s->len % ps == 0) continue;
        int32_t last = s->pages[s->num_pages - 1];
        if (c->refcount[last] < 2) continue;
        c->cow_src[num_cow] = last;
        c->cow_seq[num_cow] = i;
        ++num_cow;
        --c->refcount[last];
    }
    for (int32_t j = 0; j < num_cow; ++j) ++c->refcount[c->cow_src[j]];
    if (fresh + num_cow > c->num_free)
        return kva__fail(KVA_ERR_NO_SPACE,
                         "kva_cache_reserve: needs %lld pages (%d of them copy-on-write), %d free",
                         (long long)(fresh + num_cow), num_cow, c->num_free);

    /* 2. prepare */
    for (int32_t i = 0; i < n; ++i) {
        kva__cache_seq *s = &c->seqs[seq_ids[i]];
        KVA_TRY(kva__cache_seq_grow(c, s, (int32_t)kva__ceil_div64((int64_t)s->len + num_new[i], ps)));
    }
    for (int32_t j = 0; j < num_cow; ++j) c->cow_dst[j] = c->free_pages[c->num_free - 1 - j];
    if (num_cow > 0) KVA_TRY(copy_pages_all_layers(c, num_cow, c->cow_src, c->cow_dst));

    /* 3. commit */
    for (int32_t j = 0; j < num_cow; ++j) {
        kva__cache_seq *s = &c->seqs[seq_ids[c->cow_seq[j]]];
        s->pages[s->num_pages - 1] = kva__cache_page_take(c); /* == cow_dst[j] */
        kva__cache_page_unref(c, c->cow_src[j]);              /* stays >= 1: never freed here */
        ++c->cow_copies;
    }
    for (int32_t i = 0; i < n; ++i) {
        kva__cache_seq *s = &c->seqs[seq_ids[i]];
        s->len += num_new[i];
        int32_t need = (int32_t)kva__ceil_div64(s->len, ps);
        while (s->num_pages < need) s->pages[s->num_pages++] = kva__cache_page_take(c);
        c->num_tokens += num_new[i];
    }
    return KVA_OK;
}
