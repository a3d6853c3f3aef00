/* cuda_stub.c -- the CUDA backend's entry points for builds without CUDA: each says so. */
#include "cuda_backend.h"
#include "../common/internal.h"

#define NOT_BUILT() kva__fail(KVA_ERR_NOT_BUILT, "%s: kvattn was built without CUDA", __func__)

int kva__cuda_device_count(void) { return 0; }
/* (reached from kva_context_create only: the other entry points need a CUDA context) */
kva_status kva__cuda_context_init(kva_context *ctx) {
    (void)ctx;
    return kva__fail(KVA_ERR_NOT_BUILT, "kva_context_create: device KVA_DEVICE_CUDA: kvattn was built without CUDA");
}
void kva__cuda_context_destroy(kva_context *ctx) { (void)ctx; }
kva_status kva__cuda_malloc(kva_context *ctx, size_t bytes, void **ptr) {
    (void)ctx; (void)bytes; (void)ptr; return NOT_BUILT();
}
void kva__cuda_free(kva_context *ctx, void *ptr) { (void)ctx; (void)ptr; }
kva_status kva__cuda_host_alloc(kva_context *ctx, size_t bytes, void **ptr) {
    (void)ctx; (void)bytes; (void)ptr; return NOT_BUILT();
}
void kva__cuda_host_free(kva_context *ctx, void *ptr) { (void)ctx; (void)ptr; }
kva_status kva__cuda_memcpy(kva_context *ctx, void *dst, const void *src, size_t bytes,
                            kva_copy_kind kind) {
    (void)ctx; (void)dst; (void)src; (void)bytes; (void)kind; return NOT_BUILT();
}
kva_status kva__cuda_memset_async(kva_context *ctx, void *dst, int value, size_t bytes) {
    (void)ctx; (void)dst; (void)value; (void)bytes; return NOT_BUILT();
}
kva_status kva__cuda_synchronize(kva_context *ctx) { (void)ctx; return NOT_BUILT(); }
kva_status kva__cuda_free_memory(kva_context *ctx, size_t *free_bytes) {
    (void)ctx; (void)free_bytes; return NOT_BUILT();
}
kva_status kva__cuda_plan_begin(kva_context *ctx, const void *host_part) {
    (void)ctx; (void)host_part; return NOT_BUILT();
}
kva_status kva__cuda_plan_upload(kva_context *ctx, void *device_part, const void *host_part,
                                 size_t bytes) {
    (void)ctx; (void)device_part; (void)host_part; (void)bytes; return NOT_BUILT();
}
bool kva__cuda_decode_supported(const kva_context *ctx, kva_dtype dtype, int32_t head_dim,
                                int32_t group) {
    (void)ctx; (void)dtype; (void)head_dim; (void)group; return false;
}
int kva__cuda_decode_blocks_per_sm(const kva_context *ctx, kva_dtype dtype, int32_t head_dim, int32_t group,
                                   int32_t *nsub) {
    (void)ctx; (void)dtype; (void)head_dim; (void)group; (void)nsub; return 0;
}
bool kva__cuda_decode_pairs_heads(const kva_context *ctx, kva_dtype dtype, int32_t head_dim, int32_t group,
                                  int32_t num_kv_heads, int64_t stride_head, int split) {
    (void)ctx; (void)dtype; (void)head_dim; (void)group; (void)num_kv_heads; (void)stride_head; (void)split;
    return false;
}
kva_status kva__cuda_decode_merge_withdrawals(const kva_context *ctx, uint64_t *count) {
    (void)ctx; if (count) *count = 0; return NOT_BUILT();
}
kva_status kva__cuda_decode_run(kva_context *ctx, const kva_plan *plan,
                                const kva_attn_params *params, kva_tensor q,
                                const kva_kv_pages *pages, kva_tensor o, float *lse) {
    (void)ctx; (void)plan; (void)params; (void)q; (void)pages; (void)o; (void)lse;
    return NOT_BUILT();
}
kva_status kva__cuda_prefill_run(kva_context *ctx, const kva_plan *plan,
                                 const kva_attn_params *params, kva_tensor q, kva_tensor k,
                                 kva_tensor v, const kva_kv_pages *pages, kva_tensor o, float *lse) {
    (void)ctx; (void)plan; (void)params; (void)q; (void)k; (void)v; (void)pages; (void)o; (void)lse;
    return NOT_BUILT();
}
kva_status kva__cuda_attention(kva_context *ctx, const kva_attn_params *params, int32_t qo_len,
                               int32_t kv_len, kva_tensor q, kva_tensor k, kva_tensor v,
                               kva_tensor o, float *lse) {
    (void)ctx; (void)params; (void)qo_len; (void)kv_len; (void)q; (void)k; (void)v; (void)o;
    (void)lse;
    return NOT_BUILT();
}
kva_status kva__cuda_merge_states(kva_context *ctx, int32_t num_rows, int32_t num_states,
                                  int32_t head_dim, kva_dtype dtype, const void *v_in,
                                  const float *lse_in, void *v_out, float *lse_out) {
    (void)ctx; (void)num_rows; (void)num_states; (void)head_dim; (void)dtype; (void)v_in;
    (void)lse_in; (void)v_out; (void)lse_out;
    return NOT_BUILT();
}
kva_status kva__cuda_append(kva_context *ctx, const kva_kv_pages *pages, int32_t num_tokens,
                            const int64_t *slots_host, int64_t *slots_dev, kva_tensor k,
                            kva_tensor v) {
    (void)ctx; (void)pages; (void)num_tokens; (void)slots_host; (void)slots_dev; (void)k; (void)v;
    return NOT_BUILT();
}
kva_status kva__cuda_copy_pages(kva_context *ctx, const kva_kv_pages *pages, int32_t n,
                                const int32_t *src, const int32_t *dst) {
    (void)ctx; (void)pages; (void)n; (void)src; (void)dst; return NOT_BUILT();
}
kva_status kva__cuda_split_policy(const kva_context *ctx, const kva_plan_limits *limits, int kind,
                                  kva__split_policy *policy) {
    (void)ctx; (void)limits; (void)kind; (void)policy; return NOT_BUILT();
}
kva_status kva__cuda_variant_create(kva_context *ctx, const char *api, const char *source,
                                    const char *function, const kva_variant_options *options,
                                    kva_variant **out) {
    (void)ctx; (void)source; (void)function; (void)options; (void)out;
    return kva__fail(KVA_ERR_NOT_BUILT, "%s: kvattn was built without CUDA", api);
}
void kva__cuda_variant_destroy(kva_variant *variant) { (void)variant; }
