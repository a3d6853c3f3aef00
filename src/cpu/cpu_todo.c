/* cpu_todo.c -- TEMPORARY: stubs for CPU backend entry points not yet written. Each helper
 * deletes the stubs it implements; this file goes away when all are done. */
#include "cpu_backend.h"
#include "../common/internal.h"

#define TODO() kva__fail(KVA_ERR_UNSUPPORTED, "%s: not implemented yet", __func__)

kva_status kva__cpu_attention(kva_context *ctx, const kva_attn_params *params, int32_t qo_len,
                              int32_t kv_len, kva_tensor q, kva_tensor k, kva_tensor v,
                              kva_tensor o, float *lse) {
    (void)ctx; (void)params; (void)qo_len; (void)kv_len; (void)q; (void)k; (void)v; (void)o; (void)lse;
    return TODO();
}
kva_status kva__cpu_decode_run(kva_context *ctx, const kva_plan *plan,
                               const kva_attn_params *params, kva_tensor q,
                               const kva_kv_pages *pages, kva_tensor o, float *lse) {
    (void)ctx; (void)plan; (void)params; (void)q; (void)pages; (void)o; (void)lse;
    return TODO();
}
kva_status kva__cpu_prefill_run_ragged(kva_context *ctx, const kva_plan *plan,
                                       const kva_attn_params *params, kva_tensor q, kva_tensor k,
                                       kva_tensor v, kva_tensor o, float *lse) {
    (void)ctx; (void)plan; (void)params; (void)q; (void)k; (void)v; (void)o; (void)lse;
    return TODO();
}
kva_status kva__cpu_prefill_run_paged(kva_context *ctx, const kva_plan *plan,
                                      const kva_attn_params *params, kva_tensor q,
                                      const kva_kv_pages *pages, kva_tensor o, float *lse) {
    (void)ctx; (void)plan; (void)params; (void)q; (void)pages; (void)o; (void)lse;
    return TODO();
}
kva_status kva__cpu_merge_states(kva_context *ctx, int32_t num_rows, int32_t num_states,
                                 int32_t head_dim, kva_dtype dtype, const void *v_in,
                                 const float *lse_in, void *v_out, float *lse_out) {
    (void)ctx; (void)num_rows; (void)num_states; (void)head_dim; (void)dtype; (void)v_in;
    (void)lse_in; (void)v_out; (void)lse_out;
    return TODO();
}
kva_status kva__cpu_append(kva_context *ctx, const kva_kv_pages *pages, int32_t num_tokens,
                           const int64_t *slots, kva_tensor k, kva_tensor v) {
    (void)ctx; (void)pages; (void)num_tokens; (void)slots; (void)k; (void)v;
    return TODO();
}
kva_status kva__cpu_copy_pages(kva_context *ctx, const kva_kv_pages *pages, int32_t n,
                               const int32_t *src, const int32_t *dst) {
    (void)ctx; (void)pages; (void)n; (void)src; (void)dst;
    return TODO();
}
