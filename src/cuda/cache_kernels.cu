/*
 * cache_kernels.cu -- the two kernels the KV-cache manager needs on CUDA:
 *   kva__cuda_append:     scatters a batch's new K/V rows [tokens, kv_heads, D] into their page
 *                         slots (slot = page * page_size + offset), slots uploaded from host to
 *                         the caller's device staging with one async copy;
 *   kva__cuda_copy_pages: copies whole pages src[i] -> dst[i] (copy-on-write of a shared page).
 * Both address the pool through its strides, so any layout works (NHD / HND, separate or
 * interleaved K/V). Work split: one thread per 16-byte unit of a (token, head) row (4- or 2-byte
 * units when a row or stride is not 16-byte aligned), grid-stride. Traffic: each byte moved is
 * read once and written once; the slots (8 bytes per token) are read once per unit (L1 hits).
 */
#include "cuda_common.cuh"

#define KVA__COPY_THREADS 256
#define KVA__COPY_BATCH 256 /* page pairs passed by value per copy_pages launch */

typedef struct {
    int32_t src[KVA__COPY_BATCH];
    int32_t dst[KVA__COPY_BATCH];
} kva__page_pairs;

/* Byte geometry of a pool. */
typedef struct {
    unsigned char *k, *v;
    int64_t sp, st, sh; /* page, token, head strides in bytes */
    int32_t page_size, num_kv_heads;
    int32_t row_units;  /* units of one (token, head) row */
} kva__pool_bytes;

template <typename U>
__global__ void kva__append_kernel(kva__pool_bytes pool, int64_t total_units,
                                   const int64_t *__restrict__ slots, const unsigned char *ksrc,
                                   const unsigned char *vsrc, int64_t k_st, int64_t k_sh,
                                   int64_t v_st, int64_t v_sh) {
#if KVA__DECODE_PDL
    kva__pdl_trigger(); /* (a decode run after it may place its blocks now: they wait for our writes) */
#endif
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < total_units;
         u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = u / pool.row_units;
        const int c = (int)(u - row * pool.row_units);
        const int64_t i = row / pool.num_kv_heads;
        const int h = (int)(row - i * pool.num_kv_heads);
        const int64_t slot = __ldg(slots + i);
        if (slot < 0) continue; /* padding token: nothing to write */
        const int64_t page = slot / pool.page_size, off = slot - page * pool.page_size;
        const int64_t dst = page * pool.sp + off * pool.st + h * pool.sh + (int64_t)c * sizeof(U);
        *reinterpret_cast<U *>(pool.k + dst) =
            *reinterpret_cast<const U *>(ksrc + i * k_st + h * k_sh + (int64_t)c * sizeof(U));
        *reinterpret_cast<U *>(pool.v + dst) =
            *reinterpret_cast<const U *>(vsrc + i * v_st + h * v_sh + (int64_t)c * sizeof(U));
    }
}

template <typename U>
__global__ void kva__copy_pages_kernel(kva__pool_bytes pool, kva__page_pairs pairs) {
    const int64_t src = pairs.src[blockIdx.y], dst = pairs.dst[blockIdx.y];
    if (src == dst) return;
    const int64_t units = (int64_t)pool.page_size * pool.num_kv_heads * pool.row_units;
    for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < units;
         u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = u / pool.row_units;
        const int c = (int)(u - row * pool.row_units);
        const int64_t t = row / pool.num_kv_heads;
        const int h = (int)(row - t * pool.num_kv_heads);
        const int64_t o = t * pool.st + h * pool.sh + (int64_t)c * sizeof(U);
        *reinterpret_cast<U *>(pool.k + dst * pool.sp + o) =
            *reinterpret_cast<const U *>(pool.k + src * pool.sp + o);
        *reinterpret_cast<U *>(pool.v + dst * pool.sp + o) =
            *reinterpret_cast<const U *>(pool.v + src * pool.sp + o);
    }
}

/* Largest unit (16, 4 or 2 bytes) dividing every byte quantity given. */
static int unit_bytes(const int64_t *q, int n, int es) {
    int u = 16;
    for (int i = 0; i < n; ++i)
        while (u > es && q[i] % u != 0) u >>= 1;
    return u < es ? es : u;
}

static kva__pool_bytes pool_bytes(const kva_kv_pages *p, int unit) {
    const int64_t es = (int64_t)kva_dtype_size(p->dtype);
    kva__pool_bytes b;
    b.k = (unsigned char *)p->k_data;
    b.v = (unsigned char *)p->v_data;
    b.sp = p->stride_page * es;
    b.st = p->stride_token * es;
    b.sh = p->stride_head * es;
    b.page_size = p->page_size;
    b.num_kv_heads = p->num_kv_heads;
    b.row_units = (int32_t)((int64_t)p->head_dim * es / unit);
    return b;
}

static unsigned grid_for(int64_t units) {
    int64_t g = (units + KVA__COPY_THREADS - 1) / KVA__COPY_THREADS;
    return (unsigned)(g < 1 ? 1 : g > 4096 ? 4096 : g);
}

extern "C" kva_status kva__cuda_append(kva_context *ctx, const kva_kv_pages *pages,
                                       int32_t num_tokens, const int64_t *slots_host,
                                       int64_t *slots_dev, kva_tensor k, kva_tensor v) {
    if (num_tokens <= 0) return KVA_OK;
    KVA_TRY(kva__cuda_use_device(ctx));
    cudaStream_t s = kva__stream(ctx);
    KVA_CUDA_TRY(cudaMemcpyAsync(slots_dev, slots_host, sizeof(int64_t) * (size_t)num_tokens,
                                 cudaMemcpyHostToDevice, s));
    const int es = (int)kva_dtype_size(pages->dtype);
    const int64_t q[] = {(int64_t)pages->head_dim * es, pages->stride_page * es,
                         pages->stride_token * es, pages->stride_head * es,
                         k.stride_token * es, k.stride_head * es, v.stride_token * es,
                         v.stride_head * es, (int64_t)(uintptr_t)pages->k_data,
                         (int64_t)(uintptr_t)pages->v_data, (int64_t)(uintptr_t)k.data,
                         (int64_t)(uintptr_t)v.data};
    const int unit = unit_bytes(q, (int)(sizeof q / sizeof q[0]), es);
    kva__pool_bytes pool = pool_bytes(pages, unit);
    const int64_t units = (int64_t)num_tokens * pages->num_kv_heads * pool.row_units;
    const unsigned char *ks = (const unsigned char *)k.data, *vs = (const unsigned char *)v.data;
    const int64_t kst = k.stride_token * es, ksh = k.stride_head * es;
    const int64_t vst = v.stride_token * es, vsh = v.stride_head * es;
    if (unit == 16)
        kva__append_kernel<uint4><<<grid_for(units), KVA__COPY_THREADS, 0, s>>>(pool, units, slots_dev, ks, vs, kst, ksh, vst, vsh);
    else if (unit == 4)
        kva__append_kernel<uint32_t><<<grid_for(units), KVA__COPY_THREADS, 0, s>>>(pool, units, slots_dev, ks, vs, kst, ksh, vst, vsh);
    else if (unit == 8)
        kva__append_kernel<uint2><<<grid_for(units), KVA__COPY_THREADS, 0, s>>>(pool, units, slots_dev, ks, vs, kst, ksh, vst, vsh);
    else
        kva__append_kernel<uint16_t><<<grid_for(units), KVA__COPY_THREADS, 0, s>>>(pool, units, slots_dev, ks, vs, kst, ksh, vst, vsh);
    KVA_CUDA_LAUNCHED("the append kernel");
    return KVA_OK;
}

extern "C" kva_status kva__cuda_copy_pages(kva_context *ctx, const kva_kv_pages *pages, int32_t n,
                                           const int32_t *src, const int32_t *dst) {
    if (n <= 0) return KVA_OK;
    KVA_TRY(kva__cuda_use_device(ctx));
    cudaStream_t s = kva__stream(ctx);
    const int es = (int)kva_dtype_size(pages->dtype);
    const int64_t q[] = {(int64_t)pages->head_dim * es, pages->stride_page * es,
                         pages->stride_token * es, pages->stride_head * es,
                         (int64_t)(uintptr_t)pages->k_data, (int64_t)(uintptr_t)pages->v_data};
    const int unit = unit_bytes(q, (int)(sizeof q / sizeof q[0]), es);
    kva__pool_bytes pool = pool_bytes(pages, unit);
    const int64_t units = (int64_t)pages->page_size * pages->num_kv_heads * pool.row_units;
    unsigned gx = grid_for(units);
    if (gx > 64) gx = 64;
    for (int32_t base = 0; base < n; base += KVA__COPY_BATCH) {
        const int cnt = n - base < KVA__COPY_BATCH ? n - base : KVA__COPY_BATCH;
        kva__page_pairs pairs;
        for (int i = 0; i < cnt; ++i) {
            pairs.src[i] = src[base + i];
            pairs.dst[i] = dst[base + i];
        }
        dim3 grid(gx, (unsigned)cnt);
        if (unit == 16)
            kva__copy_pages_kernel<uint4><<<grid, KVA__COPY_THREADS, 0, s>>>(pool, pairs);
        else if (unit == 8)
            kva__copy_pages_kernel<uint2><<<grid, KVA__COPY_THREADS, 0, s>>>(pool, pairs);
        else if (unit == 4)
            kva__copy_pages_kernel<uint32_t><<<grid, KVA__COPY_THREADS, 0, s>>>(pool, pairs);
        else
            kva__copy_pages_kernel<uint16_t><<<grid, KVA__COPY_THREADS, 0, s>>>(pool, pairs);
        KVA_CUDA_LAUNCHED("the page-copy kernel");
    }
    return KVA_OK;
}
