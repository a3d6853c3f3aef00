/*
 * block_table.c -- kva_block_table_to_csr: a dense vLLM-style block table (one row of page ids
 * per request, padded to max_blocks_per_seq) plus context lengths, turned into the CSR page
 * table the planners take. Everything is checked before the first output is written, so a
 * failing call leaves the caller's arrays as they were. Page ids are checked only for sign here;
 * the planners check them against the pool size.
 */
#include "../common/internal.h"

kva_status kva_block_table_to_csr(const int32_t *block_table, int32_t batch_size,
                                  int32_t max_blocks_per_seq, const int32_t *context_lens,
                                  int32_t page_size, int32_t *indptr_out, int32_t *indices_out,
                                  int32_t indices_capacity, int32_t *last_page_len_out) {
    KVA_CHECK_NULL(indptr_out);
    if (batch_size < 0 || max_blocks_per_seq < 0 || indices_capacity < 0)
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "kva_block_table_to_csr: batch_size (%d), max_blocks_per_seq (%d) and "
                         "indices_capacity (%d) must be >= 0",
                         batch_size, max_blocks_per_seq, indices_capacity);
    if (page_size < 1 || page_size > 65536)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_block_table_to_csr: page_size %d outside 1..65536",
                         page_size);
    if (batch_size > 0 && (!context_lens || !last_page_len_out))
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "kva_block_table_to_csr: context_lens / last_page_len_out is NULL");

    int64_t total = 0;
    for (int32_t b = 0; b < batch_size; ++b) {
        if (context_lens[b] < 0)
            return kva__fail(KVA_ERR_INVALID_ARG, "kva_block_table_to_csr: context_lens[%d] = %d < 0",
                             b, context_lens[b]);
        int64_t blocks = kva__ceil_div64(context_lens[b], page_size);
        if (blocks > max_blocks_per_seq)
            return kva__fail(KVA_ERR_OUT_OF_RANGE,
                             "kva_block_table_to_csr: request %d has %d tokens = %lld blocks of %d, "
                             "its row holds %d",
                             b, context_lens[b], (long long)blocks, page_size, max_blocks_per_seq);
        if (blocks == 0) continue;
        if (!block_table)
            return kva__fail(KVA_ERR_INVALID_ARG, "kva_block_table_to_csr: block_table is NULL");
        const int32_t *row = block_table + (size_t)b * (size_t)max_blocks_per_seq;
        for (int64_t j = 0; j < blocks; ++j)
            if (row[j] < 0)
                return kva__fail(KVA_ERR_OUT_OF_RANGE,
                                 "kva_block_table_to_csr: block_table[%d][%lld] = %d < 0", b,
                                 (long long)j, row[j]);
        total += blocks;
    }
    if (total > indices_capacity)
        return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "kva_block_table_to_csr: %lld page ids, indices_out holds %d",
                         (long long)total, indices_capacity);
    if (total > 0 && !indices_out)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_block_table_to_csr: indices_out is NULL");

    int32_t at = 0;
    indptr_out[0] = 0;
    for (int32_t b = 0; b < batch_size; ++b) {
        int32_t blocks = (int32_t)kva__ceil_div64(context_lens[b], page_size);
        for (int32_t j = 0; j < blocks; ++j)
            indices_out[at++] = block_table[(size_t)b * (size_t)max_blocks_per_seq + (size_t)j];
        indptr_out[b + 1] = at;
        last_page_len_out[b] = blocks == 0 ? 0 : context_lens[b] - (blocks - 1) * page_size;
    }
    return KVA_OK;
}
