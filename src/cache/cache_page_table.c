/*
 * cache_page_table.c -- kva_cache_page_table: the CSR page table (indptr, indices,
 * last_page_len) of a batch of sequences, written into caller arrays for the planners.
 * A batch may name a sequence more than once (each occurrence is one request); nothing is
 * written unless the whole table fits.
 */
#include "cache_internal.h"

kva_status kva_cache_page_table(const kva_cache *c, int32_t n, const int32_t *seq_ids,
                                int32_t *indptr, int32_t *indices, int32_t indices_capacity,
                                int32_t *last_page_len, kva_page_table *table) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_CHECK_NULL(indptr);
    if (n < 0) return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_page_table: n = %d < 0", n);
    if (n > 0 && (!seq_ids || !last_page_len))
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_page_table: seq_ids / last_page_len is NULL");
    if (indices_capacity < 0)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_page_table: indices_capacity %d < 0",
                         indices_capacity);
    int64_t total = 0;
    for (int32_t i = 0; i < n; ++i) {
        KVA_TRY(kva__cache_check_seq(c, seq_ids[i], "kva_cache_page_table"));
        total += c->seqs[seq_ids[i]].num_pages;
    }
    if (total > indices_capacity)
        return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "kva_cache_page_table: %lld page ids, indices holds %d", (long long)total,
                         indices_capacity);
    if (total > 0 && !indices)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_cache_page_table: indices is NULL");

    const int32_t ps = c->cfg.page_size;
    int32_t at = 0;
    indptr[0] = 0;
    for (int32_t i = 0; i < n; ++i) {
        const kva__cache_seq *s = &c->seqs[seq_ids[i]];
        for (int32_t p = 0; p < s->num_pages; ++p) indices[at++] = s->pages[p];
        indptr[i + 1] = at;
        /* A sequence without pages has length 0; the table's contract allows 0 here. */
        last_page_len[i] = s->num_pages == 0 ? 0 : s->len - (s->num_pages - 1) * ps;
    }
    if (table) {
        table->batch_size = n;
        table->indptr = indptr;
        table->indices = indices;
        table->last_page_len = last_page_len;
    }
    return KVA_OK;
}
