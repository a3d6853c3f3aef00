/*
 * cache_append.c -- kva_cache_append: write one layer's K/V rows into the last num_new[i] slots
 * of each sequence.
 *
 * The host turns (sequence, position) into pool slots (page * page_size + offset) in staging
 * sized at create, then one backend call scatters every row. All checks run first, including
 * that no written slot lies in a page another sequence also lists: after a fork the shared
 * pages hold both sequences' tokens, and only kva_cache_reserve (copy-on-write) may make the
 * tail private. Such an append is a caller bug (slots written that were not reserved after the
 * fork) and fails with KVA_ERR_BAD_STATE, writing nothing.
 */
#include "cache_internal.h"
#include "../api/validate.h"
#include "../cpu/cpu_backend.h"
#include "../cuda/cuda_backend.h"

kva_status kva_cache_append(kva_cache *c, int32_t layer, int32_t n, const int32_t *seq_ids,
                            const int32_t *num_new, kva_tensor k, kva_tensor v) {
    KVA_API("kva_cache_append"); /* kva__check_tensor's messages start with the public call */
    KVA__CACHE_CHECK_NULL(c);
    if (layer < 0 || layer >= c->cfg.num_layers)
        return kva__fail(KVA_ERR_OUT_OF_RANGE, "kva_cache_append: layer %d outside 0..%d", layer,
                         c->cfg.num_layers - 1);
    KVA_TRY(kva__cache_check_batch(c, n, seq_ids, "kva_cache_append"));
    if (n > 0 && !num_new) return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_append: num_new is NULL");

    int64_t total = 0;
    for (int32_t i = 0; i < n; ++i) {
        const kva__cache_seq *s = &c->seqs[seq_ids[i]];
        if (num_new[i] < 0)
            return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_append: num_new[%d] = %d < 0", i,
                             num_new[i]);
        if (num_new[i] > s->len)
            return kva__fail(KVA_ERR_OUT_OF_RANGE,
                             "kva_cache_append: num_new[%d] = %d but sequence %d holds %d slots "
                             "(reserve first)",
                             i, num_new[i], seq_ids[i], s->len);
        total += num_new[i];
    }
    if (total > c->cfg.max_append_tokens)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "kva_cache_append: %lld tokens, the cache was created for at most %d",
                         (long long)total, c->cfg.max_append_tokens);
    KVA_TRY(kva__check_tensor("k", k, c->cfg.dtype, total, c->cfg.num_kv_heads,
                              c->cfg.head_dim));
    KVA_TRY(kva__check_tensor("v", v, c->cfg.dtype, total, c->cfg.num_kv_heads,
                              c->cfg.head_dim));

    const int32_t ps = c->cfg.page_size;
    int64_t row = 0;
    for (int32_t i = 0; i < n; ++i) {
        const kva__cache_seq *s = &c->seqs[seq_ids[i]];
        for (int32_t pos = s->len - num_new[i]; pos < s->len; ++pos) {
            int32_t page = s->pages[pos / ps];
            if (c->refcount[page] > 1)
                return kva__fail(KVA_ERR_BAD_STATE,
                                 "kva_cache_append: position %d of sequence %d lies in page %d, "
                                 "shared with %d other sequence(s); reserve new slots after a fork "
                                 "instead of rewriting shared ones",
                                 pos, seq_ids[i], page, c->refcount[page] - 1);
            c->slots_host[row++] = (int64_t)page * ps + pos % ps;
        }
    }
    if (total == 0) return KVA_OK;

    kva_kv_pages pages;
    KVA_TRY(kva_cache_layer_pages(c, layer, &pages));
    if (c->ctx->device == KVA_DEVICE_CUDA)
        return kva__cuda_append(c->ctx, &pages, (int32_t)total, c->slots_host, c->slots_device, k,
                                v);
    return kva__cpu_append(c->ctx, &pages, (int32_t)total, c->slots_host, k, v);
}
