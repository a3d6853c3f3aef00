/*
 * attention_api.c -- the public attention entry points: check every argument once, then hand
 * the call to the context's backend (src/cpu or src/cuda).
 */
#include "validate.h"
#include "../cpu/cpu_backend.h"
#include "../cuda/cuda_backend.h"
#include "../plan/workspace_layout.h"

kva_status kva_attention(kva_context *ctx, const kva_attn_params *params, int32_t qo_len,
                         int32_t kv_len, kva_tensor q, kva_tensor k, kva_tensor v, kva_tensor o,
                         float *lse) {
    KVA_API("kva_attention");
    KVA_TRY(kva__check_params(ctx, params));
    if (qo_len < 0 || kv_len < 0)
        return kva__fail(KVA_ERR_BAD_SHAPE, "kva_attention: qo_len %d / kv_len %d negative", qo_len,
                         kv_len);
    kva_dtype dt = q.dtype;
    if (!kva__dtype_valid(dt))
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_attention: q.dtype %d is unknown", (int)dt);
    KVA_TRY(kva__check_tensor("q", q, dt, qo_len, params->num_qo_heads, params->head_dim));
    KVA_TRY(kva__check_tensor("k", k, dt, kv_len, params->num_kv_heads, params->head_dim));
    KVA_TRY(kva__check_tensor("v", v, dt, kv_len, params->num_kv_heads, params->head_dim));
    KVA_TRY(kva__check_output("o", o, dt, qo_len, params->num_qo_heads, params->head_dim));
    KVA_TRY(kva__check_aligned("lse", lse, sizeof(float)));
    if (ctx->device == KVA_DEVICE_CUDA)
        return kva__cuda_attention(ctx, params, qo_len, kv_len, q, k, v, o, lse);
    return kva__cpu_attention(ctx, params, qo_len, kv_len, q, k, v, o, lse);
}

kva_status kva_decode_run(kva_context *ctx, const kva_plan *plan, const kva_attn_params *params,
                          kva_tensor q, const kva_kv_pages *pages, kva_tensor o, float *lse) {
    KVA_API("kva_decode_run");
    KVA_TRY(kva__check_params(ctx, params));
    KVA_TRY(kva__check_plan(plan, KVA__PLAN_DECODE, params));
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    KVA_TRY(kva__check_pages(pages, params, h->page_size, h->num_pages));
    KVA_TRY(kva__check_tensor("q", q, pages->dtype, plan->batch_size, params->num_qo_heads,
                              params->head_dim));
    KVA_TRY(kva__check_output("o", o, pages->dtype, plan->batch_size, params->num_qo_heads,
                              params->head_dim));
    KVA_TRY(kva__check_aligned("lse", lse, sizeof(float)));
    if (ctx->device == KVA_DEVICE_CUDA)
        return kva__cuda_decode_run(ctx, plan, params, q, pages, o, lse);
    return kva__cpu_decode_run(ctx, plan, params, q, pages, o, lse);
}

static int64_t total_qo(const kva_plan *plan) {
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    const int32_t *ints = kva__plan_ints(plan->workspace.host);
    return ints[h->off_qo_indptr + h->batch_size];
}

kva_status kva_prefill_run_ragged(kva_context *ctx, const kva_plan *plan,
                                  const kva_attn_params *params, kva_tensor q, kva_tensor k,
                                  kva_tensor v, kva_tensor o, float *lse) {
    KVA_API("kva_prefill_run_ragged");
    KVA_TRY(kva__check_params(ctx, params));
    KVA_TRY(kva__check_plan(plan, KVA__PLAN_PREFILL_RAGGED, params));
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    const int32_t *ints = kva__plan_ints(plan->workspace.host);
    int64_t nq = total_qo(plan), nk = ints[h->off_kv_indptr + h->batch_size];
    kva_dtype dt = q.dtype;
    if (!kva__dtype_valid(dt))
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_prefill_run_ragged: q.dtype %d is unknown", (int)dt);
    KVA_TRY(kva__check_tensor("q", q, dt, nq, params->num_qo_heads, params->head_dim));
    KVA_TRY(kva__check_tensor("k", k, dt, nk, params->num_kv_heads, params->head_dim));
    KVA_TRY(kva__check_tensor("v", v, dt, nk, params->num_kv_heads, params->head_dim));
    KVA_TRY(kva__check_output("o", o, dt, nq, params->num_qo_heads, params->head_dim));
    KVA_TRY(kva__check_aligned("lse", lse, sizeof(float)));
    if (ctx->device == KVA_DEVICE_CUDA)
        return kva__cuda_prefill_run(ctx, plan, params, q, k, v, NULL, o, lse);
    return kva__cpu_prefill_run_ragged(ctx, plan, params, q, k, v, o, lse);
}

kva_status kva_prefill_run_paged(kva_context *ctx, const kva_plan *plan,
                                 const kva_attn_params *params, kva_tensor q,
                                 const kva_kv_pages *pages, kva_tensor o, float *lse) {
    KVA_API("kva_prefill_run_paged");
    KVA_TRY(kva__check_params(ctx, params));
    KVA_TRY(kva__check_plan(plan, KVA__PLAN_PREFILL_PAGED, params));
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    KVA_TRY(kva__check_pages(pages, params, h->page_size, h->num_pages));
    int64_t nq = total_qo(plan);
    KVA_TRY(kva__check_tensor("q", q, pages->dtype, nq, params->num_qo_heads, params->head_dim));
    KVA_TRY(kva__check_output("o", o, pages->dtype, nq, params->num_qo_heads, params->head_dim));
    KVA_TRY(kva__check_aligned("lse", lse, sizeof(float)));
    if (ctx->device == KVA_DEVICE_CUDA) {
        kva_tensor none = {NULL, pages->dtype, 0, 0};
        return kva__cuda_prefill_run(ctx, plan, params, q, none, none, pages, o, lse);
    }
    return kva__cpu_prefill_run_paged(ctx, plan, params, q, pages, o, lse);
}

kva_status kva_merge_states(kva_context *ctx, int32_t num_rows, int32_t num_states,
                            int32_t head_dim, kva_dtype dtype, const void *v_in,
                            const float *lse_in, void *v_out, float *lse_out) {
    KVA_API("kva_merge_states");
    KVA_CHECK_NULL(ctx);
    if (num_rows < 0 || num_states < 0 || head_dim < 1 || head_dim > 1024)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "kva_merge_states: rows %d, states %d, head_dim %d out of range", num_rows,
                         num_states, head_dim);
    if (!kva__dtype_valid(dtype))
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_merge_states: unknown dtype %d", (int)dtype);
    if (num_rows == 0) return KVA_OK;
    KVA_CHECK_NULL(v_out);
    if (num_states > 0) {
        KVA_CHECK_NULL(v_in);
        KVA_CHECK_NULL(lse_in);
    }
    /* the kernels access elements one by one (scalar tails, CUDA): natural alignment */
    const size_t es = kva_dtype_size(dtype);
    KVA_TRY(kva__check_aligned("v_in", v_in, es));
    KVA_TRY(kva__check_aligned("lse_in", lse_in, sizeof(float)));
    KVA_TRY(kva__check_aligned("v_out", v_out, es));
    KVA_TRY(kva__check_aligned("lse_out", lse_out, sizeof(float)));
    if (ctx->device == KVA_DEVICE_CUDA)
        return kva__cuda_merge_states(ctx, num_rows, num_states, head_dim, dtype, v_in, lse_in,
                                      v_out, lse_out);
    return kva__cpu_merge_states(ctx, num_rows, num_states, head_dim, dtype, v_in, lse_in, v_out,
                                 lse_out);
}
