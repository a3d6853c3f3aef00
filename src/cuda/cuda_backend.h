/*
 * cuda_backend.h -- entry points of the CUDA backend, callable from C. Implemented in the .cu files of src/cuda
 * when the build has CUDA (KVA_HAVE_CUDA), and by cuda_stub.c (returning KVA_ERR_NOT_BUILT)
 * otherwise. Arguments are validated by src/api before these run. Every call enqueues on
 * ctx->stream and never allocates, except the *_init / malloc family.
 */
#ifndef KVA_CUDA_BACKEND_H
#define KVA_CUDA_BACKEND_H

#include "kvattn.h"
#include <stdbool.h>
#include "../plan/workspace_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

int kva__cuda_device_count(void);
/* Fills ctx->num_sms, l2_bytes, total_memory, name; sets the device; creates private state. */
kva_status kva__cuda_context_init(kva_context *ctx);
void kva__cuda_context_destroy(kva_context *ctx);

kva_status kva__cuda_malloc(kva_context *ctx, size_t bytes, void **ptr);
void kva__cuda_free(kva_context *ctx, void *ptr);
kva_status kva__cuda_host_alloc(kva_context *ctx, size_t bytes, void **ptr);
void kva__cuda_host_free(kva_context *ctx, void *ptr);
/* Synchronous copy on the context stream. */
kva_status kva__cuda_memcpy(kva_context *ctx, void *dst, const void *src, size_t bytes,
                            kva_copy_kind kind);
/* Asynchronous memset on the context stream. */
kva_status kva__cuda_memset_async(kva_context *ctx, void *dst, int value, size_t bytes);
kva_status kva__cuda_synchronize(kva_context *ctx);
/* Device memory free now (cudaMemGetInfo). */
kva_status kva__cuda_free_memory(kva_context *ctx, size_t *free_bytes);

/* Before a plan rewrites a workspace's host part: waits until the previous upload from it has
 * been consumed (so pinned staging is not overwritten under an in-flight copy). */
kva_status kva__cuda_plan_begin(kva_context *ctx, const void *host_part);
/* Uploads bytes of the host part to the device part (one async copy) and records completion. */
kva_status kva__cuda_plan_upload(kva_context *ctx, void *device_part, const void *host_part,
                                 size_t bytes);

/* Whether a CUDA decode kernel serves (dtype, head_dim, GQA group), for both algorithms: the
 * answer of the decode kernel chooser (kva__decode_kernel_for), asked by argument validation. */
bool kva__cuda_decode_supported(const kva_context *ctx, kva_dtype dtype, int32_t head_dim,
                                int32_t group);

/* The partial-rowmax decode kernel the chooser picks for (dtype, head_dim, GQA group): the
 * blocks of it one SM of ctx's device holds at once (0 when no kernel serves the shape), and in
 * *nsub (may be NULL) its units per (work item, KV head). For tests of the split policy, which
 * sizes the sub-group round from it (kva__split_policy.subgroup_blocks). */
int kva__cuda_decode_blocks_per_sm(const kva_context *ctx, kva_dtype dtype, int32_t head_dim, int32_t group,
                                   int32_t *nsub);

/* Whether a decode run of (dtype, head_dim, GQA group) over num_kv_heads heads at a pool head
 * stride of stride_head elements, of a plan that splits requests (split = 1) or not, puts two
 * adjacent KV heads in one unit (kva__decode_pair_for; partial rowmax): tests assert that their
 * paired cases take that path. */
bool kva__cuda_decode_pairs_heads(const kva_context *ctx, kva_dtype dtype, int32_t head_dim, int32_t group,
                                  int32_t num_kv_heads, int64_t stride_head, int split);

/* Shared-merge withdrawals (decode_merge.cuh) since the context was created, after its stream's
 * work so far: tests assert that the withdrawal path ran. */
kva_status kva__cuda_decode_merge_withdrawals(const kva_context *ctx, uint64_t *count);

kva_status kva__cuda_decode_run(kva_context *ctx, const kva_plan *plan,
                                const kva_attn_params *params, kva_tensor q,
                                const kva_kv_pages *pages, kva_tensor o, float *lse);

/* Prefill from a plan: ragged K/V (pages == NULL; k, v tensors) or paged (pages). */
kva_status kva__cuda_prefill_run(kva_context *ctx, const kva_plan *plan,
                                 const kva_attn_params *params, kva_tensor q, kva_tensor k,
                                 kva_tensor v, const kva_kv_pages *pages, kva_tensor o, float *lse);

/* Dense attention of one sequence (kva_attention), no plan. */
kva_status kva__cuda_attention(kva_context *ctx, const kva_attn_params *params, int32_t qo_len,
                               int32_t kv_len, kva_tensor q, kva_tensor k, kva_tensor v,
                               kva_tensor o, float *lse);

/* A variant for ctx's device (variant_load.cu); api names the public call in messages. */
kva_status kva__cuda_variant_create(kva_context *ctx, const char *api, const char *source,
                                    const char *function, const kva_variant_options *options,
                                    kva_variant **out);
void kva__cuda_variant_destroy(kva_variant *variant);

kva_status kva__cuda_merge_states(kva_context *ctx, int32_t num_rows, int32_t num_states,
                                  int32_t head_dim, kva_dtype dtype, const void *v_in,
                                  const float *lse_in, void *v_out, float *lse_out);

/* Writes num_tokens rows of k/v into the pool at slots_host[i] (page * page_size + offset);
 * slots_dev is device staging of at least num_tokens entries owned by the caller (the cache). */
kva_status kva__cuda_append(kva_context *ctx, const kva_kv_pages *pages, int32_t num_tokens,
                            const int64_t *slots_host, int64_t *slots_dev, kva_tensor k,
                            kva_tensor v);

/* Copies whole pages src[i] -> dst[i] of one layer's pool (copy-on-write). */
kva_status kva__cuda_copy_pages(kva_context *ctx, const kva_kv_pages *pages, int32_t n,
                                const int32_t *src, const int32_t *dst);

#ifdef __cplusplus
}
#endif
#endif /* KVA_CUDA_BACKEND_H */
