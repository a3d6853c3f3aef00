/*
 * test_cuda_util.h -- fixtures of the GPU tests (tests/test_cuda_*.c): a CUDA context (or a
 * skip), device copies of host buffers, and a random paged batch that lives both in host memory
 * (for the float64 reference) and in device memory (for the kernels). Everything goes through
 * the public API.
 *
 * The host pool is poisoned with NaN before the batch's rows are filled, so unreferenced pages,
 * slots past a request's length and stride padding are NaN: a kernel that reads any of them
 * produces NaN and fails the comparison.
 */
#ifndef KVA_TEST_CUDA_UTIL_H
#define KVA_TEST_CUDA_UTIL_H

#include "kvattn.h"
#include "test_util.h"

#include <stdbool.h>

/* A CUDA context on device 0, or NULL after marking the test skipped (no GPU / no CUDA). */
kva_context *cuda_test_context(void);

/* Device copy of bytes of host memory (test fails and returns NULL on error). */
void *cuda_test_upload(kva_context *ctx, const void *host, size_t bytes);
/* Device buffer filled with the NaN poison pattern. */
void *cuda_test_poisoned(kva_context *ctx, size_t bytes);
/* Host copy of device memory (caller frees). */
void *cuda_test_download(kva_context *ctx, const void *dev, size_t bytes);

/* Page-pool layouts the sweeps rotate through. */
enum {
    CUDA_TEST_NHD = 0,
    CUDA_TEST_HND = 1,
    CUDA_TEST_NHD_INTERLEAVED = 2,
    CUDA_TEST_HND_INTERLEAVED = 3,
    CUDA_TEST_PADDED = 4, /* NHD with padded head, token and page strides */
    CUDA_TEST_NUM_LAYOUTS = 5
};
const char *cuda_test_layout_name(int layout);

typedef struct cuda_paged_batch {
    kva_dtype dtype;
    int32_t batch, num_kv_heads, head_dim, page_size, num_pages;
    int32_t *indptr, *indices, *last_page_len, *kv_len; /* host CSR table */
    kva_page_table table;
    kva_kv_pages host_pages, dev_pages;
    void *host_pool, *dev_pool;
    size_t pool_bytes;
} cuda_paged_batch;

/* Builds a batch with the given lengths (kv_len[b] keys each) on shuffled physical pages of a
 * pool with a few spare pages, filled with random values in [-1, 1). */
bool cuda_paged_batch_make(kva_context *ctx, kva_rng *rng, kva_dtype dtype, int32_t batch,
                           const int32_t *kv_len, int32_t num_kv_heads, int32_t head_dim,
                           int32_t page_size, int layout, cuda_paged_batch *out);
void cuda_paged_batch_free(kva_context *ctx, cuda_paged_batch *pb);

/* A request length for sweeps: 0, 1, max_len, or an odd length in between. */
int32_t cuda_test_pick_len(kva_rng *rng, int32_t max_len);

/* float64 reference decode of the whole batch: q_host [batch][Hq][D] of dtype; o_ref
 * [batch][Hq][D], lse_ref [batch][Hq] (caller allocates). */
void cuda_ref_decode(const cuda_paged_batch *pb, const kva_attn_params *p, const void *q_host,
                     double *o_ref, double *lse_ref);

/* Device workspace sized for `limits` (decode plans). */
typedef struct cuda_test_workspace {
    kva_workspace ws;
} cuda_test_workspace;
bool cuda_test_workspace_make(kva_context *ctx, const kva_plan_limits *limits,
                              cuda_test_workspace *out);
void cuda_test_workspace_free(kva_context *ctx, cuda_test_workspace *w);

#endif
