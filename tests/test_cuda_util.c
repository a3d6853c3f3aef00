/* test_cuda_util.c -- fixtures of the GPU tests; see test_cuda_util.h. Holds no tests itself. */
#include "test_cuda_util.h"
#include "harness.h"
#include "../src/common/dtype_convert.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kva_context *cuda_test_context(void) {
    if (!kva_cuda_available()) {
        kva_test_skip("no CUDA device");
        return NULL;
    }
    kva_context *ctx = NULL;
    kva_status st = kva_context_create(KVA_DEVICE_CUDA, 0, &ctx);
    if (st != KVA_OK) {
        kva_test_fail(__FILE__, __LINE__, "kva_context_create(CUDA): %s (%s)", kva_status_str(st),
                      kva_last_error());
        return NULL;
    }
    return ctx;
}

void *cuda_test_upload(kva_context *ctx, const void *host, size_t bytes) {
    void *dev = NULL;
    kva_status st = kva_malloc(ctx, bytes, &dev);
    if (st == KVA_OK && bytes) st = kva_memcpy(ctx, dev, host, bytes, KVA_COPY_HOST_TO_DEVICE);
    if (st != KVA_OK) {
        kva_test_fail(__FILE__, __LINE__, "upload of %zu bytes: %s (%s)", bytes, kva_status_str(st),
                      kva_last_error());
        kva_free(ctx, dev);
        return NULL;
    }
    return dev;
}

void *cuda_test_poisoned(kva_context *ctx, size_t bytes) {
    void *host = kva_test_alloc(bytes);
    kva_poison(host, bytes);
    void *dev = cuda_test_upload(ctx, host, bytes);
    free(host);
    return dev;
}

void *cuda_test_download(kva_context *ctx, const void *dev, size_t bytes) {
    void *host = kva_test_alloc(bytes);
    kva_status st = bytes ? kva_memcpy(ctx, host, dev, bytes, KVA_COPY_DEVICE_TO_HOST) : KVA_OK;
    if (st != KVA_OK) {
        kva_test_fail(__FILE__, __LINE__, "download of %zu bytes: %s (%s)", bytes,
                      kva_status_str(st), kva_last_error());
        kva_poison(host, bytes);
    }
    return host;
}

const char *cuda_test_layout_name(int layout) {
    static const char *names[] = {"NHD", "HND", "NHD-interleaved", "HND-interleaved", "padded"};
    return layout >= 0 && layout < CUDA_TEST_NUM_LAYOUTS ? names[layout] : "?";
}

int32_t cuda_test_pick_len(kva_rng *rng, int32_t max_len) {
    int r = kva_rng_int(rng, 0, 9);
    if (r == 0) return 0;
    if (r == 1) return 1;
    if (r == 2 || max_len < 3) return max_len;
    int32_t n = kva_rng_int(rng, 2, max_len);
    return n % 2 ? n : n - 1; /* odd lengths straddle tiles and pages */
}

bool cuda_paged_batch_make(kva_context *ctx, kva_rng *rng, kva_dtype dtype, int32_t batch,
                           const int32_t *kv_len, int32_t num_kv_heads, int32_t head_dim,
                           int32_t page_size, int layout, cuda_paged_batch *pb) {
    memset(pb, 0, sizeof *pb);
    pb->dtype = dtype;
    pb->batch = batch;
    pb->num_kv_heads = num_kv_heads;
    pb->head_dim = head_dim;
    pb->page_size = page_size;
    pb->indptr = kva_test_alloc(sizeof(int32_t) * (size_t)(batch + 1));
    pb->last_page_len = kva_test_alloc(sizeof(int32_t) * (size_t)(batch > 0 ? batch : 1));
    pb->kv_len = kva_test_alloc(sizeof(int32_t) * (size_t)(batch > 0 ? batch : 1));
    pb->indptr[0] = 0;
    for (int32_t b = 0; b < batch; ++b) {
        int32_t np = (kv_len[b] + page_size - 1) / page_size;
        pb->indptr[b + 1] = pb->indptr[b] + np;
        pb->last_page_len[b] = np ? kv_len[b] - (np - 1) * page_size : 0;
        pb->kv_len[b] = kv_len[b];
    }
    int32_t used = pb->indptr[batch];
    pb->num_pages = used + 3; /* spare pages stay NaN: reading one fails the test */
    int32_t *perm = kva_test_alloc(sizeof(int32_t) * (size_t)pb->num_pages);
    for (int32_t i = 0; i < pb->num_pages; ++i) perm[i] = i;
    kva_rng_shuffle_i32(rng, perm, pb->num_pages);
    pb->indices = kva_test_alloc(sizeof(int32_t) * (size_t)(used > 0 ? used : 1));
    memcpy(pb->indices, perm, sizeof(int32_t) * (size_t)used);
    free(perm);
    pb->table.batch_size = batch;
    pb->table.indptr = pb->indptr;
    pb->table.indices = pb->indices;
    pb->table.last_page_len = pb->last_page_len;

    const size_t es = kva_dtype_size(dtype);
    const int64_t P = pb->num_pages;
    kva_kv_pages hp;
    size_t elems;
    switch (layout) {
    case CUDA_TEST_NHD:
    case CUDA_TEST_HND:
        hp = kva_kv_pages_separate(NULL, NULL, dtype, (int32_t)P, page_size, num_kv_heads, head_dim,
                                   layout == CUDA_TEST_HND ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD);
        elems = (size_t)(P * hp.stride_page);
        pb->pool_bytes = 2 * elems * es;
        break;
    case CUDA_TEST_NHD_INTERLEAVED:
    case CUDA_TEST_HND_INTERLEAVED:
        hp = kva_kv_pages_interleaved(NULL, dtype, (int32_t)P, page_size, num_kv_heads, head_dim,
                                      layout == CUDA_TEST_HND_INTERLEAVED ? KVA_LAYOUT_HND
                                                                          : KVA_LAYOUT_NHD);
        elems = (size_t)(P * hp.stride_page);
        pb->pool_bytes = elems * es;
        break;
    default: /* padded NHD: every stride has 8 (f16/bf16) or 4 (f32) extra elements */
        hp = kva_kv_pages_separate(NULL, NULL, dtype, (int32_t)P, page_size, num_kv_heads, head_dim,
                                   KVA_LAYOUT_NHD);
        hp.stride_head = head_dim + 8;
        hp.stride_token = (int64_t)num_kv_heads * hp.stride_head + 8;
        hp.stride_page = (int64_t)page_size * hp.stride_token + 16;
        elems = (size_t)(P * hp.stride_page);
        pb->pool_bytes = 2 * elems * es;
        break;
    }
    unsigned char *host = kva_test_alloc(pb->pool_bytes);
    kva_poison(host, pb->pool_bytes);
    hp.k_data = host;
    if (layout == CUDA_TEST_NHD_INTERLEAVED || layout == CUDA_TEST_HND_INTERLEAVED)
        hp.v_data = host + (size_t)((int64_t)page_size * num_kv_heads * head_dim) * es;
    else
        hp.v_data = host + elems * es;
    for (int32_t b = 0; b < batch; ++b)
        for (int32_t j = 0; j < kv_len[b]; ++j) {
            int32_t page = pb->indices[pb->indptr[b] + j / page_size], slot = j % page_size;
            for (int32_t h = 0; h < num_kv_heads; ++h) {
                size_t off = (size_t)(page * hp.stride_page + slot * hp.stride_token + h * hp.stride_head) * es;
                kva_fill_random(rng, (unsigned char *)hp.k_data + off, dtype, (size_t)head_dim, -1.f, 1.f);
                kva_fill_random(rng, (unsigned char *)hp.v_data + off, dtype, (size_t)head_dim, -1.f, 1.f);
            }
        }
    pb->host_pool = host;
    pb->host_pages = hp;
    pb->dev_pool = cuda_test_upload(ctx, host, pb->pool_bytes);
    if (!pb->dev_pool) return false;
    pb->dev_pages = hp;
    pb->dev_pages.k_data = (unsigned char *)pb->dev_pool + ((unsigned char *)hp.k_data - host);
    pb->dev_pages.v_data = (unsigned char *)pb->dev_pool + ((unsigned char *)hp.v_data - host);
    return true;
}

void cuda_paged_batch_free(kva_context *ctx, cuda_paged_batch *pb) {
    free(pb->indptr);
    free(pb->indices);
    free(pb->last_page_len);
    free(pb->kv_len);
    free(pb->host_pool);
    if (pb->dev_pool) kva_free(ctx, pb->dev_pool);
    memset(pb, 0, sizeof *pb);
}

void cuda_ref_decode(const cuda_paged_batch *pb, const kva_attn_params *p, const void *q_host,
                     double *o_ref, double *lse_ref) {
    const int32_t Hq = p->num_qo_heads, Hk = p->num_kv_heads, D = p->head_dim;
    int32_t max_len = 1;
    for (int32_t b = 0; b < pb->batch; ++b)
        if (pb->kv_len[b] > max_len) max_len = pb->kv_len[b];
    double *k = kva_test_alloc(sizeof(double) * (size_t)max_len * Hk * D);
    double *v = kva_test_alloc(sizeof(double) * (size_t)max_len * Hk * D);
    double *q = kva_test_alloc(sizeof(double) * (size_t)Hq * D);
    kva_tensor qt = kva_tensor_nhd((void *)q_host, pb->dtype, Hq, D);
    for (int32_t b = 0; b < pb->batch; ++b) {
        int32_t len = kva_ref_read_paged(&pb->host_pages, &pb->table, b, k, v);
        kva_ref_read_tensor(qt, b, 1, Hq, D, q);
        kva_ref_attention(p, 1, len, q, k, v, o_ref + (size_t)b * Hq * D,
                          lse_ref ? lse_ref + (size_t)b * Hq : NULL);
    }
    free(k);
    free(v);
    free(q);
}

bool cuda_test_workspace_make(kva_context *ctx, const kva_plan_limits *limits,
                              cuda_test_workspace *out) {
    memset(out, 0, sizeof *out);
    size_t dev_bytes = 0, host_bytes = 0;
    kva_status st = kva_decode_workspace_size(ctx, limits, &dev_bytes, &host_bytes);
    if (st == KVA_OK) st = kva_malloc(ctx, dev_bytes, &out->ws.device);
    if (st == KVA_OK) st = kva_host_alloc(ctx, host_bytes, &out->ws.host);
    if (st != KVA_OK) {
        kva_test_fail(__FILE__, __LINE__, "workspace: %s (%s)", kva_status_str(st), kva_last_error());
        cuda_test_workspace_free(ctx, out);
        return false;
    }
    out->ws.device_bytes = dev_bytes;
    out->ws.host_bytes = host_bytes;
    return true;
}

void cuda_test_workspace_free(kva_context *ctx, cuda_test_workspace *w) {
    if (w->ws.device) kva_free(ctx, w->ws.device);
    if (w->ws.host) kva_host_free(ctx, w->ws.host);
    memset(w, 0, sizeof *w);
}
