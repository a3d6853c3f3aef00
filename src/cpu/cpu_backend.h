/*
 * cpu_backend.h -- entry points of the CPU backend. The API layer (src/api) has already
 * validated every argument (shapes, strides, dtypes, plan kind and geometry) before these run,
 * so they only compute. Plans live in plan->workspace.host / .device (both host memory here).
 */
#ifndef KVA_CPU_BACKEND_H
#define KVA_CPU_BACKEND_H

#include "kvattn.h"
#include "../plan/workspace_layout.h"

/* Scratch bytes one worker thread needs (allocated once per context). */
size_t kva__cpu_scratch_bytes_per_thread(void);

kva_status kva__cpu_attention(kva_context *ctx, const kva_attn_params *params, int32_t qo_len,
                              int32_t kv_len, kva_tensor q, kva_tensor k, kva_tensor v,
                              kva_tensor o, float *lse);

kva_status kva__cpu_decode_run(kva_context *ctx, const kva_plan *plan,
                               const kva_attn_params *params, kva_tensor q,
                               const kva_kv_pages *pages, kva_tensor o, float *lse);

kva_status kva__cpu_prefill_run_ragged(kva_context *ctx, const kva_plan *plan,
                                       const kva_attn_params *params, kva_tensor q, kva_tensor k,
                                       kva_tensor v, kva_tensor o, float *lse);

kva_status kva__cpu_prefill_run_paged(kva_context *ctx, const kva_plan *plan,
                                      const kva_attn_params *params, kva_tensor q,
                                      const kva_kv_pages *pages, kva_tensor o, float *lse);

kva_status kva__cpu_merge_states(kva_context *ctx, int32_t num_rows, int32_t num_states,
                                 int32_t head_dim, kva_dtype dtype, const void *v_in,
                                 const float *lse_in, void *v_out, float *lse_out);

/* Writes num_tokens rows of k/v ([num_tokens, kv_heads, D]) into the pool at the given slots
 * (slot = page * page_size + offset in page). */
kva_status kva__cpu_append(kva_context *ctx, const kva_kv_pages *pages, int32_t num_tokens,
                           const int64_t *slots, kva_tensor k, kva_tensor v);

/* Copies whole pages src[i] -> dst[i] of one layer's pool (copy-on-write). */
kva_status kva__cpu_copy_pages(kva_context *ctx, const kva_kv_pages *pages, int32_t n,
                               const int32_t *src, const int32_t *dst);

/* Makes bytes at p resident (faults every page in) with the context's threads, without changing
 * a byte (kva_cache_prefault). bytes > 0. */
void kva__cpu_prefault(kva_context *ctx, void *p, size_t bytes);

#endif /* KVA_CPU_BACKEND_H */
