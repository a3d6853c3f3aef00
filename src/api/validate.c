/* validate.c -- argument checks shared by every attention entry point. */
#include "validate.h"
#include "../plan/workspace_layout.h"

kva_status kva__check_params(const kva_context *ctx, const kva_attn_params *p) {
    KVA_CHECK_NULL(ctx);
    KVA_CHECK_NULL(p);
    if (p->num_qo_heads < 1 || p->num_kv_heads < 1 || p->num_qo_heads % p->num_kv_heads != 0)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "params: num_kv_heads (%d) must divide num_qo_heads (%d), both >= 1",
                         p->num_kv_heads, p->num_qo_heads);
    if (ctx->device == KVA_DEVICE_CUDA) {
        if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
            return kva__fail(KVA_ERR_UNSUPPORTED, "params: head_dim %d unsupported on CUDA (64, 128, 256)",
                             p->head_dim);
        if (p->score_mod)
            return kva__fail(KVA_ERR_UNSUPPORTED, "params: score_mod callbacks run on the CPU only");
        if (p->num_qo_heads / p->num_kv_heads > 16)
            return kva__fail(KVA_ERR_UNSUPPORTED, "params: GQA group %d > 16 unsupported on CUDA",
                             p->num_qo_heads / p->num_kv_heads);
    } else if (p->head_dim < 16 || p->head_dim > 256 || p->head_dim % 16 != 0) {
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "params: head_dim %d unsupported on the CPU (multiples of 16 up to 256)",
                         p->head_dim);
    }
    if (p->causal != 0 && p->causal != 1)
        return kva__fail(KVA_ERR_INVALID_ARG, "params: causal must be 0 or 1 (got %d)", p->causal);
    if (p->sm_scale != p->sm_scale || p->logits_soft_cap != p->logits_soft_cap)
        return kva__fail(KVA_ERR_INVALID_ARG, "params: sm_scale / logits_soft_cap is NaN");
    return KVA_OK;
}

kva_status kva__check_tensor(const char *what, kva_tensor t, kva_dtype dtype, int64_t tokens) {
    if (t.dtype != dtype)
        return kva__fail(KVA_ERR_BAD_SHAPE, "%s: dtype %s, expected %s", what,
                         kva_dtype_name(t.dtype), kva_dtype_name(dtype));
    if (tokens == 0) return KVA_OK;
    if (!t.data) return kva__fail(KVA_ERR_INVALID_ARG, "%s: data is NULL", what);
    int64_t vec = 16 / (int64_t)kva_dtype_size(dtype);
    if ((uintptr_t)t.data % 16 != 0 || t.stride_token % vec != 0 || t.stride_head % vec != 0 ||
        t.stride_token < 0 || t.stride_head < 0)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: data must be 16-byte aligned and strides (%lld, %lld) non-negative "
                         "multiples of %lld elements",
                         what, (long long)t.stride_token, (long long)t.stride_head, (long long)vec);
    return KVA_OK;
}

kva_status kva__check_pages(const kva_kv_pages *pg, const kva_attn_params *p, int32_t page_size,
                            int32_t min_num_pages) {
    KVA_CHECK_NULL(pg);
    if (!pg->k_data || !pg->v_data)
        return kva__fail(KVA_ERR_INVALID_ARG, "pages: k_data / v_data is NULL");
    if (!kva__dtype_valid(pg->dtype))
        return kva__fail(KVA_ERR_INVALID_ARG, "pages: unknown dtype %d", (int)pg->dtype);
    if (pg->num_kv_heads != p->num_kv_heads || pg->head_dim != p->head_dim)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "pages: %d kv heads x head_dim %d, params say %d x %d", pg->num_kv_heads,
                         pg->head_dim, p->num_kv_heads, p->head_dim);
    if (pg->page_size != page_size)
        return kva__fail(KVA_ERR_BAD_SHAPE, "pages: page_size %d, the plan was made for %d",
                         pg->page_size, page_size);
    if (pg->num_pages < min_num_pages)
        return kva__fail(KVA_ERR_OUT_OF_RANGE,
                         "pages: pool has %d pages, the plan's page table was checked against %d",
                         pg->num_pages, min_num_pages);
    int64_t vec = 16 / (int64_t)kva_dtype_size(pg->dtype);
    if ((uintptr_t)pg->k_data % 16 || (uintptr_t)pg->v_data % 16 || pg->stride_page % vec ||
        pg->stride_token % vec || pg->stride_head % vec || pg->stride_page < 0 ||
        pg->stride_token < 0 || pg->stride_head < 0)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "pages: base pointers must be 16-byte aligned and strides non-negative "
                         "multiples of %lld elements",
                         (long long)vec);
    return KVA_OK;
}

kva_status kva__check_plan(const kva_plan *plan, int kind, const kva_attn_params *p) {
    KVA_CHECK_NULL(plan);
    if (plan->magic != KVA__PLAN_MAGIC || !plan->workspace.host)
        return kva__fail(KVA_ERR_BAD_STATE, "plan: not made by kva_*_plan (or zeroed)");
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    /* A re-plan into the same workspace replaces the header; compare every fact a run reads
     * from it, since tensors are checked against the struct but kernels use the header. */
    if (h->magic != KVA__PLAN_MAGIC || h->num_work != plan->num_work || h->kind != plan->kind ||
        h->batch_size != plan->batch_size || h->kv_chunk_size != plan->kv_chunk_size ||
        h->qo_tile_size != plan->qo_tile_size || h->page_size != plan->page_size ||
        h->num_qo_heads != plan->num_qo_heads || h->num_kv_heads != plan->num_kv_heads ||
        h->head_dim != plan->head_dim || h->padded_work != plan->padded_work ||
        h->split_kv != plan->split_kv || h->algo != (int32_t)plan->algo)
        return kva__fail(KVA_ERR_BAD_STATE,
                         "plan: its workspace now holds another plan (re-plan before running)");
    if (plan->kind != kind)
        return kva__fail(KVA_ERR_BAD_STATE, "plan: made for another operation (kind %d, run needs %d)",
                         plan->kind, kind);
    if (plan->num_qo_heads != p->num_qo_heads || plan->num_kv_heads != p->num_kv_heads ||
        plan->head_dim != p->head_dim)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "plan: made for %d/%d heads x %d, params say %d/%d x %d", plan->num_qo_heads,
                         plan->num_kv_heads, plan->head_dim, p->num_qo_heads, p->num_kv_heads,
                         p->head_dim);
    return KVA_OK;
}
