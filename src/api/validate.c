/* validate.c -- argument checks shared by every attention entry point. Messages name the
 * public call (kva__api()) and the argument as the caller wrote it. */
#include "validate.h"
#include "../plan/workspace_layout.h"
#include "../cuda/cuda_backend.h"
#include "../cuda/variant.h"

#include <float.h>
#include <math.h>

kva_status kva__check_params(const kva_context *ctx, const kva_attn_params *p) {
    KVA_CHECK_NULL(ctx);
    if (!p) return kva__fail(KVA_ERR_INVALID_ARG, "%s: params is NULL", kva__api());
    if (p->num_qo_heads < 1 || p->num_kv_heads < 1 || p->num_qo_heads % p->num_kv_heads != 0)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: params.num_kv_heads (%d) must divide params.num_qo_heads (%d), both >= 1",
                         kva__api(), p->num_kv_heads, p->num_qo_heads);
    KVA_TRY(kva__check_head_dim(ctx, "params.head_dim", p->head_dim));
    if (p->score_mod && p->variant)
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "%s: params.score_mod and params.variant are both set; set the one of this "
                         "context's device (score_mod: CPU, variant: CUDA)",
                         kva__api());
    if (ctx->device == KVA_DEVICE_CUDA) {
        if (p->score_mod)
            return kva__fail(KVA_ERR_UNSUPPORTED,
                             "%s: params.score_mod callbacks run on the CPU only (on CUDA: params.variant, "
                             "kva_variant_create)",
                             kva__api());
        if (p->variant && p->variant->device_id != ctx->device_id)
            return kva__fail(KVA_ERR_INVALID_ARG,
                             "%s: params.variant was created for CUDA device %d; this context runs on device %d",
                             kva__api(), p->variant->device_id, ctx->device_id);
    } else if (p->variant) {
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "%s: params.variant is a CUDA variant; a CPU context takes the modifier as "
                         "params.score_mod (a C callback)",
                         kva__api());
    }
    if (p->causal != 0 && p->causal != 1)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: params.causal must be 0 or 1 (got %d)", kva__api(),
                         p->causal);
    /* An infinite scale makes every score inf or NaN (inf * 0): no attention is defined. A soft
     * cap of +inf is defined: no cap (kva__soft_cap). */
    if (isnan(p->sm_scale) || isinf(p->sm_scale))
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: params.sm_scale = %g must be finite", kva__api(),
                         (double)p->sm_scale);
    if (isnan(p->logits_soft_cap))
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: params.logits_soft_cap is NaN", kva__api());
    /* A soft cap whose f32 constants leave the normal range would get two answers: the CUDA
     * kernels take cap * log2(e) and sm_scale / cap, flush a subnormal one to 0 (a subnormal cap
     * reads as none, a subnormal sm_scale / cap makes every score 0) and turn an infinite one
     * into NaN rows, while the CPU divides by the cap itself. Refused, the cap a normal float too. */
    const float cap = kva__soft_cap(p->logits_soft_cap);
    if (cap > 0) {
        const float scale = p->sm_scale > 0 ? p->sm_scale : 1.0f / sqrtf((float)p->head_dim);
        const float log2e = 1.4426950408889634f;
        if (cap < FLT_MIN || isinf(cap * log2e) || !isnormal(scale / cap))
            return kva__fail(KVA_ERR_INVALID_ARG,
                             "%s: params.logits_soft_cap = %.9g is outside [%.9g, %.9g], where the kernels' "
                             "cap * log2(e) and sm_scale / cap (sm_scale %g) are normal floats (0 or "
                             "+inf: no cap)",
                             kva__api(), (double)p->logits_soft_cap, (double)fmaxf(FLT_MIN, scale / FLT_MAX),
                             (double)fminf(FLT_MAX / log2e, scale / FLT_MIN), (double)scale);
    }
    return KVA_OK;
}

kva_status kva__check_head_dim(const kva_context *ctx, const char *what, int32_t head_dim) {
    if (ctx->device == KVA_DEVICE_CUDA) {
        /* The decode kernel chooser answers (it serves every dim and group some CUDA kernel
         * does; prefill serves the same dims); prefill, which has fewer groups, refuses the rest
         * where it sizes or runs (the split policy for plans, kva_attention at the call). */
        if (!kva__cuda_decode_supported(ctx, KVA_BF16, head_dim, 1))
            return kva__fail(KVA_ERR_UNSUPPORTED,
                             "%s: %s = %d unsupported on CUDA (multiples of 16 in 32..256)",
                             kva__api(), what, head_dim);
    } else if (head_dim < 16 || head_dim > 256 || head_dim % 16 != 0) {
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "%s: %s = %d unsupported on the CPU (multiples of 16 up to 256)", kva__api(),
                         what, head_dim);
    }
    return KVA_OK;
}

/* True if count_i * stride_i (i < n) plus `inner` elements of es bytes stay within PTRDIFF_MAX
 * bytes (counts and strides non-negative): the kernels' offsets (index x stride x element size,
 * in int64 and size_t) then cannot overflow. A bound, not a check of the caller's allocation. */
static bool addressable(int64_t es, int n, const int64_t *count, const int64_t *stride,
                        int64_t inner) {
    int64_t elems = inner, term;
    for (int i = 0; i < n; ++i)
        if (__builtin_mul_overflow(count[i], stride[i], &term) ||
            __builtin_add_overflow(elems, term, &elems))
            return false;
    return !__builtin_mul_overflow(elems, es, &elems) && elems <= PTRDIFF_MAX;
}

kva_status kva__check_tensor(const char *what, kva_tensor t, kva_dtype dtype, int64_t tokens,
                             int32_t heads, int32_t head_dim) {
    if (t.dtype != dtype)
        return kva__fail(KVA_ERR_BAD_SHAPE, "%s: %s.dtype is %s, expected %s", kva__api(), what,
                         kva_dtype_name(t.dtype), kva_dtype_name(dtype));
    if (tokens == 0) return KVA_OK;
    if (!t.data) return kva__fail(KVA_ERR_INVALID_ARG, "%s: %s.data is NULL", kva__api(), what);
    int64_t vec = 16 / (int64_t)kva_dtype_size(dtype);
    if ((uintptr_t)t.data % 16 != 0 || t.stride_token % vec != 0 || t.stride_head % vec != 0 ||
        t.stride_token < 0 || t.stride_head < 0)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: %s.data must be 16-byte aligned and its strides (%lld, %lld) "
                         "non-negative multiples of %lld elements",
                         kva__api(), what, (long long)t.stride_token, (long long)t.stride_head, (long long)vec);
    const int64_t count[2] = {tokens, heads}, stride[2] = {t.stride_token, t.stride_head};
    if (!addressable((int64_t)kva_dtype_size(dtype), 2, count, stride, head_dim))
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: %s strides (%lld, %lld) over %lld tokens x %d heads exceed the "
                         "address space",
                         kva__api(), what, (long long)t.stride_token, (long long)t.stride_head,
                         (long long)tokens, heads);
    return KVA_OK;
}

kva_status kva__check_aligned(const char *what, const void *p, size_t align) {
    if (align > 1 && (uintptr_t)p % align != 0)
        return kva__fail(KVA_ERR_BAD_SHAPE, "%s: %s (%p) must be %zu-byte aligned", kva__api(), what,
                         p, align);
    return KVA_OK;
}

kva_status kva__check_output(const char *what, kva_tensor t, kva_dtype dtype, int64_t tokens,
                             int32_t heads, int32_t head_dim) {
    KVA_TRY(kva__check_tensor(what, t, dtype, tokens, heads, head_dim));
    /* inner dimension (smaller stride) first: each dimension of more than one row must step past
     * all that the dimensions inside it span (no overflow: kva__check_tensor bounded count x
     * stride) */
    int64_t n[2] = {tokens, heads}, st[2] = {t.stride_token, t.stride_head};
    if (st[0] > st[1]) {
        const int64_t a = n[0], b = st[0];
        n[0] = n[1], st[0] = st[1], n[1] = a, st[1] = b;
    }
    int64_t span = head_dim;
    for (int i = 0; i < 2; ++i) {
        if (n[i] <= 1) continue;
        if (st[i] < span)
            return kva__fail(KVA_ERR_BAD_SHAPE,
                             "%s: %s strides (%lld, %lld) make rows of %lld tokens x %d heads x %d "
                             "overlap; an output's rows must not share elements",
                             kva__api(), what, (long long)t.stride_token, (long long)t.stride_head,
                             (long long)tokens, heads, head_dim);
        span += st[i] * (n[i] - 1);
    }
    return KVA_OK;
}

kva_status kva__check_pages(const kva_kv_pages *pg, const kva_attn_params *p, int32_t page_size,
                            int32_t min_num_pages) {
    if (!pg) return kva__fail(KVA_ERR_INVALID_ARG, "%s: pages is NULL", kva__api());
    if (!pg->k_data || !pg->v_data)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: pages.k_data / v_data is NULL", kva__api());
    if (!kva__dtype_valid(pg->dtype))
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: pages.dtype %d is unknown", kva__api(),
                         (int)pg->dtype);
    if (pg->num_kv_heads != p->num_kv_heads || pg->head_dim != p->head_dim)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: pages has %d kv heads x head_dim %d, params say %d x %d", kva__api(),
                         pg->num_kv_heads, pg->head_dim, p->num_kv_heads, p->head_dim);
    if (pg->page_size < 1 || pg->page_size > KVA__MAX_PAGE_SIZE)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: pages.page_size %d outside 1..%d", kva__api(),
                         pg->page_size, KVA__MAX_PAGE_SIZE);
    if (pg->page_size != page_size)
        return kva__fail(KVA_ERR_BAD_SHAPE, "%s: pages.page_size %d, the plan was made for %d",
                         kva__api(), pg->page_size, page_size);
    if (pg->num_pages < min_num_pages)
        return kva__fail(KVA_ERR_OUT_OF_RANGE,
                         "%s: pages.num_pages is %d, the plan's page table was checked against %d",
                         kva__api(), pg->num_pages, min_num_pages);
    int64_t vec = 16 / (int64_t)kva_dtype_size(pg->dtype);
    if ((uintptr_t)pg->k_data % 16 || (uintptr_t)pg->v_data % 16 || pg->stride_page % vec ||
        pg->stride_token % vec || pg->stride_head % vec || pg->stride_page < 0 ||
        pg->stride_token < 0 || pg->stride_head < 0)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: pages.k_data / v_data must be 16-byte aligned and the strides "
                         "non-negative multiples of %lld elements",
                         kva__api(), (long long)vec);
    const int64_t count[3] = {pg->num_pages, pg->page_size, pg->num_kv_heads};
    const int64_t stride[3] = {pg->stride_page, pg->stride_token, pg->stride_head};
    if (!addressable((int64_t)kva_dtype_size(pg->dtype), 3, count, stride, pg->head_dim))
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: pages strides (%lld, %lld, %lld) over %d pages of %d tokens x %d "
                         "heads exceed the address space",
                         kva__api(), (long long)pg->stride_page, (long long)pg->stride_token,
                         (long long)pg->stride_head, pg->num_pages, pg->page_size,
                         pg->num_kv_heads);
    return KVA_OK;
}

kva_status kva__check_plan(const kva_plan *plan, int kind, const kva_attn_params *p) {
    KVA_CHECK_NULL(plan);
    if (plan->magic != KVA__PLAN_MAGIC || !plan->workspace.host)
        return kva__fail(KVA_ERR_BAD_STATE, "%s: plan was not made by kva_*_plan (or is zeroed)",
                         kva__api());
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    /* A re-plan into the same workspace replaces the header; compare every fact a run reads
     * from it, since tensors are checked against the struct but kernels use the header. */
    if (h->magic != KVA__PLAN_MAGIC || h->num_work != plan->num_work || h->kind != plan->kind ||
        h->batch_size != plan->batch_size || h->kv_chunk_size != plan->kv_chunk_size ||
        h->qo_tile_size != plan->qo_tile_size || h->page_size != plan->page_size ||
        h->num_qo_heads != plan->num_qo_heads || h->num_kv_heads != plan->num_kv_heads ||
        h->head_dim != plan->head_dim || h->padded_work != plan->padded_work ||
        h->split_kv != plan->split_kv || h->algo != (int32_t)plan->algo ||
        h->generation != plan->generation)
        return kva__fail(KVA_ERR_BAD_STATE,
                         "%s: plan is stale: its workspace was planned into again since (a later "
                         "kva_*_plan call, failed or not); re-plan before running",
                         kva__api());
    if (plan->kind != kind)
        return kva__fail(KVA_ERR_BAD_STATE,
                         "%s: plan was made for another operation (kind %d, this run needs %d)",
                         kva__api(), plan->kind, kind);
    if (plan->num_qo_heads != p->num_qo_heads || plan->num_kv_heads != p->num_kv_heads ||
        plan->head_dim != p->head_dim)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: plan was made for %d/%d heads x %d, params say %d/%d x %d",
                         kva__api(), plan->num_qo_heads,
                         plan->num_kv_heads, plan->head_dim, p->num_qo_heads, p->num_kv_heads,
                         p->head_dim);
    return KVA_OK;
}
