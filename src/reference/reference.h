/*
 * reference.h -- the oracle: plain float64 C implementations of every operation, written for
 * clarity, never for speed. Used by the tests and by `kvattn check` / `kvattn run` verification,
 * never by the library. All arrays here are packed host arrays of doubles.
 */
#ifndef KVA_REFERENCE_H
#define KVA_REFERENCE_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Attention of one request, following the definition in kvattn.h (kva_attn_params).
 * q, o: [qo_len][num_qo_heads][head_dim]; k, v: [kv_len][num_kv_heads][head_dim];
 * lse: NULL or [qo_len][num_qo_heads] (natural log, -inf when no key is visible, o = 0 then). */
void kva_ref_attention(const kva_attn_params *p, int32_t qo_len, int32_t kv_len, const double *q,
                       const double *k, const double *v, double *o, double *lse);

/* Merge of num_states states per row: v [rows][states][D], lse [rows][states] ->
 * v_out [rows][D], lse_out [rows] (see kva_merge_states). */
void kva_ref_merge_states(int32_t num_rows, int32_t num_states, int32_t head_dim, const double *v,
                          const double *lse, double *v_out, double *lse_out);

/* Reads tokens [tok0, tok0 + ntok) x heads x D of a host-memory tensor view into doubles. */
void kva_ref_read_tensor(kva_tensor t, int64_t tok0, int64_t ntok, int32_t heads,
                         int32_t head_dim, double *out);

/* Gathers request b's keys and values from a host-memory page pool through a CSR page table:
 * k, v: [kv_len(b)][num_kv_heads][head_dim]. Returns kv_len(b). */
int32_t kva_ref_read_paged(const kva_kv_pages *pages, const kva_page_table *table, int32_t b,
                           double *k, double *v);

/* kv_len of request b of a page table. */
int32_t kva_ref_paged_len(const kva_page_table *table, int32_t page_size, int32_t b);

#ifdef __cplusplus
}
#endif
#endif
