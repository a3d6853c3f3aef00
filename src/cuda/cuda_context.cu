/*
 * cuda_context.cu -- the CUDA backend's context, memory helpers, plan upload and split policy.
 *
 * A context is bound to one device and one caller-given stream (ctx->stream, NULL = legacy
 * default stream); everything here enqueues on that stream. Context creation also prepares
 * every decode kernel (shared-memory limit) and records its occupancy, which sets the split
 * policy: the planner may cut requests into as many (work item x KV head) blocks as the device
 * runs at once, num_SMs x blocks-per-SM, and no more.
 */
#include "cuda_common.cuh"
#include "decode_kernels.h"
#include "prefill_kernels.h"
#include "variant.h"
#include "../common/env_knob.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* L2 / this = a causal plan's reorder budget (prefill_policy; -DKVA__ORDER_L2_DIVISOR=2 for an A/B) */
#ifndef KVA__ORDER_L2_DIVISOR
#define KVA__ORDER_L2_DIVISOR 4
#endif
#if KVA__ORDER_L2_DIVISOR < 1
#error "KVA__ORDER_L2_DIVISOR must be at least 1"
#endif

/* Every decode kernel with its shared memory, for attribute setting, occupancy and dispatch. */
typedef struct {
    kva_dtype dtype;
    int head_dim;
    const void *(*fn)(int nt, int gr);
    int (*smem)(int nt);
} decode_entry;

static const decode_entry decode_table[9] = {
    {KVA_BF16, 64, kva__decode_bf16_d64, kva__decode_bf16_d64_smem},
    {KVA_BF16, 128, kva__decode_bf16_d128, kva__decode_bf16_d128_smem},
    {KVA_BF16, 256, kva__decode_bf16_d256, kva__decode_bf16_d256_smem},
    {KVA_F16, 64, kva__decode_f16_d64, kva__decode_f16_d64_smem},
    {KVA_F16, 128, kva__decode_f16_d128, kva__decode_f16_d128_smem},
    {KVA_F16, 256, kva__decode_f16_d256, kva__decode_f16_d256_smem},
    {KVA_F32, 64, kva__decode_f32_d64, kva__decode_f32_d64_smem},
    {KVA_F32, 128, kva__decode_f32_d128, kva__decode_f32_d128_smem},
    {KVA_F32, 256, kva__decode_f32_d256, kva__decode_f32_d256_smem},
};

static int decode_entry_index(kva_dtype dtype, int head_dim) {
    const int built = kva__built_head_dim(head_dim);
    for (int i = 0; i < 9; ++i)
        if (decode_table[i].dtype == dtype && decode_table[i].head_dim == built) return i;
    return -1;
}

/* A GQA group is served in nsub = ceil(group / 16) sub-groups of near-equal size (<= 16 heads,
 * the query rows a unit holds), each its own unit re-reading the chunk's K/V (mostly from L2:
 * a chunk's sub-group units are adjacent in the grid, so they run at the same time). */
bool kva__decode_kernel_for(const kva_context *ctx, kva_dtype dtype, int head_dim, int group, int gr,
                            kva__decode_choice *choice) {
    const int i = decode_entry_index(dtype, head_dim);
    if (i < 0 || group < 1 || (gr != 0 && gr != 1)) return false;
    const int nsub = (group + 15) / 16, sub = (group + nsub - 1) / nsub;
    const int nt = sub <= 8 ? 1 : 2;
    const kva__cuda_private *priv = ctx ? (const kva__cuda_private *)ctx->cuda_private : NULL;
    choice->fn = decode_table[i].fn(nt, gr);
    choice->smem = decode_table[i].smem(nt);
    choice->blocks_per_sm = priv ? priv->decode_blocks_per_sm[i][(nt - 1) + 2 * gr] : 1;
    choice->built_dim = decode_table[i].head_dim;
    choice->nt = nt;
    choice->sub = sub;
    choice->nsub = nsub;
    /* KVA_DECODE_GROUP_PATH=subgroups keeps the sub-group kernel, =prefill sends every group the
     * Hopper prefill kernel can take there (tests, comparisons) */
    const char *force = getenv("KVA_DECODE_GROUP_PATH");
    const bool force_prefill = force && strcmp(force, "prefill") == 0;
    choice->via_prefill = priv && priv->prefill_path == KVA__PREFILL_HOPPER && gr == 0 && (nsub > 1 || force_prefill) &&
                          group <= KVA__PREFILL_ROWS_LARGE && dtype != KVA_F32 &&
                          !(force && strcmp(force, "subgroups") == 0);
    return true;
}

bool kva__decode_pair_for(const kva_context *ctx, kva_dtype dtype, int head_dim, int group, int num_kv_heads,
                          int64_t stride_head, int split, int gr, kva__decode_choice *pair) {
    const kva__cuda_private *priv = ctx ? (const kva__cuda_private *)ctx->cuda_private : NULL;
    if (!priv || priv->decode_pair_heads == KVA__PAIR_NEVER || (split && priv->decode_pair_heads == KVA__PAIR_UNSPLIT))
        return false;
    const int row_bytes = head_dim * (int)kva_dtype_size(dtype);
    if (dtype == KVA_F32 || num_kv_heads % 2 != 0 || stride_head != head_dim || row_bytes % 128 == 0 ||
        (2 * row_bytes) % 128 != 0 || 2 * group > 8)
        return false;
    kva__decode_choice c;
    if (!kva__decode_kernel_for(ctx, dtype, 2 * head_dim, 2 * group, gr, &c) || c.nsub != 1 || c.via_prefill)
        return false;
    *pair = c;
    return true;
}

extern "C" bool kva__cuda_decode_pairs_heads(const kva_context *ctx, kva_dtype dtype, int32_t head_dim,
                                             int32_t group, int32_t num_kv_heads, int64_t stride_head, int split) {
    kva__decode_choice c;
    return kva__decode_pair_for(ctx, dtype, head_dim, group, num_kv_heads, stride_head, split, 0, &c);
}

extern "C" bool kva__cuda_decode_supported(const kva_context *ctx, kva_dtype dtype, int32_t head_dim,
                                           int32_t group) {
    kva__decode_choice c;
    return kva__decode_kernel_for(ctx, dtype, head_dim, group, 0, &c) &&
           kva__decode_kernel_for(ctx, dtype, head_dim, group, 1, &c);
}

extern "C" int kva__cuda_decode_blocks_per_sm(const kva_context *ctx, kva_dtype dtype, int32_t head_dim,
                                              int32_t group, int32_t *nsub) {
    kva__decode_choice c;
    if (!kva__decode_kernel_for(ctx, dtype, head_dim, group, 0, &c)) return 0;
    if (nsub) *nsub = c.nsub;
    return c.blocks_per_sm;
}

extern "C" kva_status kva__cuda_decode_merge_withdrawals(const kva_context *ctx, uint64_t *count) {
    const kva__cuda_private *priv = ctx ? (const kva__cuda_private *)ctx->cuda_private : NULL;
    if (!count) return kva__fail(KVA_ERR_INVALID_ARG, "kva__cuda_decode_merge_withdrawals: count is NULL");
    if (!priv || !priv->merge_withdrawals)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva__cuda_decode_merge_withdrawals: not a CUDA context");
    unsigned n = 0;
    const kva_status st = kva__cuda_use_device(ctx);
    if (st != KVA_OK) return st;
    KVA_CUDA_TRY(cudaStreamSynchronize(kva__stream(ctx)));
    KVA_CUDA_TRY(cudaMemcpy(&n, priv->merge_withdrawals, sizeof n, cudaMemcpyDeviceToHost));
    *count = n;
    return KVA_OK;
}

extern "C" int kva__cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* Whether every prefill merge kernel runs code compiled for sm_90+ on this device (its PTX
 * version: a newer GPU than the build's sm_90a code JIT-compiles the sm_80 PTX, whose merge
 * kernel has no kva__pdl_wait and must not be launched as a programmatic dependent). */
static int merge_kernels_wait(const kva__cuda_private *priv) {
    if (priv->cc_major < 9) return 0;
    const kva_dtype dts[3] = {KVA_BF16, KVA_F16, KVA_F32};
    for (int i = 0; i < 3; ++i)
        for (int wide = 0; wide < 2; ++wide) {
            cudaFuncAttributes fa;
            if (cudaFuncGetAttributes(&fa, kva__prefill_merge_kernel_for(dts[i], wide != 0)) != cudaSuccess) {
                (void)cudaGetLastError();
                return 0;
            }
            if (fa.ptxVersion < 90) return 0;
        }
    return 1;
}

/* Whether decode runs may launch as programmatic dependents here (KVA__DECODE_PDL): only when
 * every built-in decode kernel runs sm_90+ code on this device (see merge_kernels_wait). */
static int decode_kernels_wait(const kva__cuda_private *priv) {
#if !KVA__DECODE_PDL
    (void)priv;
    return 0;
#else
    /* (the kernels must have been compiled with the wait as well: a flag that reached this file
     * but not theirs would launch kernels without it as dependents) */
    if (priv->cc_major < 9 || !kva__decode_bf16_pdl() || !kva__decode_f16_pdl() || !kva__decode_f32_pdl()) return 0;
    for (int i = 0; i < 9; ++i)
        for (int v = 0; v < 4; ++v) {
            cudaFuncAttributes fa;
            if (cudaFuncGetAttributes(&fa, decode_table[i].fn(1 + (v & 1), v >> 1)) != cudaSuccess) {
                (void)cudaGetLastError();
                return 0;
            }
            if (fa.ptxVersion < 90) return 0;
        }
    return 1;
#endif
}

static kva_status prepare_kernels(kva__cuda_private *priv) {
    for (int i = 0; i < 9; ++i) {
        const decode_entry *e = &decode_table[i];
        for (int v = 0; v < 4; ++v) { /* v = (nt - 1) + 2 * gr */
            const int nt = 1 + (v & 1), gr = v >> 1;
            cudaError_t err = cudaFuncSetAttribute(e->fn(nt, gr), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   e->smem(nt));
            if (err != cudaSuccess)
                return kva__fail(KVA_ERR_DEVICE,
                                 "CUDA context: preparing the decode kernel (%s, head_dim %d, %d B shared "
                                 "memory) failed: %s (built for this GPU's architecture?)",
                                 kva_dtype_name(e->dtype), e->head_dim, e->smem(nt), cudaGetErrorString(err));
            int blocks = 0;
            KVA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, e->fn(nt, gr), KVA__DECODE_THREADS,
                                                                       (size_t)e->smem(nt)));
            priv->decode_blocks_per_sm[i][v] = blocks > 0 ? blocks : 1;
        }
    }
    /* Every prefill kernel (dtype x head dim x tile) gets its shared-memory limit; the largest
     * bf16 tile's occupancy sets the prefill split budget. */
    const kva_dtype dts[3] = {KVA_BF16, KVA_F16, KVA_F32};
    const int dims[4] = {64, 128, 256, 96}; /* (96: the Hopper kernel's d96 products on the d128 layout) */
    for (int path = KVA__PREFILL_MMA; path <= priv->prefill_path; ++path)
    for (int di = 0; di < 4; ++di)
        for (int ti = 0; ti < 3; ++ti)
            for (int rows = KVA__PREFILL_ROWS_SMALL; rows <= KVA__PREFILL_ROWS_LARGE; rows *= 2) {
                kva__prefill_choice k;
                const kva__prefill_target target = {(kva__prefill_path)path, priv->smem_optin};
                if (!kva__prefill_choose(dts[ti], dims[di], rows, &target, &k)) continue;
                /* (the Hopper kernel's other builds: the same launch shape) */
                const void *const builds[4] = {k.fn, k.fn_no_turns, k.fn_cap, k.fn_cap_no_turns};
                cudaError_t err = cudaSuccess;
                for (int b = 0; b < 4 && err == cudaSuccess; ++b)
                    if (builds[b]) err = cudaFuncSetAttribute(builds[b], cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem);
                if (err != cudaSuccess)
                    return kva__fail(KVA_ERR_DEVICE,
                                     "CUDA context: preparing the prefill kernel (%s, head_dim %d, %d rows, %d B "
                                     "shared memory) failed: %s",
                                     kva_dtype_name(dts[ti]), dims[di], k.rows, k.smem, cudaGetErrorString(err));
                if (dts[ti] == KVA_BF16 && rows == KVA__PREFILL_ROWS_LARGE && path == priv->prefill_path && di < 3) {
                    int blocks = 0;
                    KVA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.fn, k.threads, (size_t)k.smem));
                    priv->prefill_blocks_per_sm[di] = blocks > 0 ? blocks : 1;
                }
            }
    priv->merge_pdl = merge_kernels_wait(priv);
    priv->decode_pdl = decode_kernels_wait(priv);
    return KVA_OK;
}

extern "C" kva_status kva__cuda_context_init(kva_context *ctx) {
    int n = kva__cuda_device_count();
    if (n == 0) return kva__fail(KVA_ERR_DEVICE, "kva_context_create: no CUDA device is visible");
    if (ctx->device_id < 0 || ctx->device_id >= n)
        return kva__fail(KVA_ERR_DEVICE, "kva_context_create: CUDA device %d does not exist (%d visible)",
                         ctx->device_id, n);
    KVA_CUDA_TRY(cudaSetDevice(ctx->device_id));
    cudaDeviceProp prop;
    KVA_CUDA_TRY(cudaGetDeviceProperties(&prop, ctx->device_id));
    if (prop.major < 8)
        return kva__fail(KVA_ERR_DEVICE,
                         "kva_context_create: %s has compute capability %d.%d; kvattn needs 8.0 or newer",
                         prop.name, prop.major, prop.minor);
    snprintf(ctx->name, sizeof ctx->name, "%.127s", prop.name);
    ctx->num_sms = prop.multiProcessorCount;
    ctx->l2_bytes = (size_t)prop.l2CacheSize;
    ctx->total_memory = prop.totalGlobalMem;
    ctx->stream = NULL;

    kva__cuda_private *priv = (kva__cuda_private *)calloc(1, sizeof *priv);
    if (!priv) return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_context_create: out of memory");
    ctx->cuda_private = priv;
    priv->cc_major = prop.major;
    priv->cc_minor = prop.minor;
    kva_status st = KVA_OK;
    for (int i = 0; i < KVA__UPLOAD_SLOTS && st == KVA_OK; ++i) {
        cudaError_t e = cudaEventCreateWithFlags(&priv->upload_done[i], cudaEventDisableTiming);
        if (e != cudaSuccess)
            st = kva__fail(KVA_ERR_DEVICE, "kva_context_create: cudaEventCreate: %s", cudaGetErrorString(e));
    }
    /* Hopper's warp-specialised path where the device has it (this build's sm_90a code),
     * unless KVA_PREFILL_PATH=mma or =wgmma asks for the mma.sync kernels or their wgmma
     * version (tests and comparisons); =hopper insists on the default there. A value that names
     * no path, or a path this device and build lack, fails the context: a comparison that
     * silently ran the default path would report the wrong kernel's numbers. */
    const char *path = getenv("KVA_PREFILL_PATH");
    if (path && !*path) path = NULL;
    /* the other kernel-choice knobs, read where they apply (per call), checked here likewise */
    static const char *const group_paths[] = {"subgroups", "prefill", NULL};
    static const char *const number[] = {"#", NULL};
    static const char *const flag[] = {"0", "1", NULL};
    const char *knob = NULL;
    if (st == KVA_OK) st = kva__env_knob("kva_context_create", "KVA_DECODE_GROUP_PATH", group_paths, &knob);
    if (st == KVA_OK) st = kva__env_knob("kva_context_create", "KVA_PREFILL_PERSISTENT", number, &knob);
    if (st == KVA_OK) st = kva__env_knob("kva_context_create", "KVA_PREFILL_BALANCE_MIN_TILES", number, &knob);
    if (st == KVA_OK) st = kva__env_knob("kva_context_create", "KVA_PREFILL_TMA_STRICT", flag, &knob);
    if (st == KVA_OK) st = kva__env_knob("kva_context_create", "KVA_PREFILL_TURNS", flag, &knob);
    /* the decode kernel's shared-merge wait, ns (tests: 0 makes early blocks withdraw) */
    if (st == KVA_OK) st = kva__env_knob("kva_context_create", "KVA_DECODE_MERGE_WAIT_NS", number, &knob);
    priv->decode_merge_wait_ns = knob ? (uint32_t)strtoul(knob, NULL, 10) : 100000u;
    /* 0 turns the shared merge off (the last block's merge and the tree take its requests) */
    if (st == KVA_OK) st = kva__env_knob("kva_context_create", "KVA_DECODE_SHARED_MERGE", flag, &knob);
    priv->decode_shared_merge_min = knob && strcmp(knob, "0") == 0 ? 0x10000 : KVA__SHARED_MERGE_MIN;
    /* decode units of two KV heads (kva__decode_pair_for): 0 never, 1 wherever the shape allows
     * (tests: split plans too), unset for unsplit plans */
    if (st == KVA_OK) st = kva__env_knob("kva_context_create", "KVA_DECODE_PAIR_HEADS", flag, &knob);
    priv->decode_pair_heads = !knob ? KVA__PAIR_UNSPLIT : strcmp(knob, "0") == 0 ? KVA__PAIR_NEVER : KVA__PAIR_ALWAYS;
    bool sm90a = false;
#ifdef KVA_HAVE_SM90A /* the build holds sm_90a code (KVA_CUDA_ARCHS has 90a) */
    sm90a = prop.major == 9;
#endif
    priv->prefill_path = sm90a ? KVA__PREFILL_HOPPER : KVA__PREFILL_MMA;
    if (st == KVA_OK && path) {
        if (strcmp(path, "mma") == 0) {
            priv->prefill_path = KVA__PREFILL_MMA;
        } else if (strcmp(path, "wgmma") != 0 && strcmp(path, "hopper") != 0) {
            st = kva__fail(KVA_ERR_UNSUPPORTED,
                           "kva_context_create: KVA_PREFILL_PATH=%.32s: no such prefill path (mma, wgmma or hopper)",
                           path);
        } else if (!sm90a) {
            st = kva__fail(KVA_ERR_UNSUPPORTED,
                           "kva_context_create: KVA_PREFILL_PATH=%s needs an sm_90 device and a build with "
                           "sm_90a code (this device is sm_%d%d%s)",
                           path, prop.major, prop.minor,
#ifdef KVA_HAVE_SM90A
                           ""
#else
                           ", the build has no sm_90a code"
#endif
            );
        } else if (strcmp(path, "wgmma") == 0) {
            priv->prefill_path = KVA__PREFILL_WGMMA;
        }
    }
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device_id) != cudaSuccess) {
        (void)cudaGetLastError();
        optin = 48 * 1024;
    }
    priv->smem_optin = optin;
    if (st == KVA_OK) st = prepare_kernels(priv);
    if (st == KVA_OK) {
        /* (zeroed and synchronised here: the context's stream may not be ordered after the
         * legacy default stream) */
        cudaError_t e = cudaMalloc((void **)&priv->merge_withdrawals, sizeof(unsigned));
        if (e == cudaSuccess) e = cudaMemsetAsync(priv->merge_withdrawals, 0, sizeof(unsigned), cudaStreamLegacy);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = kva__fail(e == cudaErrorMemoryAllocation ? KVA_ERR_OUT_OF_MEMORY : KVA_ERR_DEVICE,
                           "kva_context_create: a 4-byte device counter: %s", cudaGetErrorString(e));
        }
    }
    if (st != KVA_OK) kva__cuda_context_destroy(ctx);
    return st;
}

extern "C" void kva__cuda_context_destroy(kva_context *ctx) {
    kva__cuda_private *priv = (kva__cuda_private *)ctx->cuda_private;
    if (!priv) return;
    (void)kva__cuda_use_device(ctx);
    for (int i = 0; i < KVA__UPLOAD_SLOTS; ++i)
        if (priv->upload_done[i]) {
            (void)cudaEventSynchronize(priv->upload_done[i]);
            (void)cudaEventDestroy(priv->upload_done[i]);
        }
    kva__cuda_variant_modules_release(priv);
    if (priv->merge_withdrawals) (void)cudaFree(priv->merge_withdrawals);
    free(priv);
    ctx->cuda_private = NULL;
}

/* ---- memory ---------------------------------------------------------------------------------- */

extern "C" kva_status kva__cuda_malloc(kva_context *ctx, size_t bytes, void **ptr) {
    KVA_TRY(kva__cuda_use_device(ctx));
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *ptr = NULL;
        return kva__fail(e == cudaErrorMemoryAllocation ? KVA_ERR_OUT_OF_MEMORY : KVA_ERR_DEVICE,
                         "kva_malloc: cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    }
    return KVA_OK;
}

extern "C" void kva__cuda_free(kva_context *ctx, void *ptr) {
    if (kva__cuda_use_device(ctx) == KVA_OK) (void)cudaFree(ptr);
}

extern "C" kva_status kva__cuda_host_alloc(kva_context *ctx, size_t bytes, void **ptr) {
    KVA_TRY(kva__cuda_use_device(ctx));
    cudaError_t e = cudaMallocHost(ptr, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *ptr = NULL;
        return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_host_alloc: cudaMallocHost(%zu bytes): %s", bytes,
                         cudaGetErrorString(e));
    }
    return KVA_OK;
}

extern "C" void kva__cuda_host_free(kva_context *ctx, void *ptr) {
    (void)ctx;
    (void)cudaFreeHost(ptr);
}

extern "C" kva_status kva__cuda_memcpy(kva_context *ctx, void *dst, const void *src, size_t bytes,
                                       kva_copy_kind kind) {
    KVA_TRY(kva__cuda_use_device(ctx));
    cudaMemcpyKind k = kind == KVA_COPY_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                       : kind == KVA_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                         : cudaMemcpyDeviceToDevice;
    KVA_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, k, kva__stream(ctx)));
    KVA_CUDA_TRY(cudaStreamSynchronize(kva__stream(ctx)));
    return KVA_OK;
}

extern "C" kva_status kva__cuda_memset_async(kva_context *ctx, void *dst, int value, size_t bytes) {
    KVA_TRY(kva__cuda_use_device(ctx));
    KVA_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, kva__stream(ctx)));
    return KVA_OK;
}

extern "C" kva_status kva__cuda_synchronize(kva_context *ctx) {
    KVA_TRY(kva__cuda_use_device(ctx));
    KVA_CUDA_TRY(cudaStreamSynchronize(kva__stream(ctx)));
    return KVA_OK;
}

extern "C" kva_status kva__cuda_free_memory(kva_context *ctx, size_t *free_bytes) {
    size_t total = 0;
    KVA_TRY(kva__cuda_use_device(ctx));
    const cudaError_t e = cudaMemGetInfo(free_bytes, &total);
    if (e != cudaSuccess)
        return kva__fail(KVA_ERR_DEVICE, "kva_context_info: cudaMemGetInfo failed: %s", cudaGetErrorString(e));
    return KVA_OK;
}

/* ---- plan upload ----------------------------------------------------------------------------- */

/* The slot remembering the last upload from host_part, or -1. */
static int upload_slot_of(const kva__cuda_private *priv, const void *host_part) {
    for (int i = 0; i < KVA__UPLOAD_SLOTS; ++i)
        if (priv->upload_host[i] == host_part) return i;
    return -1;
}

extern "C" kva_status kva__cuda_plan_begin(kva_context *ctx, const void *host_part) {
    kva__cuda_private *priv = (kva__cuda_private *)ctx->cuda_private;
    int slot = upload_slot_of(priv, host_part);
    if (slot >= 0) {
        KVA_TRY(kva__cuda_use_device(ctx));
        KVA_CUDA_TRY(cudaEventSynchronize(priv->upload_done[slot]));
    }
    return KVA_OK;
}

extern "C" kva_status kva__cuda_plan_upload(kva_context *ctx, void *device_part, const void *host_part,
                                            size_t bytes) {
    kva__cuda_private *priv = (kva__cuda_private *)ctx->cuda_private;
    KVA_TRY(kva__cuda_use_device(ctx));
    cudaStream_t s = kva__stream(ctx);
    KVA_CUDA_TRY(cudaMemcpyAsync(device_part, host_part, bytes, cudaMemcpyHostToDevice, s));
    /* Merge counters and prefill work tickets start at zero (a run leaves them at zero again:
     * the merging block, or the shared merge's last participant): the counters up to the
     * scheduling region, then its head words only (its per-block record slots, 272 KB, are
     * written before they are read) */
    const kva__plan_header *h = (const kva__plan_header *)host_part;
    const int64_t clear_end = h->off_scores > h->off_sched ? h->off_sched + 4 * KVA__SCHED_HEAD : h->off_scores;
    if (clear_end > h->off_counters)
        KVA_CUDA_TRY(cudaMemsetAsync((char *)device_part + h->off_counters, 0, (size_t)(clear_end - h->off_counters), s));
    int slot = upload_slot_of(priv, host_part);
    if (slot < 0) {
        /* Reuse the oldest slot; its upload must be over before we forget it. */
        slot = priv->upload_next;
        priv->upload_next = (slot + 1) % KVA__UPLOAD_SLOTS;
        if (priv->upload_host[slot]) KVA_CUDA_TRY(cudaEventSynchronize(priv->upload_done[slot]));
        priv->upload_host[slot] = host_part;
    }
    KVA_CUDA_TRY(cudaEventRecord(priv->upload_done[slot], s));
    return KVA_OK;
}

/* ---- split policy ---------------------------------------------------------------------------- */

kva__prefill_target kva__cuda_prefill_target(const kva_context *ctx) {
    const kva__cuda_private *priv = (const kva__cuda_private *)ctx->cuda_private;
    kva__prefill_target t = {KVA__PREFILL_MMA, 48 * 1024};
    if (priv) {
        t.path = (kva__prefill_path)priv->prefill_path;
        t.smem_limit = priv->smem_optin;
    }
    return t;
}

/* Prefill: query tiles of the largest kernel's rows (128 packed rows; 192 at d64 on Hopper) or,
 * for batches of short query runs, of the 64-row kernel; keys split only while the batch's
 * (work item x KV head) blocks are fewer than one wave, in chunks of at least 4 key tiles. */
static kva_status prefill_policy(const kva_context *ctx, const kva_plan_limits *limits, int dim_idx,
                                 kva__split_policy *policy) {
    const kva__cuda_private *priv = (const kva__cuda_private *)ctx->cuda_private;
    const int group = limits->num_qo_heads / limits->num_kv_heads;
    kva__prefill_choice large, small;
    const kva__prefill_target target = kva__cuda_prefill_target(ctx);
    if (group > 16)
        return kva__fail(KVA_ERR_UNSUPPORTED, "plan limits: GQA group %d > 16 unsupported on CUDA", group);
    if (!kva__prefill_choose(KVA_BF16, limits->head_dim, KVA__PREFILL_ROWS_LARGE, &target, &large) ||
        !kva__prefill_choose(KVA_BF16, limits->head_dim, KVA__PREFILL_ROWS_SMALL, &target, &small) ||
        kva__prefill_tile_tokens_for(large.rows, group) < 1)
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "plan limits: prefill on CUDA supports head_dim multiples of 16 in 32..256 (above 128 "
                         "needs %d KB of shared memory per block; this GPU offers %d KB) (got head_dim %d)",
                         166, priv ? priv->smem_optin / 1024 : 0, limits->head_dim);
    const int per_sm = priv && priv->prefill_blocks_per_sm[dim_idx] > 0 ? priv->prefill_blocks_per_sm[dim_idx] : 1;
    policy->max_blocks = (int64_t)(ctx->num_sms > 0 ? ctx->num_sms : 1) * per_sm;
    policy->min_chunk = 256;
    /* a causal plan's last waves may be reordered while their K/V (one KV head's) fits a quarter
     * of L2: the blocks straddle two heads at a time, and the rest is the outputs' traffic. The
     * H200's paired rounds gained 1-9% at <= 8 MB of it (d64-d128); d256 (16.8 MB, over the
     * H200's 15 MiB quarter) was not in them, and its 2 x 8192 causal row read below every
     * earlier table in the one run with half of L2: kept out until paired rounds decide
     * (bench/NOTES.md, "Causal plans: the last wave by order"). */
    policy->order_cache_bytes = (int64_t)(ctx->l2_bytes / KVA__ORDER_L2_DIVISOR);
    policy->qo_tile = kva__prefill_tile_tokens_for(large.rows, group);
    const int32_t small_tile = kva__prefill_tile_tokens_for(small.rows, group);
    policy->qo_tile_min = small_tile >= 1 && small_tile < policy->qo_tile ? small_tile : 0;
    if (large.tma) {
        /* the persistent launch's blocks, as prefill_launch.cu sizes its grid (one per SM, at
         * most KVA_PREFILL_PERSISTENT = N -- then also the concurrency the split search fills,
         * though not the workspace layout; = 0: a block per pair, nothing to balance) */
        const char *pers = getenv("KVA_PREFILL_PERSISTENT");
        const long cap = pers ? strtol(pers, NULL, 10) : 0;
        long blocks = ctx->num_sms > 0 ? ctx->num_sms : 1;
        if (cap > 0 && blocks > cap) blocks = cap;
        if (cap > 0 && policy->max_blocks > cap) policy->search_blocks = cap;
        policy->balance_blocks = pers && strcmp(pers, "0") == 0 ? 0 : (int32_t)blocks;
        policy->balance_tile_keys = large.block_n > 0 ? large.block_n : 128;
        /* (tests: KVA_PREFILL_BALANCE_MIN_TILES = N cuts items of N tiles, so that small batches
         * on a capped grid exercise the cut) */
        const char *mt = getenv("KVA_PREFILL_BALANCE_MIN_TILES");
        policy->balance_min_tiles = mt ? (int32_t)strtol(mt, NULL, 10) : 0;
    }
    return KVA_OK;
}

/* How much a plan kept on the sub-group decode kernel for a large group may stream: keys x KV
 * heads x sub-groups x the built head dim (each sub-group re-reads its chunk's K/V). Measured on an H200
 * (bf16, plan on the sub-group kernel against the prefill kernel's, us; bench/NOTES.md, call 5 of
 * "Shared-merge review fixes"): below it 71/1 d64 / 48/1 d128 / 71/1 d96 / 32/1 d256 at 1 x 8192
 * (2.6-5.2 M) 12.4 / 12.9 / 14.4 / 16.4 against 16.3 / 16.0 / 16.8 / 17.9; above it 64/1 d192 at
 * 1 x 8192 (8.4 M: the d256 kernel, 4 sub-groups) 20.3 against 17.8, every 1 x 32768 at d96 and
 * up 25.8-47.0 against 21.4-24.8, 48/1 d128 4 x 8192 20.7 against 19.9, 3 x 32768 at d64 / d96 /
 * d128 / d256 39.6-66.0 against 26.5-42.4 (48/1 d128 1 x 32768 and 2 x 16384, 12.6 M, still won by
 * 0.5 / 2.4 us: the long-request bound below takes them). Calibrated on that H200 (132 SMs) only:
 * other Hopper parts take it as is, and it does not scale with the SM count. */
#ifndef KVA__SUBGROUP_MAX_KEY_DIMS /* (-D for measurements) */
#define KVA__SUBGROUP_MAX_KEY_DIMS (6LL * 1024 * 1024)
#endif
/* ... and for batches of long requests (KVA__SUBGROUP_LONG_REQUEST keys or more on average), up to
 * KVA__SUBGROUP_LONG_MAX_KEY_DIMS: there the prefill kernel's plans take long chunks and a merge
 * of many states. H200, bf16, with the round at the kernel's residency (bench/NOTES.md, "The keys
 * bound on a GPU", call 3), sub-group plan against the prefill kernel's, us: 71/1 d64 1 x 32768
 * (10.5 M) 19.9-20.0 against 21.1-21.8, 2 x 16384 18.9-19.2 against 21.5-22.2, 48/1 d128 1 x 32768
 * (12.6 M) 20.2-20.3 against 20.4-21.2, 2 x 16384 19.5-19.7 against 22.0-22.5, 71/1 d96 1 x 16384
 * (10.5 M) 17.8-17.9 against 20.6-21.1, 32/1 d256 1 x 16384 (8.4 M) 20.5-20.7 against 21.3-21.6;
 * while batches of 8192-key and shorter requests lost there (4 x 8192 at d64 and d128, 2 x 8192
 * at d96 and d256, 4 x 4096 at d256, 64/1 d192 1 x 8192: +0.8..+4.1 us), and long requests from
 * 16.8 M up (d256 1 x 32768 29.5 against 24.8 on 2026-11-30 12:38, d96 1 x 32768 25.8 against
 * 21.4). Between the two means the bound rises in a line from the short one at a mean of 8192
 * keys (kva__subgroup_batch_fits), fitted to one probe: the sub-groups won 1.3-3.8 us where the
 * batch lies below that line (71/1 d64 2 x 10240 / 2 x 12288 17.8-17.9 / 19.8-20.0 -> 16.3 /
 * 16.5, 48/1 d128 18.3-18.4 / 20.1-20.2 -> 16.4 / 18.0-18.1, 71/1 d96 1 x 10240 / 1 x 12288
 * 17.5-17.6 / 20.0 -> 16.0-16.2 / 16.2) and lost or tied above it (+0.2..+5.2 us: d64 3 x 10240
 * and 4 x 10240, d128 3 x 10240 and 3 x 12288, d96 2 x 10240, d256 2 x 10240 and 2 x 12288; one
 * win of 0.7-0.8 us, d64 3 x 12288, left out); bench/NOTES.md, "The sub-group round's test", call 1. */
#ifndef KVA__SUBGROUP_LONG_REQUEST
#define KVA__SUBGROUP_LONG_REQUEST 16384
#endif
#ifndef KVA__SUBGROUP_LONG_MAX_KEY_DIMS
#define KVA__SUBGROUP_LONG_MAX_KEY_DIMS (14LL * 1024 * 1024)
#endif

/* The decode kernel's split policy (its budget, shortest chunk, prices, merge tree) for choice ch
 * at per_sm blocks per SM (<= 2 for a split budget; the kernel's residency for the sub-group round):
 * the policy of groups it runs, and the alternative plan of the groups the prefill kernel runs
 * (subgroup_blocks). */
static void decode_kernel_policy(const kva_context *ctx, int32_t head_dim, const kva__decode_choice *ch, int per_sm,
                                 kva__split_policy *policy) {
    policy->merge_tree = 1;
    policy->max_blocks = (int64_t)(ctx->num_sms > 0 ? ctx->num_sms : 1) * per_sm;
    /* The planner counts (work item x KV head) blocks; a group of more than 16 heads makes nsub
     * units of each, so fewer work items fill the device. */
    if (ch->nsub > 1) {
        policy->max_blocks /= ch->nsub;
        if (policy->max_blocks < 1) policy->max_blocks = 1;
    }
    /* One 16-key tile per warp: shorter chunks leave warps idle and only add merge work. */
    policy->min_chunk = 16 * KVA__DECODE_WARPS;
    /* how much a block gains from an SM of its own, by head dim (the scheduler weighs one lone
     * block per SM against two paired ones) */
    policy->lone_block_percent = kva__cuda_decode_lone_block_percent(head_dim);
    policy->merge_level_keys = kva__cuda_decode_merge_level_keys(head_dim);
}

extern "C" kva_status kva__cuda_split_policy(const kva_context *ctx, const kva_plan_limits *limits,
                                             int kind, kva__split_policy *policy) {
    const int idx = limits->head_dim <= 64 ? 0 : limits->head_dim <= 128 ? 1 : 2;
    if (kind != KVA__PLAN_DECODE) return prefill_policy(ctx, limits, idx, policy);
    const kva__cuda_private *priv = (const kva__cuda_private *)ctx->cuda_private;
    /* The bf16 partial-rowmax kernel the chooser picks for the limits' head dim and GQA group
     * (the limits carry no dtype or algorithm; f16 is the same kernel, f32 and global rowmax
     * hold as many or fewer). */
    const int group = limits->num_kv_heads > 0 ? limits->num_qo_heads / limits->num_kv_heads : 1;
    kva__decode_choice ch;
    if (!kva__decode_kernel_for(ctx, KVA_BF16, limits->head_dim, group, 0, &ch))
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "plan limits: decode on CUDA supports head_dim multiples of 16 in 32..256 (got %d)",
                         limits->head_dim);
    int per_sm = ch.blocks_per_sm;
    /* Global rowmax: a split request's chunks stream K in pass 1 and K and V in pass 2, 1.5x the
     * bytes of one pass (H200: split batches 1.5-1.8x partial rowmax's time, unsplit ones
     * +0.4-8%). Groups above 16 run it on the sub-group decode kernel, not the prefill one, at
     * their own price (below). */
    policy->global_split_key_percent = 150;
    /* Split requests into at most 2 blocks per SM: one SM streams at about its share of the
     * memory bandwidth with 1 to 2 blocks (bench/NOTES.md), and more chunks only add merge work.
     * Residency beyond that still helps unsplit batches, whose next blocks start while others
     * stream. */
    if (per_sm > 2) per_sm = 2;
    if (ch.via_prefill) {
        /* the prefill kernel: one persistent block per SM walks the chunks; two chunks per SM
         * balance uneven ones, and a chunk is at least one 128-key tile */
        policy->max_blocks = (int64_t)(ctx->num_sms > 0 ? ctx->num_sms : 1) * 2;
        /* ... but the split search weighs the blocks that really run at once (the persistent
         * grid: one per SM on the TMA path), and a block's later chunk costs it ~5-8 us beyond
         * its keys (the item's Q, epilogue and record chain): H200, Falcon-7B / StarCoder-15B at
         * 64 x 4096, 2 chunks of 2048 per request 40.1 / 48.7 us against 4 of 1024 (two per
         * block) 45.7 / 55.5 (bench/NOTES.md, "Decode on the prefill kernel") */
        const int prefill_per_sm = priv && priv->prefill_blocks_per_sm[idx] > 0 ? priv->prefill_blocks_per_sm[idx] : 1;
        policy->search_blocks = (int64_t)(ctx->num_sms > 0 ? ctx->num_sms : 1) * prefill_per_sm;
        policy->next_item_keys = 1024;
        /* and a split plan pays the merge launch after the grid (~5 us: 64 x 1024 unsplit 19.4 /
         * 20.1 us, in two chunks of 512 22.8 / 21.5-22.3, StarCoder / Falcon) */
        policy->split_keys = 768;
        policy->min_chunk = 128;
        policy->qo_tile = 1;
        policy->merge_tree = 0; /* the prefill merge: one warp per row reads every state */
        /* Global rowmax of these groups runs on the sub-group decode kernel (its two passes are
         * not built on the prefill one): nsub units per work item on that kernel's blocks, at its
         * costs -- planned at the prefill kernel's, StarCoder-15B 64 x 4096 split in two chunks and
         * ran 202.0 us against 108.9 unsplit (H200; bench/NOTES.md, "Global-rowmax plans") */
        kva__decode_choice gch;
        if (kva__decode_kernel_for(ctx, KVA_BF16, limits->head_dim, group, 1, &gch)) {
            const int gper = gch.blocks_per_sm < 1 ? 1 : gch.blocks_per_sm > 2 ? 2 : gch.blocks_per_sm;
            const int64_t gb = (int64_t)(ctx->num_sms > 0 ? ctx->num_sms : 1) * gper / gch.nsub;
            policy->global_search_blocks = gb > 0 ? gb : 1;
            /* and there a split unit costs ~1.85x its keys, not 1.5x: with 48-71 query rows per
             * key these groups are compute-heavy, and pass 1 repeats their Q K^T (H200, global
             * rowmax 64 x 4096 in two chunks of 2048 against unsplit: 71/1 d64 181.2 / 98.5 us,
             * 48/1 d128 202.0 / 108.9) */
            policy->global_split_key_percent = 185;
        }
        /* A plan that fits one round of the sub-group kernel in 16+ chunks per split request,
         * of at most KVA__SUBGROUP_MAX_KEY_DIMS (_LONG_MAX_KEY_DIMS for long requests), runs
         * there (kva__split_policy.subgroup_blocks):
         * at 1 x 8192 its shared merge made Falcon-7B (71/1 d64) 16.5 -> 12.8-12.9 us and
         * StarCoder-15B (48/1 d128) 15.8-16.1 -> 13.0-13.1 against this path; 8 x 4096 (6 chunks
         * each) and 64 x 4096 stay here (H200, bench/NOTES.md, "Large groups on the sub-group
         * kernel at small batch"). Not while KVA_DECODE_GROUP_PATH forces a path or the shared
         * merge is off. */
        /* (ch.fn, blocks_per_sm and nsub are the sub-group kernel's. The policy is the bf16
         * kernel's, like the rest of it: a variant or f32 kernel with fewer resident blocks
         * runs such a plan in two rounds, merged by the last blocks or the tree -- correct,
         * not shared) */
        const char *force = getenv("KVA_DECODE_GROUP_PATH");
        if ((!force || !*force) && priv && priv->decode_shared_merge_min <= 0xffff) {
            kva__split_policy sub = *policy;
            /* one round of the grid as launched: every block the kernel keeps resident (3 per SM
             * for the d64 sub-group kernel, 2 at d128, 1 at d256), not the split budget's cap of
             * 2 -- that cap saves merge work, which the shared merge spreads over the chunk blocks
             * (H200, Falcon-7B 1 x 8192 in 64 chunks 12.0 us against 43 at the capped budget 12.5) */
#ifndef KVA__SUBGROUP_CAPPED_ROUND /* (-DKVA__SUBGROUP_CAPPED_ROUND: the old budget, for A/B runs) */
            const int round_per_sm = ch.blocks_per_sm > 0 ? ch.blocks_per_sm : 1;
#else
            const int round_per_sm = per_sm;
#endif
            decode_kernel_policy(ctx, limits->head_dim, &ch, round_per_sm, &sub);
            policy->subgroup_blocks = sub.max_blocks;
            policy->subgroup_min_chunks = priv->decode_shared_merge_min;
            policy->subgroup_max_keys = KVA__SUBGROUP_MAX_KEY_DIMS / ((int64_t)ch.nsub * ch.built_dim);
            policy->subgroup_long_max_keys = KVA__SUBGROUP_LONG_MAX_KEY_DIMS / ((int64_t)ch.nsub * ch.built_dim);
            policy->subgroup_long_request = KVA__SUBGROUP_LONG_REQUEST;
            policy->subgroup_min_chunk = sub.min_chunk;
            policy->subgroup_lone_block_percent = sub.lone_block_percent;
            policy->subgroup_merge_level_keys = sub.merge_level_keys;
        }
        return KVA_OK;
    }
    decode_kernel_policy(ctx, limits->head_dim, &ch, per_sm, policy);
    policy->qo_tile = 1;
    return KVA_OK;
}
