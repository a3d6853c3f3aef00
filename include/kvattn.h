/*
 * kvattn.h -- attention for LLM inference over a paged KV cache, on the CPU and on NVIDIA GPUs.
 *
 * This one header is the whole public API. It is C11 and safe to include from C++.
 *
 * Concepts, in the order a serving engine meets them:
 *   - kva_context: where work runs (CPU with N threads, or one CUDA device + a caller stream).
 *     Every failing call returns a kva_status; kva_last_error() gives the detailed message of the
 *     last failure on the calling thread. The library never exits or aborts.
 *   - kva_tensor: a strided 3-D view [tokens, heads, head_dim] (innermost dim contiguous), so
 *     NHD ([tokens, heads, dim]) and HND ([heads, tokens, dim]) buffers both work.
 *   - kva_kv_pages + kva_page_table: a paged K/V pool addressed by strides, and the CSR page table
 *     (indptr, indices, last_page_len) that says which pages hold which request's tokens.
 *   - plan / run: kva_decode_plan() and kva_prefill_plan() are pure host arithmetic over the
 *     lengths (split-KV chunk size by binary search, flattened (request, chunk) work arrays) and
 *     write their result into a caller-provided workspace; *_run() executes it. Nothing in a run
 *     allocates, so runs can be captured in CUDA graphs, and one plan serves every layer.
 *   - kva_cache: an optional paged KV cache manager (block allocator, page tables, fork with
 *     copy-on-write, append) that produces the two views above.
 *
 * Numbers: inputs f32, f16 or bf16; accumulation always in f32. The log-sum-exp (LSE) outputs are
 * natural-log, f32, one per (query token, query head). An empty key range gives output 0 and
 * LSE = -INFINITY, never NaN.
 *
 * Threads: a context (and a cache) must not be used by two threads at once (a CPU context's
 * scratch is shared by its calls); use one context per calling thread. Different contexts are
 * independent.
 *
 * Memory: the library allocates only in *_create() functions and in the kva_malloc family. All
 * tensors, workspaces and outputs are owned by the caller. "device memory" below means memory of
 * the context's device: ordinary host memory for a CPU context, cudaMalloc'd memory for CUDA.
 */
#ifndef KVATTN_H
#define KVATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVA_VERSION_MAJOR 0
#define KVA_VERSION_MINOR 1
#define KVA_VERSION_PATCH 0

/* ------------------------------------------------------------------------------------------ */
/* Status codes                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef enum kva_status {
    KVA_OK = 0,
    KVA_ERR_INVALID_ARG = 1,         /* null pointer, unknown enum value, negative count */
    KVA_ERR_BAD_SHAPE = 2,           /* shapes, strides or indptr arrays inconsistent */
    KVA_ERR_UNSUPPORTED = 3,         /* dtype / head_dim / variant not supported on this device */
    KVA_ERR_OUT_OF_RANGE = 4,        /* page id outside the pool, length beyond its pages */
    KVA_ERR_NO_SPACE = 5,            /* the cache has too few free pages; nothing was changed */
    KVA_ERR_WORKSPACE_TOO_SMALL = 6, /* the workspace is smaller than *_workspace_size() said */
    KVA_ERR_NOT_BUILT = 7,           /* the requested backend (CUDA) was not compiled in */
    KVA_ERR_DEVICE = 8,              /* the CUDA runtime reported an error */
    KVA_ERR_OUT_OF_MEMORY = 9,       /* a host or device allocation failed */
    KVA_ERR_BAD_STATE = 10           /* unknown sequence id, plan used with the wrong run, ... */
} kva_status;

/* Short constant name of a status ("KVA_ERR_NO_SPACE"). Never NULL. */
const char *kva_status_str(kva_status status);

/* Detailed message of the last failing call made by this thread ("" if none). The string stays
 * valid until the next failing call on this thread. */
const char *kva_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Data types                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef enum kva_dtype {
    KVA_F32 = 0,
    KVA_F16 = 1,  /* IEEE binary16 */
    KVA_BF16 = 2  /* bfloat16 */
} kva_dtype;

/* Bytes per element (4, 2, 2), or 0 for an unknown dtype. */
size_t kva_dtype_size(kva_dtype dtype);
/* "f32", "f16", "bf16", or "?" */
const char *kva_dtype_name(kva_dtype dtype);

/* Host-memory conversion of n elements between any two dtypes (round to nearest even; NaN stays
 * NaN; f16 overflow becomes infinity). src and dst must be aligned to their element sizes
 * (KVA_ERR_BAD_SHAPE otherwise). Overlap: any, for equal dtypes (a move); otherwise only dst == src
 * with dst's elements no wider than src's (narrowing in place). */
kva_status kva_convert(const void *src, kva_dtype src_dtype, void *dst, kva_dtype dst_dtype,
                       size_t n);

/* ------------------------------------------------------------------------------------------ */
/* Context, devices and memory                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef enum kva_device_type { KVA_DEVICE_CPU = 0, KVA_DEVICE_CUDA = 1 } kva_device_type;

typedef struct kva_context kva_context;

/* Creates a context on the CPU (device_id ignored; threads = the cores the calling thread may run
 * on: its affinity mask, e.g. taskset or a container's cpuset) or on CUDA device
 * device_id (stream = the legacy default stream until kva_context_set_stream). The CPU context
 * also owns the per-thread scratch its kernels use, so runs never allocate, and picks its CPU
 * kernel variant once: the best this CPU runs (AVX-512, AVX2, NEON or generic), or the one the
 * environment variable KVA_CPU_ISA names (avx512 | avx2 | neon | generic | auto). A CUDA
 * context picks its prefill kernels once: the warp-specialised Hopper kernel on an sm_90 device
 * when the build holds sm_90a code, else the mma.sync kernels; the environment variable
 * KVA_PREFILL_PATH (mma | wgmma | hopper; for tests and comparisons) forces one. The other test
 * knobs a CUDA context reads (KVA_DECODE_GROUP_PATH = subgroups | prefill, KVA_PREFILL_PERSISTENT
 * and KVA_PREFILL_BALANCE_MIN_TILES = a number, KVA_PREFILL_TMA_STRICT and KVA_PREFILL_TURNS = 0 | 1,
 * KVA_DECODE_MERGE_WAIT_NS = a number: how long a split decode's early blocks wait without a new
 * chunk arriving before they leave its shared merge, 100000 by default; KVA_DECODE_SHARED_MERGE =
 * 0 | 1: 0 leaves every split merge to one block or a tree, and GQA groups above 16 on the prefill
 * kernel on Hopper; KVA_DECODE_PAIR_HEADS = 0 | 1: decode units of two adjacent KV heads where one
 * head's row is not whole 128-byte lines -- f16 / bf16 d32 and d96, pools whose head stride is the
 * head dim (NHD), an even KV-head count, GQA groups <= 4, a variant built for both head dims;
 * a captured graph keeps its capture's choice --, unset: for plans that split no request, 1: for
 * every plan, 0: never) are checked here.
 * @return KVA_OK, KVA_ERR_NOT_BUILT (CUDA not compiled in), KVA_ERR_DEVICE (no such device),
 *         KVA_ERR_UNSUPPORTED (KVA_CPU_ISA names a variant this build or CPU cannot run, or
 *         KVA_PREFILL_PATH a path that does not exist or this build or device lacks, or another
 *         knob a value it does not know). */
kva_status kva_context_create(kva_device_type device, int device_id, kva_context **out);
/* NULL is a no-op. No call may use ctx afterwards, except kva_cache_destroy on caches created
 * with it: their memory is released there, and ctx itself with the last of them. */
void kva_context_destroy(kva_context *ctx);

/* The context's device (KVA_DEVICE_CPU for NULL: a query, not a call that can fail). */
kva_device_type kva_context_device(const kva_context *ctx);

/* CPU: number of threads for later calls (the caller and num_threads - 1 workers); 0 = the
 * cores counted at creation. Workers start at the first call that splits work; after a call they
 * poll for the next for 0.2 ms, then sleep; a call never waits for a worker that has not started
 * on it (the caller and the others take its tasks). kva_context_destroy joins them. Ignored on
 * CUDA. */
kva_status kva_context_set_threads(kva_context *ctx, int num_threads);
/* The context's thread count (0 for NULL). */
int kva_context_threads(const kva_context *ctx);

/* The CPU kernel variant a CPU context runs: "avx512", "avx2", "neon" or "generic", chosen at
 * creation. NULL for a CUDA context (it runs no CPU kernels) or a NULL ctx. */
const char *kva_cpu_variant(const kva_context *ctx);

/* CUDA: the cudaStream_t that every later call of this context enqueues on. Ignored on CPU. */
kva_status kva_context_set_stream(kva_context *ctx, void *cuda_stream);

/* 1 if this build has the CUDA backend and at least one CUDA device is visible, else 0. */
int kva_cuda_available(void);

typedef struct kva_device_info {
    char name[128];          /* "NVIDIA H100 80GB HBM3", or the CPU model */
    int num_sms;             /* CUDA multiprocessors, or CPU threads of the context */
    size_t l2_bytes;         /* CUDA L2 size, 0 on the CPU */
    size_t total_memory;     /* device memory in bytes (0 if unknown on the CPU) */
    size_t free_memory;      /* CUDA: device memory free at the call, for every process on the
                                device (cudaMemGetInfo); 0 on the CPU */
} kva_device_info;
kva_status kva_context_info(const kva_context *ctx, kva_device_info *info);

/* Memory of the context's device (cudaMalloc on CUDA, 64-byte aligned host memory on the CPU).
 * On the CPU a block of 2 MB or more is 2 MB aligned and, on Linux, advised for transparent huge
 * pages (madvise MADV_HUGEPAGE; silently 4 KB pages where the system gives none; the environment
 * variable KVA_HUGE_PAGES=0 turns the advice off): decode reads K/V pages in a shuffled order
 * and 4 KB pages cost it a TLB miss every 4 KB (20-35% of its speed from DRAM, measured).
 * Callers that allocate their K/V pools themselves should do the same, or use kva_malloc. */
/* @return KVA_ERR_OUT_OF_MEMORY (and *ptr = NULL) when bytes cannot be allocated, including sizes
 * too large to round up to the alignment. */
kva_status kva_malloc(kva_context *ctx, size_t bytes, void **ptr);
void kva_free(kva_context *ctx, void *ptr);
/* Host memory suitable for a workspace's host part (pinned on CUDA, aligned on the CPU). */
kva_status kva_host_alloc(kva_context *ctx, size_t bytes, void **ptr);
void kva_host_free(kva_context *ctx, void *ptr);

typedef enum kva_copy_kind {
    KVA_COPY_HOST_TO_DEVICE = 0,
    KVA_COPY_DEVICE_TO_HOST = 1,
    KVA_COPY_DEVICE_TO_DEVICE = 2
} kva_copy_kind;
/* Copies bytes on the context's stream; returns once the copy is done (it synchronises). */
kva_status kva_memcpy(kva_context *ctx, void *dst, const void *src, size_t bytes,
                      kva_copy_kind kind);
/* Waits for all work the context enqueued. */
kva_status kva_synchronize(kva_context *ctx);

/* ------------------------------------------------------------------------------------------ */
/* Tensor views                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* A 3-D view [tokens, heads, head_dim] in device memory. Element (t, h, i) lives at
 * data + (t * stride_token + h * stride_head + i) elements. head_dim is contiguous and the
 * extents come from the call (token counts from indptr arrays, heads and head_dim from
 * kva_attn_params). data must be 16-byte aligned and both strides multiples of 8 elements for
 * f16/bf16 (4 for f32), so rows can be loaded as 16-byte vectors. The rows of an output (o) must
 * not share elements (a zero or too small stride: KVA_ERR_BAD_SHAPE); those of inputs may. */
typedef struct kva_tensor {
    void *data;
    kva_dtype dtype;
    int64_t stride_token; /* elements */
    int64_t stride_head;  /* elements */
} kva_tensor;

/* [tokens, heads, head_dim], contiguous. */
kva_tensor kva_tensor_nhd(void *data, kva_dtype dtype, int32_t num_heads, int32_t head_dim);
/* [heads, tokens, head_dim], contiguous; num_tokens is the allocated token extent. */
kva_tensor kva_tensor_hnd(void *data, kva_dtype dtype, int64_t num_tokens, int32_t head_dim);

/* ------------------------------------------------------------------------------------------ */
/* Paged K/V: the page pool and the CSR page table                                              */
/* ------------------------------------------------------------------------------------------ */

typedef enum kva_layout {
    KVA_LAYOUT_NHD = 0, /* inside a page: [page_size, kv_heads, head_dim] */
    KVA_LAYOUT_HND = 1  /* inside a page: [kv_heads, page_size, head_dim] */
} kva_layout;

/* One layer's K and V pages in device memory. Element i of head h of slot t (0 <= t < page_size)
 * of physical page p is at k_data + p*stride_page + t*stride_token + h*stride_head + i elements
 * (same offsets from v_data for V). This covers separate K and V pools and the interleaved pool
 * [num_pages, 2, page...] of paged-attention engines (v_data = k_data + one half page). */
typedef struct kva_kv_pages {
    void *k_data;
    void *v_data;
    kva_dtype dtype;
    int32_t num_pages;    /* pool size: valid physical page ids are 0 .. num_pages-1 */
    int32_t page_size;    /* tokens per page, 1 .. 65536 */
    int32_t num_kv_heads;
    int32_t head_dim;
    int64_t stride_page;  /* elements */
    int64_t stride_token; /* elements */
    int64_t stride_head;  /* elements */
} kva_kv_pages;

/* Separate pools k_data, v_data, each [num_pages, page...] in the given layout. */
kva_kv_pages kva_kv_pages_separate(void *k_data, void *v_data, kva_dtype dtype, int32_t num_pages,
                                   int32_t page_size, int32_t num_kv_heads, int32_t head_dim,
                                   kva_layout layout);
/* One pool [num_pages, 2, page...]: K is half 0 of each page, V half 1. */
kva_kv_pages kva_kv_pages_interleaved(void *data, kva_dtype dtype, int32_t num_pages,
                                      int32_t page_size, int32_t num_kv_heads, int32_t head_dim,
                                      kva_layout layout);

/* The CSR page table of a batch, in HOST memory. Request b owns physical pages
 * indices[indptr[b] .. indptr[b+1]-1], in logical order. Its length in tokens is
 *     kv_len(b) = 0                                               if it has no pages,
 *               = (num_pages(b) - 1) * page_size + last_page_len[b]  otherwise,
 * with 1 <= last_page_len[b] <= page_size when it has pages (last_page_len[b] is ignored, and may
 * be 0, when it has none). indptr[0] must be 0 and indptr non-decreasing. */
typedef struct kva_page_table {
    int32_t batch_size;
    const int32_t *indptr;        /* [batch_size + 1] */
    const int32_t *indices;       /* [indptr[batch_size]] */
    const int32_t *last_page_len; /* [batch_size] */
} kva_page_table;

/* Converts a dense block table (vLLM style) into CSR. block_table is [batch][max_blocks_per_seq]
 * (row-major, host), context_lens [batch]. Writes indptr_out [batch+1], indices_out (capacity
 * indices_capacity entries) and last_page_len_out [batch]. Entries of block_table past a
 * request's ceil(context_len / page_size) blocks are ignored.
 * @return KVA_ERR_OUT_OF_RANGE if a context needs more than max_blocks_per_seq blocks,
 *         KVA_ERR_WORKSPACE_TOO_SMALL if indices_capacity is too small. */
kva_status kva_block_table_to_csr(const int32_t *block_table, int32_t batch_size,
                                  int32_t max_blocks_per_seq, const int32_t *context_lens,
                                  int32_t page_size, int32_t *indptr_out, int32_t *indices_out,
                                  int32_t indices_capacity, int32_t *last_page_len_out);

/* ------------------------------------------------------------------------------------------ */
/* Attention variants                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Optional score modifier (CPU only): called on every visible score after scaling and soft-cap,
 * with the query's and key's absolute positions in their sequence and the query head. Return
 * -INFINITY to mask the key. Must be thread-safe (called from worker threads). On CUDA the same
 * modifier is a kva_variant (below). */
typedef float (*kva_score_mod_fn)(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head,
                                  void *user);

/* A score modifier for the GPU: CUDA C source compiled at run time with NVRTC (seed 002's
 * scoremod), inlined into the decode and prefill kernels in place of the built-in variant code.
 * The source defines a device function with the score_mod signature, user data in device memory:
 *
 *     float my_mod(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user)
 *
 * (functions are device functions by default: no __device__ needed). It is called where the CPU
 * calls score_mod -- on each visible score, natural-log units, after sm_scale and the soft cap,
 * before the causal / window masks -- with `user` = kva_attn_params.score_mod_user. It only sees
 * a request's own positions and heads: masked keys and keys past the request's end are never
 * passed (kernels may also evaluate it for padding rows of a tile, with a real query's position,
 * and in place of a masked key or a key past the end, with a key the same query sees and a score
 * of 0 -- in decode any score --, and discard those results), so it may index caller data by
 * kv_pos (0 .. kv_len-1), q_pos
 * (kv_len - qo_len .. kv_len-1: negative only for requests with more queries than keys) and
 * qo_head (0 .. num_qo_heads-1). Return -INFINITY to mask a key (a row that sees no key gets
 * output 0 and LSE -inf, as everywhere); NaN or a score beyond the range of kva_attn_params
 * makes the row NaN (with one difference from the built-in path: a dot product of -inf -- an
 * f32 overflow, or an infinite element of Q or K -- may reach the modifier as -inf and then
 * weigh 0 like a masked key, where the built-in path makes the row NaN; in prefill tiles that
 * cross a mask boundary it reaches it as NaN).
 * What it may use: float and integer arithmetic, the CUDA math functions (expf, logf, tanhf,
 * ...; compiled with --use_fast_math like the library, so tanhf/expf are the fast approximations:
 * kva_tanhf(x) is the tanh of the built-in soft cap in the same kernel -- the hardware tanh
 * (relative error <= 2^-10.99) in the f16/bf16 prefill kernels, tanh to ~1e-7 (and a few ulp
 * relative near 0) in decode and f32 -- so a soft cap written as a modifier computes what
 * logits_soft_cap does), loads
 * through `user` (per score, though the decode kernels call it for a whole key tile at once, so
 * loads that do not depend on the positions are shared by the tile's calls: keep the others few;
 * likewise write a division by such a value as a product with its reciprocal, x * (1.0f / c):
 * under --use_fast_math x / c is a reciprocal instruction per score, 1.0f / c one per tile),
 * and the names of the prelude
 * (int32_t and the other fixed-width integers, INFINITY, NAN, kva_tanhf, kva_masked() =
 * -INFINITY, kva_int_to_float(x): (float)x for |x| < 2^22 without the quarter-rate conversion
 * instruction). It must be a pure function of its arguments and the data behind `user` (kernels
 * may call it more than once for one score, in any order, from any thread) and may not write
 * memory, synchronise or #include headers. Helper functions, constants and __device__ arrays may
 * sit beside it; names starting with kva_ / KVA_ are the library's, except one switch the source
 * may define (to any value, or none): KVA_VARIANT_PINGPONG lets the Hopper prefill kernel's
 * consumer warpgroups take turns issuing on every call (built head dims 64 and 128; two
 * warpgroups, three at d64) -- worth it for a modifier with heavy work per score (a tanh: the
 * soft cap as a modifier ran 1.3 points closer to the built-in cap with turns, H200, bf16 d128,
 * 16k causal), a loss for a light one on long rows (an identity modifier: 3 points slower there).
 * Without it a d128 call takes the turns where the built-in path does -- decode records and
 * causal calls whose plan's key chunk is at most 1024 keys, short items, where they made ALiBi
 * and an identity modifier 3-6% faster (32 x 512 causal) -- and none on longer or full-mask calls
 * (the module holds both builds of the kernel; KVA_PREFILL_TURNS=0 / 1 forces either, as for the
 * built-in path); at d64 none but for the built-in ALiBi (always). Results are the same either
 * way.
 * Supported paths: the kernels a variant was compiled for (kva_variant_options): CUDA decode
 * (both algorithms), ragged and paged prefill (mma.sync; on Hopper the warp-specialised TMA
 * kernel and the wgmma one; f32 on CUDA cores) and kva_attention: the kernel the built-in path
 * would run, with the modifier inlined. A run that needs a kernel the variant lacks fails with
 * KVA_ERR_UNSUPPORTED.
 * Lifetime and threads: a variant is immutable after creation; any thread may use it in runs of
 * any context on the device it was created for, at once (kva_variant_create itself follows the
 * context's rule: one thread at a time per context). Destroy it only when no run that uses it is
 * in flight and no CUDA graph captured with it will be replayed. The context stays alive until
 * its last variant is destroyed (as with caches) and keeps the compiled modules loaded until it
 * is freed, so creating the same variant again costs a lookup. Compilation happens only in
 * kva_variant_create: plans, runs and graph capture are unchanged. The data behind `user` is read
 * in stream order: a run sees what every earlier kernel and copy on its stream wrote there (its
 * decode kernel may start before the previous kernel ends, as the built-in one does on sm_90+, but
 * reads caller data only after that kernel has completed). */
typedef struct kva_variant kva_variant;

enum {
    KVA_VARIANT_DECODE = 1 << 0,  /* kva_decode_run */
    KVA_VARIANT_PREFILL = 1 << 1  /* kva_prefill_run_ragged / _paged, kva_attention */
};

/* Which kernels to compile (NVRTC takes seconds the first time: 1.5-6 s per creation measured; later
 * creations load them from the cache). Zeroed fields mean "all". */
typedef struct kva_variant_options {
    uint32_t kinds;    /* KVA_VARIANT_DECODE | KVA_VARIANT_PREFILL bits; 0 = both */
    uint32_t dtypes;   /* bits (1u << KVA_F32) | (1u << KVA_F16) | (1u << KVA_BF16); 0 = all */
    int32_t head_dim;  /* 0 = every head dim; else the kernels that serve this head dim */
} kva_variant_options;

/* Compiles `source`'s device function `function` into the kernels `options` names (NULL: all)
 * for ctx's device architecture (sm_90a on Hopper, so the wgmma prefill runs), or loads them
 * from the context (a variant made earlier with it) or from the disk cache: $XDG_CACHE_HOME/kvattn,
 * else ~/.cache/kvattn, one file per module, keyed by a hash of the source, function, options,
 * compiler, architecture and library (version and kernel sources). A cache entry that is
 * unreadable, corrupt (checksum) or stale (another key) is rebuilt, never trusted; a failing
 * cache write only costs the next process a compile. No CUDA toolkit is needed: the kernel
 * sources are part of the library and NVRTC (libnvrtc) is its only compiler. libnvrtc is opened
 * on the first call (libnvrtc.so.<CUDA major>, libnvrtc.so, then the build toolkit's directory;
 * the environment variable KVA_NVRTC_LIBRARY names another file), so the library itself loads
 * and runs everything else on machines without it.
 * @return KVA_OK; KVA_ERR_INVALID_ARG for NULL source or out, a function name that is not a C
 *         identifier, bad options, or a source that does not compile (kva_last_error() then
 *         holds NVRTC's log); KVA_ERR_UNSUPPORTED on a CPU context (use kva_attn_params.score_mod
 *         there) or when libnvrtc cannot be opened (the message says which file and why); KVA_ERR_NOT_BUILT without the
 *         CUDA backend; KVA_ERR_DEVICE when the device refuses the compiled code. On failure
 *         nothing is created and the context is unchanged (*out = NULL); only valid disk-cache
 *         entries of modules that did compile may remain. */
kva_status kva_variant_create(kva_context *ctx, const char *source, const char *function,
                              const kva_variant_options *options, kva_variant **out);

/* Built-in ALiBi: score + slopes[qo_head] * (kv_pos - q_pos), with score_mod_user pointing at
 * f32 slopes[num_qo_heads] in device memory (kva_alibi_slopes computes the usual ones); exact for
 * distances below 2^22 (4M tokens), for any finite slope and sm_scale (the Hopper prefill kernel
 * adds the bias of a row whose slope / sm_scale is too large for its 16-bit operands with FP32
 * instructions instead). */
kva_status kva_variant_create_alibi(kva_context *ctx, const kva_variant_options *options,
                                    kva_variant **out);
/* The CUDA C source of the built-in ALiBi variant (function "kva_alibi"), e.g. to start from. It
 * defines KVA_VARIANT_ALIBI_SLOPES: with kva_alibi as the variant's function, the Hopper prefill
 * and decode kernels then compute this bias (f32 slopes[num_qo_heads] as caller data) themselves;
 * a copy under another function name always runs its own code. */
const char *kva_variant_alibi_source(void);

/* NULL is a no-op. See "Lifetime" above. */
void kva_variant_destroy(kva_variant *variant);

/* What creating a variant cost, for logs and benchmarks. */
typedef struct kva_variant_stats {
    int32_t modules;         /* compiled units: one per (kind, dtype, head dim) */
    int32_t compiled;        /* of them compiled by NVRTC in this call */
    int32_t disk_hits;       /* loaded from the disk cache */
    int32_t context_hits;    /* found already loaded in the context */
    double compile_ms;       /* wall time of the NVRTC compiles */
    double total_ms;         /* wall time of kva_variant_create */
} kva_variant_stats;
kva_status kva_variant_get_stats(const kva_variant *variant, kva_variant_stats *stats);

/* ALiBi slopes of Press et al. for num_heads heads (2^(-8 (h+1) / n) for a power of two n, the
 * interleaved extension otherwise), into slopes[num_heads] (host memory). */
void kva_alibi_slopes(int32_t num_heads, float *slopes);

/* What attention computes, for one query at absolute position q_pos and key at position k_pos:
 *     s = dot(q, k) * sm_scale
 *     if logits_soft_cap > 0:  s = logits_soft_cap * tanh(s / logits_soft_cap)
 *     if score_mod / variant:  s = score_mod(s, q_pos, k_pos, qo_head, user)
 *     masked (s = -inf) if causal and k_pos > q_pos, or window_left >= 0 and k_pos < q_pos - window_left
 *     o = sum_k softmax(s)_k * v_k,   lse = log(sum_k exp(s_k))
 * Positions: a request with qo_len queries and kv_len keys has keys at 0..kv_len-1 and its
 * queries at q_pos = kv_len - qo_len + i (aligned bottom-right, as in chunked prefill; decode's
 * single query is at kv_len - 1). Query head h reads KV head h / (num_qo_heads / num_kv_heads).
 * Range: kernels keep scores in log2 units in f32, so a visible score must satisfy |s| < FLT_MAX /
 * log2(e) (about 2.3e38). A row that sees a larger score, or whose dot product overflows f32, gets
 * NaN output and NaN LSE -- never a plausible wrong value (and kva_merge_states propagates a NaN
 * LSE). A non-finite K element (Inf, NaN) in the cache makes its head's scores NaN (with a score
 * modifier, an Inf may instead mask its key: kva_variant); in CUDA decode
 * of f16 / bf16 d32 / d96 on NHD pools, where one unit serves two adjacent KV heads
 * (KVA_DECODE_PAIR_HEADS in kva_context_create), its partner head's too. Under a soft cap an overflowed dot product is NaN on the CPU and the cap on CUDA (tanh
 * saturates: the float64 reference's value). The f16/bf16 CUDA prefill kernels (compute-bound: they
 * check per row and tile, not per score, and compute exp2(s * scale - max) as one FMA) have a
 * smaller range: a row whose largest visible score in a 64-key tile exceeds 2^28 / log2(e) (about
 * 1.86e8) in magnitude gets NaN; and a score below -2.3e38 in a tile row that also sees one in
 * range weighs 0, which is its weight to f32 precision. Their soft cap uses the hardware tanh
 * (relative error <= 2^-10.99, as FlashAttention-3 and FlashInfer do): its error sits below the
 * 16-bit rounding of P and V (bf16 output error against float64 measured the same with and without
 * a cap), and so does CUDA decode of GQA groups above 16 where its plan runs on the 16-bit prefill
 * kernels (on Hopper, except a small plan of one round of 16+ chunks per split request: the decode
 * kernel's sub-groups); the CPU, the decode kernel and the f32 kernels use a tanh accurate to ~1e-7
 * and to a few ulp relative near 0 (an odd series there), so a cap far above the scores (1e4 ..
 * 1e6) gives the uncapped scores to f32 precision. */
typedef struct kva_attn_params {
    int32_t num_qo_heads;
    int32_t num_kv_heads;    /* must divide num_qo_heads; CUDA decode: any group; CUDA
                                prefill: groups of up to 16 query heads per KV head */
    int32_t head_dim;        /* CPU: any multiple of 16 up to 256. CUDA (decode, prefill,
                                kva_attention): any multiple of 16 in 32..256 (64, 128, 256 run
                                on their own kernels, others on the next of them with the tail
                                zero-filled: d96 costs what d128 does) */
    float sm_scale;          /* <= 0 means 1/sqrt(head_dim); must be finite (NaN, inf refused) */
    int32_t causal;          /* 0 or 1 */
    int32_t window_left;     /* < 0: no sliding window */
    float logits_soft_cap;   /* <= 0 or +inf: none; NaN refused, and so is a cap outside
                                [max(FLT_MIN, s / FLT_MAX), min(FLT_MAX / log2(e), s / FLT_MIN)]
                                for the effective sm_scale s (where the kernels' f32 constants
                                cap * log2(e) and s / cap are normal; about 1.2e-38 .. 7.5e36 at
                                d128's default scale) */
    kva_score_mod_fn score_mod; /* NULL: none (CPU contexts only) */
    void *score_mod_user;       /* caller data: a host pointer given to score_mod, or a device
                                   pointer given to the variant's function */
    const kva_variant *variant; /* NULL: none (CUDA contexts only: the GPU's score_mod). At most
                                   one of score_mod and variant may be set */
} kva_attn_params;

/* {heads, head_dim, sm_scale = 0, causal = 0, window_left = -1, soft cap = 0, no score_mod, no
 * variant}. */
kva_attn_params kva_attn_params_default(int32_t num_qo_heads, int32_t num_kv_heads,
                                        int32_t head_dim);

/* ------------------------------------------------------------------------------------------ */
/* Dense attention (no cache): one sequence                                                     */
/* ------------------------------------------------------------------------------------------ */

/* q, o: [qo_len, num_qo_heads, head_dim]; k, v: [kv_len, num_kv_heads, head_dim]; all of one
 * dtype; lse: NULL or f32 [qo_len, num_qo_heads]. With causal and qo_len > kv_len the first
 * queries sit at negative positions, see no key, and get output 0 and LSE -inf.
 * Synchronous on the CPU; enqueued on the stream on CUDA (the prefill kernel without a plan:
 * no split of the keys, so one long sequence still fills the GPU only through its query tiles). */
kva_status kva_attention(kva_context *ctx, const kva_attn_params *params, int32_t qo_len,
                         int32_t kv_len, kva_tensor q, kva_tensor k, kva_tensor v, kva_tensor o,
                         float *lse);

/* ------------------------------------------------------------------------------------------ */
/* Plan / run                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* The caller's workspace: a device part (split-KV partial states, the uploaded plan arrays)
 * and a host part (the plan arrays, pinned staging on CUDA). On the CPU both are host memory
 * and may be given as one buffer each. Sizes come from *_workspace_size(); both parts must be
 * 64-byte aligned (kva_malloc and kva_host_alloc return such memory). A workspace holds one plan
 * at a time; the plan must not be changed while a run that uses it is in flight, and on CUDA
 * runs of one workspace must not overlap (keep them on one stream, or order them by events):
 * a run keeps counters in the device part (split-KV merges, the Hopper prefill kernel's work
 * tickets) that it leaves at zero when it ends. */
typedef struct kva_workspace {
    void *device;
    size_t device_bytes;
    void *host;
    size_t host_bytes;
} kva_workspace;

/* Upper bounds a workspace is sized for. Every plan made into it must stay within them. */
typedef struct kva_plan_limits {
    int32_t max_batch;        /* requests per plan */
    int64_t max_total_pages;  /* indptr[batch] for paged plans */
    int64_t max_total_kv;     /* keys summed over the batch (ragged prefill, global-rowmax) */
    int64_t max_total_qo;     /* query tokens summed over the batch (prefill) */
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t page_size;        /* paged plans, 1 .. 65536 */
    int32_t min_fixed_chunk;  /* smallest kva_plan_options.fixed_chunk_size plans will use;
                                 0 = plans never fix the chunk size. A fixed chunk can make
                                 more work items than the search would, so the workspace is
                                 sized for it. */
} kva_plan_limits;

enum {
    KVA_PLAN_NO_SPLIT = 1 << 0, /* never split a request's keys across work items */
    KVA_PLAN_GRAPH = 1 << 1,    /* fixed launch shape for CUDA-graph capture: a run captured
                                   with one plan replays correctly after re-planning into the
                                   same workspace for any batch within the limits */
    KVA_PLAN_FULL_ATTENTION = 1 << 2 /* prefill: a scheduling hint that runs of this plan use no
                                   causal mask and no window (every query sees all of its
                                   request's keys). On CUDA's persistent (Hopper) kernel the
                                   plan may then cut its longest work item into key pieces,
                                   moved to the front of the plan (the launch runs them last)
                                   and merged after the launch, so that its last wave ends
                                   evenly (plan.split_kv is then 1). Only the schedule depends
                                   on it: a causal or windowed run of such a plan is still
                                   exact. The cut is skipped by KVA_PLAN_GRAPH, NO_SPLIT and
                                   fixed_chunk_size plans; decode plans ignore the flag. Without
                                   it, a prefill plan orders the items a launch runs last for a
                                   causal mask instead (longest first; exact either way) */
};

typedef enum kva_decode_algo {
    /* seed 002 Alg. 1: each chunk keeps its own running max, chunks merged by LSE. */
    KVA_DECODE_PARTIAL_ROWMAX = 0,
    /* seed 002 Alg. 2: pass 1 finds each row's global max over all chunks, pass 2 exponentiates
     * against it so chunk results add without rescaling. Decode only, CPU and CUDA (CUDA: two
     * launches per run; pass 1 reads K to find each chunk's max, so it reads K twice). */
    KVA_DECODE_GLOBAL_ROWMAX = 1
} kva_decode_algo;

typedef struct kva_plan_options {
    uint32_t flags;            /* KVA_PLAN_* bits; unknown bits are refused (KVA_ERR_INVALID_ARG) */
    int32_t fixed_chunk_size;  /* > 0: use this many keys per chunk instead of searching. Plan
                                  and size with limits.min_fixed_chunk in 1..fixed_chunk_size
                                  (below it: KVA_ERR_INVALID_ARG); with min_fixed_chunk = 0 the
                                  plan fits only if the device's searched capacity happens to
                                  hold it (else KVA_ERR_WORKSPACE_TOO_SMALL) */
    kva_decode_algo algo;
} kva_plan_options;

/* What a plan decided. The arrays point into the workspace's host part. */
typedef struct kva_plan {
    uint32_t magic;            /* identifies a plan made by this library; do not edit */
    int32_t kind;              /* internal: decode, prefill-ragged or prefill-paged */
    int32_t batch_size;
    int32_t num_qo_heads, num_kv_heads, head_dim, page_size;
    int32_t kv_chunk_size;     /* the longest key chunk of a work item. Decode: a searched plan
                                  cuts each request into equal chunks of at most this many keys;
                                  fixed_chunk_size cuts at its multiples. Prefill: keys per work
                                  item (the binary-search result); the pieces of an item cut
                                  for KVA_PLAN_FULL_ATTENTION are shorter */
    int32_t qo_tile_size;      /* query rows per work item (prefill; 1 for decode) */
    int32_t num_work;          /* flattened (request, q tile, kv chunk) work items */
    int32_t padded_work;       /* launch size; > num_work only with KVA_PLAN_GRAPH */
    int32_t split_kv;          /* 1 if some request's keys span several work items */
    uint32_t flags;
    kva_decode_algo algo;
    const int32_t *request_indices; /* [num_work] request of each work item */
    const int32_t *qo_tile_indices; /* [num_work] query tile of each work item; tiles are
                                       aligned to the request's end: with qo_len the queries
                                       of request_indices[i] and n = ceil(qo_len /
                                       qo_tile_size), tile t holds the request's query tokens
                                       [max(0, qo_len - (n - t) x qo_tile_size),
                                       qo_len - (n - 1 - t) x qo_tile_size) (counted from its
                                       first query), so only the first may be short */
    const int32_t *kv_tile_indices; /* [num_work] key chunk of each work item (a cut item's
                                       pieces: 0, 1, ...; their keys are not kv_tile x
                                       kv_chunk_size) */
    const int32_t *merge_indptr;    /* [batch+1] decode: work items merge_indptr[j] ..
                                       merge_indptr[j+1]-1 are the chunks of the j-th request in
                                       work order, request_indices[merge_indptr[j]]; requests are
                                       listed longest chunk first, so j is not the request index.
                                       Prefill: [groups+1], group j is one (request, query tile)
                                       and its items are that tile's key chunks; runs walk the
                                       plan from its last item, and without
                                       KVA_PLAN_FULL_ATTENTION the groups a launch runs last may
                                       be listed fewest causal key tiles first (met longest
                                       first) */
    kva_workspace workspace;   /* the workspace this plan lives in */
    uint32_t generation;       /* which plan call into that workspace made it: every later plan
                                  call into the same workspace (failed or not) makes this plan
                                  stale, and runs refuse it with KVA_ERR_BAD_STATE */
} kva_plan;

/* Planning works from host arrays only, never touches device memory synchronously. */

/* Workspace bytes for decode plans within `limits`. Limits are checked as a plan call checks
 * them (head_dim must be one ctx's device runs, page_size 1..65536); on failure nothing is
 * written to *device_bytes / *host_bytes. */
kva_status kva_decode_workspace_size(const kva_context *ctx, const kva_plan_limits *limits,
                                     size_t *device_bytes, size_t *host_bytes);

/* Plans batched decode of page_table->batch_size requests (one query token each). Validates the
 * page table (indptr shape, last_page_len range, page ids < num_pages), copies it into the
 * workspace (on CUDA: host part, then one async copy to the device part on the context stream),
 * chooses the split and writes the work arrays.
 * @return KVA_ERR_OUT_OF_RANGE for a page id outside 0..num_pages-1 or last_page_len outside
 *         1..page_size, KVA_ERR_BAD_SHAPE for a broken indptr (first entry not 0, decreasing),
 *         KVA_ERR_BAD_SHAPE for batch_size > limits->max_batch, KVA_ERR_WORKSPACE_TOO_SMALL when
 *         the pages exceed limits->max_total_pages or the workspace is smaller than
 *         kva_decode_workspace_size(limits) said, KVA_ERR_INVALID_ARG for bad options. Every
 *         plan call into a workspace, failing or not, makes plans made earlier into it stale: runs
 *         with them fail with KVA_ERR_BAD_STATE. A failing call leaves no valid plan in the
 *         workspace (and writes nothing into it when workspace.host is NULL, misaligned or smaller
 *         than the plan header); re-plan before running. */
kva_status kva_decode_plan(kva_context *ctx, const kva_plan_limits *limits,
                           const kva_page_table *page_table, int32_t num_pages,
                           const kva_plan_options *options, kva_workspace workspace,
                           kva_plan *plan);

/* Runs a decode plan. q, o: [batch, num_qo_heads, head_dim] (token = request); pages: this layer's
 * pool (its geometry must match the plan's); lse: NULL or f32 [batch, num_qo_heads] in device
 * memory. q, o and the pages share one dtype. */
kva_status kva_decode_run(kva_context *ctx, const kva_plan *plan, const kva_attn_params *params,
                          kva_tensor q, const kva_kv_pages *pages, kva_tensor o, float *lse);

/* Workspace bytes for prefill plans within `limits`. limits->page_size = 0 sizes for ragged
 * (kv_indptr) plans only; a page size sizes for both kinds. Nothing is written on failure. */
kva_status kva_prefill_workspace_size(const kva_context *ctx, const kva_plan_limits *limits,
                                      size_t *device_bytes, size_t *host_bytes);

/* Plans a ragged prefill batch. qo_indptr [batch+1] (host): request b's queries are rows
 * qo_indptr[b] .. qo_indptr[b+1]-1 of q. Keys come from exactly one of
 *   - kv_indptr [batch+1] (host): rows kv_indptr[b] .. of ragged contiguous k/v tensors, or
 *   - page_table (+ num_pages of the pool): a paged cache (chunked prefill over a cached prefix).
 * Pass NULL for the other. (Causal with qo_len > kv_len: see kva_attention.) Errors and
 * staleness of earlier plans as for kva_decode_plan. */
kva_status kva_prefill_plan(kva_context *ctx, const kva_plan_limits *limits, int32_t batch_size,
                            const int32_t *qo_indptr, const int32_t *kv_indptr,
                            const kva_page_table *page_table, int32_t num_pages,
                            const kva_plan_options *options, kva_workspace workspace,
                            kva_plan *plan);

/* Runs a ragged-K/V prefill plan. q, o: [total_qo, num_qo_heads, head_dim];
 * k, v: [total_kv, num_kv_heads, head_dim]; lse: NULL or f32 [total_qo, num_qo_heads]. */
kva_status kva_prefill_run_ragged(kva_context *ctx, const kva_plan *plan,
                                  const kva_attn_params *params, kva_tensor q, kva_tensor k,
                                  kva_tensor v, kva_tensor o, float *lse);

/* Runs a paged prefill plan. q, o and lse as in kva_prefill_run_ragged. */
kva_status kva_prefill_run_paged(kva_context *ctx, const kva_plan *plan,
                                 const kva_attn_params *params, kva_tensor q,
                                 const kva_kv_pages *pages, kva_tensor o, float *lse);

/* ------------------------------------------------------------------------------------------ */
/* Merging attention states                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Combines num_states partial results per row, each computed over a disjoint set of keys, into
 * the result over their union (seed 002's LSE reduction):
 *     lse_out[r] = log(sum_s exp(lse_in[r][s]))
 *     v_out[r]   = sum_s exp(lse_in[r][s] - lse_out[r]) * v_in[r][s]
 * v_in: [num_rows, num_states, head_dim] (dtype), lse_in: f32 [num_rows, num_states],
 * v_out: [num_rows, head_dim] (dtype), lse_out: NULL or f32 [num_rows]. All in device memory,
 * each aligned to its element size (KVA_ERR_BAD_SHAPE otherwise).
 * States with lse = -inf contribute nothing; a row whose states are all -inf gets 0 and -inf;
 * a NaN LSE (a state whose scores left f32 range) makes the row NaN. */
kva_status kva_merge_states(kva_context *ctx, int32_t num_rows, int32_t num_states,
                            int32_t head_dim, kva_dtype dtype, const void *v_in,
                            const float *lse_in, void *v_out, float *lse_out);

/* ------------------------------------------------------------------------------------------ */
/* Paged KV cache manager                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct kva_cache kva_cache;

/* Errors shared by every kva_cache_* call; each check runs before the first change, so a failing
 * call changes nothing (no page, refcount, length or stored K/V):
 *   KVA_ERR_BAD_STATE     sequence id outside 0..max_sequences-1 or not live; an append that
 *                         would write into a page shared with another sequence
 *   KVA_ERR_INVALID_ARG   NULL pointers, negative counts, one id named twice in a reserve/append
 *   KVA_ERR_OUT_OF_RANGE  layer out of range, num_new > sequence length, length overflow
 *   KVA_ERR_BAD_SHAPE     k/v dtype or alignment wrong, more than max_append_tokens
 *   KVA_ERR_NO_SPACE      not enough free pages (reserve) or sequence slots (add, fork)
 *   KVA_ERR_WORKSPACE_TOO_SMALL  a caller array (page table) is too small
 * A cache is not thread-safe: serialise calls on one cache. */

typedef struct kva_cache_config {
    int32_t num_layers;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t page_size;
    int32_t num_pages;        /* pages per layer; a page id names the same page in every layer */
    kva_dtype dtype;
    kva_layout layout;
    int32_t max_sequences;    /* live sequences at once */
    int32_t max_append_tokens; /* tokens one kva_cache_append may write (sizes its staging) */
} kva_cache_config;

/* Creates a cache whose single pool [num_layers][num_pages][2][page...] lives in the context's
 * device memory; page tables live on the host. (On a CPU context the pool's memory is committed
 * page by page as appends first write it; kva_cache_prefault commits it all at once.) The cache
 * uses ctx until kva_cache_destroy:
 * ctx may be destroyed first (kva_context_destroy then defers freeing it until its last cache is
 * destroyed), but after kva_context_destroy only kva_cache_destroy may be called on its caches. */
kva_status kva_cache_create(kva_context *ctx, const kva_cache_config *config, kva_cache **out);
void kva_cache_destroy(kva_cache *cache); /* NULL is a no-op */

/* Makes the whole pool resident now, so that no append or run waits for the operating system to
 * back a page it touches first (CPU contexts: every page is touched by the context's threads --
 * a server that will use the pool anyway pays this once at start; with 2 MB pages and the
 * kernel's THP defrag on, a first touch zeroes and may compact 2 MB: measured 1.2 s per GB the
 * first time in a process on a Zen 5 host, 0.03-0.25 s per GB otherwise). Stored K/V is not
 * changed; any time is fine. A pool sized for the worst case then occupies all of its memory.
 * CUDA contexts: nothing to do (device memory is backed at allocation); returns KVA_OK. */
kva_status kva_cache_prefault(kva_cache *cache);

/* New empty sequence; *seq_id receives its id (0 .. max_sequences-1). Ids are slots: a freed
 * id is handed out again, so a caller must forget an id once it frees it (freeing it again after
 * a later add_sequence or fork got it would free that new sequence).
 * @return KVA_ERR_NO_SPACE if max_sequences are live. */
kva_status kva_cache_add_sequence(kva_cache *cache, int32_t *seq_id);
/* Frees a sequence; pages it shares with others stay theirs. */
kva_status kva_cache_free_sequence(kva_cache *cache, int32_t seq_id);
/* New sequence *child_id with the same tokens as parent, sharing its pages (reference counts).
 * A shared, partly filled last page is copied on write by the first kva_cache_reserve that
 * extends either sequence. */
kva_status kva_cache_fork(kva_cache *cache, int32_t parent_id, int32_t *child_id);

/* Extends each of n sequences by num_new[i] token slots (allocating pages, copying a shared
 * partial last page). All or nothing: on KVA_ERR_NO_SPACE no sequence changed. */
kva_status kva_cache_reserve(kva_cache *cache, int32_t n, const int32_t *seq_ids,
                             const int32_t *num_new);

/* Writes layer `layer`'s K/V of the last num_new[i] slots of each sequence (normally the slots
 * just reserved). k, v: [sum num_new, num_kv_heads, head_dim] in device memory, of the cache's
 * dtype, rows in sequence order. Needs num_new[i] <= length of seq i and sum <= max_append_tokens. */
kva_status kva_cache_append(kva_cache *cache, int32_t layer, int32_t n, const int32_t *seq_ids,
                            const int32_t *num_new, kva_tensor k, kva_tensor v);

/* Length in tokens of a sequence. */
kva_status kva_cache_seq_len(const kva_cache *cache, int32_t seq_id, int32_t *len);

/* Fills the CSR page table of n sequences into caller arrays: indptr [n+1], indices
 * (capacity indices_capacity), last_page_len [n]; table (optional) is set to view them. */
kva_status kva_cache_page_table(const kva_cache *cache, int32_t n, const int32_t *seq_ids,
                                int32_t *indptr, int32_t *indices, int32_t indices_capacity,
                                int32_t *last_page_len, kva_page_table *table);

/* The page pool of one layer, for kva_decode_run / kva_prefill_run_paged. */
kva_status kva_cache_layer_pages(const kva_cache *cache, int32_t layer, kva_kv_pages *pages);

typedef struct kva_cache_stats {
    int32_t num_pages;        /* pool size per layer */
    int32_t free_pages;
    int32_t used_pages;       /* pages with refcount > 0 */
    int32_t shared_pages;     /* pages with refcount > 1 */
    int32_t peak_used_pages;
    int32_t num_sequences;
    int64_t num_tokens;       /* summed over live sequences */
    int64_t cow_copies;       /* partial pages copied on write so far */
} kva_cache_stats;
kva_status kva_cache_get_stats(const kva_cache *cache, kva_cache_stats *stats);

/* Reference count of a physical page (0 = free), for tests and debugging. */
kva_status kva_cache_page_refcount(const kva_cache *cache, int32_t page, int32_t *refcount);

#ifdef __cplusplus
}
#endif
#endif /* KVATTN_H */
