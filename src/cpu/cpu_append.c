/*
 * cpu_append.c -- the CPU backend's two page-pool writers, used by the cache manager:
 *   - kva__cpu_append scatters token rows of K and V into pool slots (slot = page * page_size +
 *     offset), one head_dim row per (token, head), through the pool's strides;
 *   - kva__cpu_copy_pages copies whole pages (K and V halves) for copy-on-write;
 *   - kva__cpu_prefault makes a pool resident (one atomic no-op write per 4 KB page) with the
 *     context's threads.
 * All are pure memory traffic: each byte is read once and written once.
 */
#include "cpu_backend.h"
#include "../common/internal.h"

#include <string.h>

/* Below this many bytes moved, starting the worker threads costs more than the copy itself
 * (one decode step of a small batch); prefill-sized appends are split across threads. */
#define KVA__CPU_APPEND_PARALLEL_BYTES ((int64_t)1 << 20)

typedef struct append_job {
    const kva_kv_pages *pages;
    const int64_t *slots;
    kva_tensor k, v;
    size_t es, row_bytes;
} append_job;

static void append_token(void *arg, int64_t i, int thread) {
    (void)thread;
    const append_job *J = (const append_job *)arg;
    const kva_kv_pages *pages = J->pages;
    const size_t es = J->es;
    const int64_t page = J->slots[i] / pages->page_size, offset = J->slots[i] % pages->page_size;
    const int64_t dst_token = page * pages->stride_page + offset * pages->stride_token;
    const unsigned char *k_src = J->k.data, *v_src = J->v.data;
    for (int32_t h = 0; h < pages->num_kv_heads; ++h) {
        size_t dst = (size_t)(dst_token + h * pages->stride_head) * es;
        memcpy((unsigned char *)pages->k_data + dst,
               k_src + (size_t)(i * J->k.stride_token + h * J->k.stride_head) * es, J->row_bytes);
        memcpy((unsigned char *)pages->v_data + dst,
               v_src + (size_t)(i * J->v.stride_token + h * J->v.stride_head) * es, J->row_bytes);
    }
}

kva_status kva__cpu_append(kva_context *ctx, const kva_kv_pages *pages, int32_t num_tokens,
                           const int64_t *slots, kva_tensor k, kva_tensor v) {
    const size_t es = kva_dtype_size(pages->dtype);
    const size_t row_bytes = (size_t)pages->head_dim * es;
    const int64_t bytes = 2 * (int64_t)num_tokens * pages->num_kv_heads * (int64_t)row_bytes;
    append_job J = {pages, slots, k, v, es, row_bytes};
    const int threads = bytes >= KVA__CPU_APPEND_PARALLEL_BYTES && ctx->num_threads > 1 ? ctx->num_threads : 1;
    /* contiguous shares of the tokens, a few per thread so that a late worker costs little */
    kva__pool_for(&ctx->cpu_pool, threads, num_tokens, kva__ceil_div64(num_tokens, 4 * (int64_t)threads),
                  append_token, &J);
    return KVA_OK;
}

/* True if one half (K or V) of a page is page_size * heads * head_dim contiguous elements. */
static bool half_page_is_contiguous(const kva_kv_pages *p) {
    int64_t d = p->head_dim;
    bool nhd = p->stride_head == d && p->stride_token == (int64_t)p->num_kv_heads * d;
    bool hnd = p->stride_token == d && p->stride_head == (int64_t)p->page_size * d;
    return nhd || hnd || (p->page_size == 1 && p->num_kv_heads == 1);
}

static void copy_half_page(unsigned char *pool, const kva_kv_pages *p, bool contiguous,
                           int64_t src, int64_t dst, size_t es) {
    unsigned char *s = pool + (size_t)(src * p->stride_page) * es;
    unsigned char *d = pool + (size_t)(dst * p->stride_page) * es;
    size_t row_bytes = (size_t)p->head_dim * es;
    if (contiguous) {
        memcpy(d, s, (size_t)p->page_size * (size_t)p->num_kv_heads * row_bytes);
        return;
    }
    for (int32_t t = 0; t < p->page_size; ++t)
        for (int32_t h = 0; h < p->num_kv_heads; ++h) {
            size_t off = (size_t)(t * p->stride_token + h * p->stride_head) * es;
            memcpy(d + off, s + off, row_bytes);
        }
}

kva_status kva__cpu_copy_pages(kva_context *ctx, const kva_kv_pages *pages, int32_t n,
                               const int32_t *src, const int32_t *dst) {
    (void)ctx; /* a handful of pages per reserve: not worth threads */
    const size_t es = kva_dtype_size(pages->dtype);
    const bool contiguous = half_page_is_contiguous(pages);
    for (int32_t i = 0; i < n; ++i) {
        copy_half_page(pages->k_data, pages, contiguous, src[i], dst[i], es);
        copy_half_page(pages->v_data, pages, contiguous, src[i], dst[i], es);
    }
    return KVA_OK;
}

/* A pool's first touch costs a page fault per page, and with 2 MB pages under the kernel's
 * "defrag on madvise" a fault zeroes (and may compact) 2 MB while the faulting thread waits: a
 * kvattn run's appends spent 0.46 s of 6 s there against 0.08 s with 4 KB pages (Zen 5). Touching
 * the pool first, 2 MB frames split across the threads, keeps that out of the runs. Each touch is
 * an atomic OR of 0 into one byte of every 4 KB page: a write fault from the start (a read first
 * would map the shared zero page and a later write would then have to replace it, possibly with
 * 4 KB pages), and no stored value changes. */
typedef struct prefault_job {
    unsigned char *base;
    size_t bytes;
} prefault_job;

static void prefault_frame(void *arg, int64_t f, int thread) {
    (void)thread;
    const prefault_job *J = (const prefault_job *)arg;
    const size_t frame = (size_t)2 << 20, page = 4096;
    const size_t off = (size_t)f * frame, end = J->bytes - off < frame ? J->bytes : off + frame;
    for (size_t b = off; b < end; b += page) (void)__atomic_fetch_or(J->base + b, (unsigned char)0, __ATOMIC_RELAXED);
    (void)__atomic_fetch_or(J->base + end - 1, (unsigned char)0, __ATOMIC_RELAXED); /* a last partial page */
}

void kva__cpu_prefault(kva_context *ctx, void *p, size_t bytes) {
    const size_t frame = (size_t)2 << 20;
    const int64_t frames = (int64_t)((bytes + frame - 1) / frame);
    prefault_job J = {(unsigned char *)p, bytes};
    const int threads = ctx->num_threads > 0 ? ctx->num_threads : 1;
    kva__pool_for(&ctx->cpu_pool, threads, frames, kva__ceil_div64(frames, 4 * (int64_t)threads), prefault_frame,
                  &J);
}
