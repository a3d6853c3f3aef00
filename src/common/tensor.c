/* tensor.c -- constructors of tensor and page-pool views. */
#include "internal.h"

kva_tensor kva_tensor_nhd(void *data, kva_dtype dtype, int32_t num_heads, int32_t head_dim) {
    kva_tensor t = {data, dtype, (int64_t)num_heads * head_dim, head_dim};
    return t;
}

kva_tensor kva_tensor_hnd(void *data, kva_dtype dtype, int64_t num_tokens, int32_t head_dim) {
    kva_tensor t = {data, dtype, head_dim, num_tokens * head_dim};
    return t;
}

static void set_page_strides(kva_kv_pages *p, kva_layout layout) {
    if (layout == KVA_LAYOUT_HND) {
        p->stride_token = p->head_dim;
        p->stride_head = (int64_t)p->page_size * p->head_dim;
    } else {
        p->stride_token = (int64_t)p->num_kv_heads * p->head_dim;
        p->stride_head = p->head_dim;
    }
}

kva_kv_pages kva_kv_pages_separate(void *k_data, void *v_data, kva_dtype dtype, int32_t num_pages,
                                   int32_t page_size, int32_t num_kv_heads, int32_t head_dim,
                                   kva_layout layout) {
    kva_kv_pages p = {k_data, v_data, dtype, num_pages, page_size, num_kv_heads, head_dim,
                      (int64_t)page_size * num_kv_heads * head_dim, 0, 0};
    set_page_strides(&p, layout);
    return p;
}

kva_kv_pages kva_kv_pages_interleaved(void *data, kva_dtype dtype, int32_t num_pages,
                                      int32_t page_size, int32_t num_kv_heads, int32_t head_dim,
                                      kva_layout layout) {
    int64_t half = (int64_t)page_size * num_kv_heads * head_dim;
    void *v = data ? (void *)((unsigned char *)data + (size_t)half * kva_dtype_size(dtype)) : NULL;
    kva_kv_pages p = {data, v, dtype, num_pages, page_size, num_kv_heads, head_dim, 2 * half, 0, 0};
    set_page_strides(&p, layout);
    return p;
}

kva_attn_params kva_attn_params_default(int32_t num_qo_heads, int32_t num_kv_heads,
                                        int32_t head_dim) {
    kva_attn_params p = {num_qo_heads, num_kv_heads, head_dim, 0.0f, 0, -1, 0.0f, NULL, NULL, NULL};
    return p;
}
