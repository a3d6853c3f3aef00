/* TEMPORARY stub, replaced by the cache manager's work. */
#include "../common/internal.h"
kva_status kva_block_table_to_csr(const int32_t *block_table, int32_t batch_size,
                                  int32_t max_blocks_per_seq, const int32_t *context_lens,
                                  int32_t page_size, int32_t *indptr_out, int32_t *indices_out,
                                  int32_t indices_capacity, int32_t *last_page_len_out) {
    (void)block_table; (void)batch_size; (void)max_blocks_per_seq; (void)context_lens;
    (void)page_size; (void)indptr_out; (void)indices_out; (void)indices_capacity; (void)last_page_len_out;
    return kva__fail(KVA_ERR_UNSUPPORTED, "not implemented yet");
}
