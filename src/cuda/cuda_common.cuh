/*
 * cuda_common.cuh -- what every .cu file of the CUDA backend shares: CUDA-call checking that
 * turns runtime errors into kva_status, the backend's private per-context state, and thin
 * inline-PTX wrappers (cp.async, ldmatrix, movmatrix, mma.sync) used by the decode kernels.
 *
 * The PTX wrappers need sm_80 or newer (cp.async, bf16 mma); the build targets sm_90a and sm_80.
 */
#ifndef KVA_CUDA_COMMON_CUH
#define KVA_CUDA_COMMON_CUH

#ifdef __CUDACC_RTC__
/* Compiled at run time by NVRTC (a variant, variant_compile.c): no toolkit headers exist on the
 * user's machine, so the few types and conversions the kernels use come from rtc_shim.cuh, and
 * the host half of this file (runtime calls, the backend's private state) is left out. */
#include "rtc_shim.cuh"
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "../common/internal.h"

/* Returns KVA_ERR_DEVICE with the runtime's message if a CUDA call fails. */
#define KVA_CUDA_TRY(call)                                                                     \
    do {                                                                                       \
        cudaError_t kva__e = (call);                                                           \
        if (kva__e != cudaSuccess)                                                             \
            return kva__fail(KVA_ERR_DEVICE, "%s: %s failed: %s", __func__, #call,             \
                             cudaGetErrorString(kva__e));                                      \
    } while (0)

/* After a launch: reports a launch-configuration error (bad grid, too much shared memory). */
#define KVA_CUDA_LAUNCHED(what)                                                                \
    do {                                                                                       \
        cudaError_t kva__e = cudaGetLastError();                                               \
        if (kva__e != cudaSuccess)                                                             \
            return kva__fail(KVA_ERR_DEVICE, "%s: launching %s failed: %s", __func__, what,    \
                             cudaGetErrorString(kva__e));                                      \
    } while (0)

/* Plan uploads still possibly in flight, per workspace host part (see kva__cuda_plan_begin). */
#define KVA__UPLOAD_SLOTS 8

/* When a decode unit may hold two adjacent KV heads (kva__decode_pair_for): plans that split no
 * request (the default), any plan (KVA_DECODE_PAIR_HEADS=1: tests), never (=0). */
typedef enum { KVA__PAIR_UNSPLIT = 0, KVA__PAIR_ALWAYS = 1, KVA__PAIR_NEVER = 2 } kva__pair_mode;

typedef struct kva__cuda_private {
    cudaEvent_t upload_done[KVA__UPLOAD_SLOTS];
    const void *upload_host[KVA__UPLOAD_SLOTS];
    int upload_next;
    int decode_blocks_per_sm[9][4]; /* resident blocks per SM of each decode kernel
                                       [entry][(nt - 1) + 2 * global_rowmax] */
    int prefill_blocks_per_sm[3];   /* resident blocks per SM of the largest bf16 prefill kernel,
                                       head_dim 64 / 128 / 256 */
    int prefill_path;               /* kva__prefill_path of this device */
    int merge_pdl;                  /* 1: the prefill merge kernel runs code compiled for sm_90+ here (it
                                       holds kva__pdl_wait), so it may be launched as a programmatic
                                       dependent (prefill_launch.cu) */
    int decode_pdl;                 /* 1: built with KVA__DECODE_PDL and every decode kernel runs
                                       sm_90+ code here: decode runs launch as programmatic
                                       dependents of the stream's previous kernel (decode_launch.cu) */
    int smem_optin;                 /* shared memory a block may opt into, bytes */
    uint32_t decode_merge_wait_ns;  /* the decode kernel's shared-merge pause
                                       (KVA_DECODE_MERGE_WAIT_NS, decode_merge.cuh; default 100 us,
                                       tests 0) */
    int32_t decode_shared_merge_min; /* chunks from which it merges shared (KVA__SHARED_MERGE_MIN,
                                       or never: KVA_DECODE_SHARED_MERGE=0, the tree tests) */
    int decode_pair_heads;          /* kva__pair_mode: when decode units hold two adjacent KV
                                       heads (kva__decode_pair_for; KVA_DECODE_PAIR_HEADS) */
    unsigned *merge_withdrawals;    /* device word: shared-merge withdrawals since context creation
                                       (rare by design; tests assert theirs happened) */
    int cc_major, cc_minor;         /* compute capability: the architecture variants compile for */
    void **vmods;                   /* kva__vmod_loaded *: every variant module loaded (variant_load.cu) */
    int num_vmods, cap_vmods;
} kva__cuda_private;

/* Unloads the context's variant modules (variant_load.cu; at context destruction). */
extern "C" void kva__cuda_variant_modules_release(kva__cuda_private *priv);


static inline cudaStream_t kva__stream(const kva_context *ctx) {
    return (cudaStream_t)ctx->stream;
}

/* Makes the context's device current for this thread (cheap when it already is). */
static inline kva_status kva__cuda_use_device(const kva_context *ctx) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != ctx->device_id) {
        cudaError_t e = cudaSetDevice(ctx->device_id);
        if (e != cudaSuccess)
            return kva__fail(KVA_ERR_DEVICE, "cudaSetDevice(%d): %s", ctx->device_id,
                             cudaGetErrorString(e));
    }
    return KVA_OK;
}

#endif /* !__CUDACC_RTC__ */

/* ------------------------------------------------------------------------------------------ */
/* Score-modifier hook (kvattn.h, kva_variant)                                                  */
/* ------------------------------------------------------------------------------------------ */

/* A variant's NVRTC build (variant_compile.c) defines KVA_SCORE_MOD_FN as the caller's device
 * function; the library's own build leaves it undefined. Kernels apply the modifier where the
 * CPU applies score_mod -- on a visible score, in natural-log units, after the scale and the
 * soft cap and before the masks; masked keys stay masked and are never passed to it (in a tile
 * with masks a masked slot may call it with a key its row sees instead, the result dropped:
 * kva__pf_apply_score_mod) -- inside
 * `if constexpr (KVA__HAS_SCORE_MOD)`, so without a variant the kernels are the same code
 * (ptxas register and spill counts unchanged). `user` is kva_attn_params.score_mod_user, a
 * device pointer, carried in the kernels' argument blocks as mod_user. */
#ifdef KVA_SCORE_MOD_FN
#define KVA__HAS_SCORE_MOD true
/* declared here so a definition with another signature is a compile error naming it */
__device__ __forceinline__ float KVA_SCORE_MOD_FN(float, int32_t, int32_t, int32_t, const void *);
/* Kernels call the modifier through this, so a caller's function named like a local variable of
 * a kernel (s, x, p, key, ...) is never shadowed at the call site. */
__device__ __forceinline__ float kva__score_mod_call(float kva__s, int32_t kva__q, int32_t kva__k,
                                                     int32_t kva__h, const void *kva__u) {
    return KVA_SCORE_MOD_FN(kva__s, kva__q, kva__k, kva__h, kva__u);
}
#define KVA_SCORE_MOD(s, q_pos, kv_pos, qo_head, user) kva__score_mod_call((s), (q_pos), (kv_pos), (qo_head), (user))
#else
#define KVA__HAS_SCORE_MOD false
#define KVA_SCORE_MOD(s, q_pos, kv_pos, qo_head, user) (s)
#endif

/* ------------------------------------------------------------------------------------------ */
/* Inline PTX                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* The end of a row's softmax (kvattn.h, kva_attn_params, "Range"): 1 / L and the natural-log
 * LSE from the log2 max M and the sum L. L == 0 is a row that saw no key (output 0, LSE -inf); a
 * NaN L marks a score that left f32 range, and the row stays NaN instead of looking empty. */
__device__ __forceinline__ float kva__softmax_inv(float L) {
    return L > 0.0f ? 1.0f / L : (L == 0.0f ? 0.0f : NAN);
}
__device__ __forceinline__ float kva__softmax_lse(float M, float L) {
    return L > 0.0f ? (M + __log2f(L)) * 0.6931471805599453f : (L == 0.0f ? -INFINITY : NAN);
}

/* tanh(x) for the soft cap of the decode and f32 kernels (and a variant's kva_tanhf there): an
 * odd series below |x| = 0.4 (error < 2e-9, a few ulp relative near 0), 1 - 2 / (e^2|x| + 1) above
 * it, saturating to +-1. The second form alone cancels every digit of a small x (~1e-7 absolute,
 * 0 below |x| ~3e-8), so a cap far above the scores moved them by up to cap * 6e-8; tanhf under
 * --use_fast_math is tanh.approx (relative error ~5e-4), too coarse for f32 results. The CPU's
 * kva__tanh (simd.h) has the same two parts. */
__device__ __forceinline__ float kva__tanh_accurate(float x) {
    const float ax = fabsf(x), x2 = x * x;
    float p = 21844.0f / 6081075.0f;
    p = fmaf(p, x2, -1382.0f / 155925.0f);
    p = fmaf(p, x2, 62.0f / 2835.0f);
    p = fmaf(p, x2, -17.0f / 315.0f);
    p = fmaf(p, x2, 2.0f / 15.0f);
    p = fmaf(p, x2, -1.0f / 3.0f);
    const float series = fmaf(p * x2, x, x);
    const float e = exp2f(ax * 2.8853900817779268f); /* exp(2|x|) */
    const float big = copysignf(1.0f - __fdividef(2.0f, e + 1.0f), x);
    return ax < 0.4f ? series : big;
}

/* Programmatic dependent launch (sm_90+): a kernel launched after this one on its stream with
 * the programmatic-serialization attribute may have its blocks placed once every block of this
 * grid has called kva__pdl_trigger (or ended), so its launch latency overlaps this grid's end;
 * it calls kva__pdl_wait before touching anything this grid writes, which returns once this
 * grid has completed and its writes are visible. Both compile to nothing for targets before
 * sm_90, so the host sets the attribute only where the dependent's running code was compiled for
 * sm_90+ (kva__cuda_private.merge_pdl: a device newer than the build's sm_90a code runs its
 * sm_80 PTX, which has no wait); for kernels launched without it the trigger does nothing. */
__device__ __forceinline__ void kva__pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void kva__pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Decode as a programmatic dependent of the kernel before it (on by default since 2026-11-29;
 * -DKVA__DECODE_PDL=0 builds the old order; bench/NOTES.md, "the decode kernel as a programmatic
 * dependent of the step's append": -2.1 us per layer of append + decode at 1 x 8192 on an H200).
 * The append kernel triggers its dependents at its start, and a decode run launched after it may
 * place its blocks at once: they read the plan's records, work count and first page ids -- the
 * plan's device part is written only by plan uploads, copies on the stream, never by a kernel, and
 * a copy before a launch is waited for in full -- and wait (kva__pdl_wait) before anything a
 * previous kernel may write: q, the K/V pages, o, the partial states (blocks without work wait
 * too before they end). A variant's caller data (kva_attn_params.score_mod_user) may be a previous
 * kernel's output too: read after the wait (kva__unit_caller_data); its modules launch this way
 * when their code runs sm_90+ (variant_load.cu). */
#ifndef KVA__DECODE_PDL
#define KVA__DECODE_PDL 1
#endif

__device__ __forceinline__ uint32_t kva__smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* An L2 policy for data read once (K/V streams): evicted first, so the small plan arrays that
 * every run (and every layer) reads stay in L2 instead. */
__device__ __forceinline__ uint64_t kva__l2_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}

/* 16-byte global -> shared copy that bypasses L1; when !valid nothing is read and the 16 bytes
 * are zero-filled (so padding rows of a tile hold zeros, never stale NaNs). L2 fetches the
 * whole 128-byte line: rows that are not whole lines (d96: 192 bytes, half a line shared with
 * the next head's row; d80) streamed 3-14% faster on an H200, whole-line rows (d64, d128) the
 * same; 256 bytes was slower on all rows but one (bench/NOTES.md, "A chunk count that fills the
 * grid", also for the one row where 128 bytes lost). */
__device__ __forceinline__ void kva__cp_async16(uint32_t dst, const void *src, bool valid,
                                                uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(valid ? 16 : 0), "l"(policy)
                 : "memory");
}
__device__ __forceinline__ void kva__cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void kva__cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void kva__ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void kva__ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* Transposes an 8x8 matrix of 16-bit values held in fragment layout across the warp. */
__device__ __forceinline__ uint32_t kva__movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* D = A(16x16, row) * B(16x8, col) + D, f32 accumulators; T selects bf16 or f16 operands. */
template <typename T>
__device__ __forceinline__ void kva__mma16816(float d[4], const uint32_t a[4], uint32_t b0,
                                              uint32_t b1);
template <>
__device__ __forceinline__ void kva__mma16816<__nv_bfloat16>(float d[4], const uint32_t a[4],
                                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void kva__mma16816<__half>(float d[4], const uint32_t a[4], uint32_t b0,
                                                      uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats -> one register of two 16-bit values (lo in the low half). */
template <typename T> __device__ __forceinline__ uint32_t kva__pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t kva__pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t kva__pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Scalar conversions for the three element types. */
__device__ __forceinline__ float kva__to_f32(float x) { return x; }
__device__ __forceinline__ float kva__to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float kva__to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T kva__from_f32(float x);
template <> __device__ __forceinline__ float kva__from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half kva__from_f32<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 kva__from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

#endif /* KVA_CUDA_COMMON_CUH */
