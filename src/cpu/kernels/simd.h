/*
 * simd.h -- the one vector layer of the CPU kernels (decode, prefill, merge and the bench's
 * ceiling probes): f32 vectors of the target's native width, loads and stores of f32 / f16 /
 * bf16 rows, fused multiply-add, exp2, tanh, horizontal and transposing reductions.
 *
 * The width is chosen per translation unit by the ISA variant it is compiled as (CMake compiles
 * src/cpu/kernels/ once per variant, each with its own target flags and KVA_ISA_<NAME> defined;
 * cpu_dispatch.c picks one at context creation):
 *   KVA_ISA_AVX512  16 lanes, 32 registers (AVX-512 F/BW/VL/DQ)
 *   KVA_ISA_AVX2     8 lanes, 16 registers (AVX2 + FMA + F16C)
 *   KVA_ISA_NEON     4 lanes, 32 registers (aarch64 Advanced SIMD; FCVTL/FCVTN for f16)
 *   otherwise        4 lanes, 16 registers, no intrinsics at all: the portable fallback
 * The width comes from that macro, not from __AVX512F__ and friends, so a variant keeps its
 * width (and its register budget) even in a -march=native build.
 *
 * Why not one fixed width: 64-byte vectors on AVX2 are register pairs, and the decode kernels'
 * 16 accumulators then need 32 ymm registers out of 16 -- spills on every FMA.
 *
 * Everything is a GCC vector extension plus intrinsics where the portable form costs more: FMA
 * (ISO C mode, -std=c11, does not contract a * b + c), min / max, f16 conversions and exp2's
 * rounding and scaling. bf16 -> f32 is a 16-bit shift on every ISA; AVX512-BF16 / AVX512-FP16
 * instructions are not used: their dot products (bf16 pairs into f32) measured slower than
 * shift + FMA in decode (bench/NOTES.md), and f16 arithmetic would lose the f32 accumulation.
 *
 * Conversions round to nearest even and match src/common/dtype_convert.h bit for bit (NaN stays
 * NaN; only its payload may differ).
 */
#ifndef KVA_SIMD_H
#define KVA_SIMD_H

#include "kvattn.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(KVA_ISA_AVX512)
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "the avx512 variant needs -mavx512f -mavx512bw -mavx512vl"
#endif
#include <immintrin.h>
#define KVA__VL 16
#define KVA__NUM_VREGS 32
#elif defined(KVA_ISA_AVX2)
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the avx2 variant needs -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>
#define KVA__VL 8
#define KVA__NUM_VREGS 16
#elif defined(KVA_ISA_NEON)
#if !defined(__aarch64__)
#error "the neon variant is aarch64 only"
#endif
#include <arm_neon.h>
#define KVA__VL 4
#define KVA__NUM_VREGS 32
#else
#define KVA_ISA_GENERIC 1
#define KVA__VL 4
#define KVA__NUM_VREGS 16
#endif

/* The vectors never cross a translation unit (everything here is static inline), so GCC's
 * warning that wide vector arguments have another ABI on narrower ISAs does not apply. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef float kva__vf __attribute__((vector_size(4 * KVA__VL)));
typedef int32_t kva__vi __attribute__((vector_size(4 * KVA__VL)));
typedef uint32_t kva__vu __attribute__((vector_size(4 * KVA__VL)));
typedef uint16_t kva__vh __attribute__((vector_size(2 * KVA__VL)));

#define KVA__INLINE static inline __attribute__((always_inline))

/* Broadcasts (an initializer, not `{0} + x`, which is no identity for -0 and would cost an add). */
#if KVA__VL == 16
#define KVA__ALL_LANES(x) {x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}
#elif KVA__VL == 8
#define KVA__ALL_LANES(x) {x, x, x, x, x, x, x, x}
#else
#define KVA__ALL_LANES(x) {x, x, x, x}
#endif
KVA__INLINE kva__vf kva__splat(float x) { return (kva__vf)KVA__ALL_LANES(x); }
KVA__INLINE kva__vi kva__splat_i(int32_t x) { return (kva__vi)KVA__ALL_LANES(x); }

/* a * b + c with one rounding where the ISA has FMA. */
KVA__INLINE kva__vf kva__fma(kva__vf a, kva__vf b, kva__vf c) {
#if defined(KVA_ISA_AVX512)
    return (kva__vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(KVA_ISA_AVX2)
    return (kva__vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(KVA_ISA_NEON)
    return (kva__vf)vfmaq_f32((float32x4_t)c, (float32x4_t)a, (float32x4_t)b);
#else
    return a * b + c;
#endif
}

/* Lane select: mask lanes are all-ones or zero (the result of a vector comparison). */
KVA__INLINE kva__vf kva__select(kva__vi mask, kva__vf if_set, kva__vf if_clear) {
    return (kva__vf)(((kva__vi)if_set & mask) | ((kva__vi)if_clear & ~mask));
}

KVA__INLINE kva__vf kva__max(kva__vf a, kva__vf b) {
#if defined(KVA_ISA_AVX512)
    return (kva__vf)_mm512_max_ps((__m512)a, (__m512)b);
#elif defined(KVA_ISA_AVX2)
    return (kva__vf)_mm256_max_ps((__m256)a, (__m256)b);
#elif defined(KVA_ISA_NEON)
    return (kva__vf)vmaxq_f32((float32x4_t)a, (float32x4_t)b);
#else
    return kva__select(a > b, a, b);
#endif
}

KVA__INLINE kva__vf kva__min(kva__vf a, kva__vf b) {
#if defined(KVA_ISA_AVX512)
    return (kva__vf)_mm512_min_ps((__m512)a, (__m512)b);
#elif defined(KVA_ISA_AVX2)
    return (kva__vf)_mm256_min_ps((__m256)a, (__m256)b);
#elif defined(KVA_ISA_NEON)
    return (kva__vf)vminq_f32((float32x4_t)a, (float32x4_t)b);
#else
    return kva__select(a < b, a, b);
#endif
}

/* Unaligned vector load / store of floats. */
KVA__INLINE kva__vf kva__loadu(const float *p) {
    kva__vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
KVA__INLINE void kva__storeu(float *p, kva__vf v) { memcpy(p, &v, sizeof v); }

/* ---- dtype conversions ------------------------------------------------------------------- */

/* f16 bits (in u32 lanes) -> f32: shift exponent and mantissa into place and let a multiply by
 * 2^112 rebias the exponent, which also normalises f16 subnormals; inf / NaN are patched. */
KVA__INLINE kva__vf kva__f16_bits_to_f32(kva__vu h) {
    kva__vu em = h & 0x7fffu;
    kva__vu sign = (h & 0x8000u) << 16;
    kva__vu shifted = em << 13;
    kva__vf scaled = (kva__vf)shifted * kva__splat(0x1p112f);
    kva__vu special = (kva__vu)(em >= 0x7c00u);
    kva__vu infnan = shifted | 0x7f800000u;
    kva__vu bits = ((kva__vu)scaled & ~special) | (infnan & special);
    return (kva__vf)(bits | sign);
}

/* f32 -> f16 bits, round to nearest even (the vector form of kva__f32_to_f16). */
KVA__INLINE kva__vu kva__f32_to_f16_bits(kva__vf f) {
    kva__vu u = (kva__vu)f;
    kva__vu sign = (u >> 16) & 0x8000u;
    kva__vu a = u & 0x7fffffffu;
    kva__vu normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    /* subnormal results: adding 0.5 puts the bits in the low mantissa, rounded by the FPU */
    kva__vf small = (kva__vf)a + kva__splat(0.5f);
    kva__vu subnormal = (kva__vu)small - 0x3f000000u;
    kva__vu is_nan = (kva__vu)(a > 0x7f800000u);
    kva__vu is_ovf = (kva__vu)(a >= 0x477ff000u);
    kva__vu is_sub = (kva__vu)(a < 0x38800000u);
    kva__vu r = normal;
    r = (r & ~is_sub) | (subnormal & is_sub);
    r = (r & ~is_ovf) | (0x7c00u & is_ovf);
    r = (r & ~is_nan) | (0x7e00u & is_nan);
    return (r & 0xffffu) | sign;
}

/* f32 -> bf16 bits, round to nearest even, NaN kept quiet (the vector form of kva__f32_to_bf16). */
KVA__INLINE kva__vu kva__f32_to_bf16_bits(kva__vf f) {
    kva__vu u = (kva__vu)f;
    kva__vu is_nan = (kva__vu)((u & 0x7fffffffu) > 0x7f800000u);
    kva__vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    kva__vu quiet = (u >> 16) | 0x40u;
    return (rounded & ~is_nan) | (quiet & is_nan);
}

/* KVA__VL f16 values -> f32 with the hardware conversion where there is one (exact). */
KVA__INLINE kva__vf kva__load_f16(const void *p) {
#if defined(KVA_ISA_AVX512)
    return (kva__vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(KVA_ISA_AVX2)
    return (kva__vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#elif defined(KVA_ISA_NEON)
    return (kva__vf)vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
#else
    kva__vh h;
    memcpy(&h, p, sizeof h);
    return kva__f16_bits_to_f32(__builtin_convertvector(h, kva__vu));
#endif
}

/* KVA__VL consecutive elements of a row of the given dtype, as floats. */
KVA__INLINE kva__vf kva__loadv(const void *p, kva_dtype dtype) {
    if (dtype == KVA_F32) return kva__loadu((const float *)p);
    if (dtype == KVA_F16) return kva__load_f16(p);
    kva__vh h;
    memcpy(&h, p, sizeof h);
    return (kva__vf)(__builtin_convertvector(h, kva__vu) << 16);
}

/* Stores KVA__VL floats as consecutive elements of the given dtype (round to nearest even). */
KVA__INLINE void kva__storev(void *p, kva_dtype dtype, kva__vf v) {
    if (dtype == KVA_F32) {
        kva__storeu((float *)p, v);
        return;
    }
    kva__vh h;
    if (dtype == KVA_F16) {
#if defined(KVA_ISA_AVX512)
        h = (kva__vh)_mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(KVA_ISA_AVX2)
        h = (kva__vh)_mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(KVA_ISA_NEON)
        h = (kva__vh)vreinterpret_u16_f16(vcvt_f16_f32((float32x4_t)v));
#else
        h = __builtin_convertvector(kva__f32_to_f16_bits(v), kva__vh);
#endif
    } else {
        h = __builtin_convertvector(kva__f32_to_bf16_bits(v), kva__vh);
    }
    memcpy(p, &h, sizeof h);
}

/* ---- pairs of vectors in packed order (decode) ------------------------------------------ */
/*
 * The decode kernels consume a row 2 * KVA__VL elements at a time as two vectors (a, b). For
 * f32 and f16 a = elements 0..VL-1 and b = VL..2VL-1. For bf16 a = the even elements and b =
 * the odd ones, because a bf16 pair read as one 32-bit lane becomes two floats with one shift
 * and one mask (no widening shuffle). Queries and output accumulators are kept in the same
 * order as the rows they meet, so dot products and weighted sums need no shuffles;
 * kva__unpack_pair restores natural order once per output row.
 */
KVA__INLINE void kva__load_pair(kva_dtype dtype, const void *p, kva__vf *a, kva__vf *b) {
    if (dtype == KVA_BF16) {
        kva__vu x;
        memcpy(&x, p, sizeof x);
        *a = (kva__vf)(x << 16);
        *b = (kva__vf)(x & 0xffff0000u);
    } else {
        size_t half = (dtype == KVA_F32 ? 4 : 2) * (size_t)KVA__VL;
        *a = kva__loadv(p, dtype);
        *b = kva__loadv((const char *)p + half, dtype);
    }
}

#if KVA__VL == 16
#define KVA__ZIP_LO 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define KVA__ZIP_HI 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
#elif KVA__VL == 8
#define KVA__ZIP_LO 0, 8, 1, 9, 2, 10, 3, 11
#define KVA__ZIP_HI 4, 12, 5, 13, 6, 14, 7, 15
#else
#define KVA__ZIP_LO 0, 4, 1, 5
#define KVA__ZIP_HI 2, 6, 3, 7
#endif

/* The inverse of kva__load_pair's packing: lo = elements 0..VL-1, hi = VL..2VL-1. */
KVA__INLINE void kva__unpack_pair(kva_dtype dtype, kva__vf a, kva__vf b, kva__vf *lo,
                                  kva__vf *hi) {
    if (dtype == KVA_BF16) {
        *lo = __builtin_shufflevector(a, b, KVA__ZIP_LO);
        *hi = __builtin_shufflevector(a, b, KVA__ZIP_HI);
    } else {
        *lo = a;
        *hi = b;
    }
}

/* ---- exp2, tanh ------------------------------------------------------------------------- */

/* 2^x. Inputs below -125 give exactly 0 (so -inf, a masked score, contributes nothing and no
 * denormals reach the FMAs; the values lost are < 2^-125 of the row maximum). Round-to-nearest
 * split x = n + f, |f| <= 1/2, and a degree-7 Taylor polynomial of 2^f (relative error < 6e-9,
 * below float precision); AVX-512 rounds and scales with one instruction each, elsewhere n is
 * added to the exponent bits (inputs clamped at 127). */
KVA__INLINE kva__vf kva__exp2_poly(kva__vf f) {
    kva__vf p = kva__splat(1.525273380405984e-05f);
    p = kva__fma(p, f, kva__splat(1.5403530393381608e-04f));
    p = kva__fma(p, f, kva__splat(1.3333558146428443e-03f));
    p = kva__fma(p, f, kva__splat(9.618129107628477e-03f));
    p = kva__fma(p, f, kva__splat(5.550410866482158e-02f));
    p = kva__fma(p, f, kva__splat(2.402265069591007e-01f));
    p = kva__fma(p, f, kva__splat(6.931471805599453e-01f));
    return kva__fma(p, f, kva__splat(1.0f));
}

KVA__INLINE kva__vf kva__exp2(kva__vf x) {
#if defined(KVA_ISA_AVX512)
    const __mmask16 keep = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
    const __m512 n = _mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const kva__vf p = kva__exp2_poly(x - (kva__vf)n);
    return (kva__vf)_mm512_maskz_scalef_ps(keep, (__m512)p, n);
#else
    const kva__vf magic = kva__splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    kva__vi keep = x >= kva__splat(-125.0f);
    x = kva__min(kva__max(x, kva__splat(-125.0f)), kva__splat(127.0f));
    kva__vf t = x + magic;
    kva__vf p = kva__exp2_poly(x - (t - magic));
    kva__vi e = ((kva__vi)t - (kva__vi)magic) << 23;
    return (kva__vf)(((kva__vi)p + e) & keep);
#endif
}

/* tanh(x): odd Taylor series below |x| = 0.4 (error < 2e-9), 1 - 2 / (e^{2|x|} + 1) above it
 * (no cancellation there); saturates to +-1 without overflow. */
KVA__INLINE kva__vf kva__tanh(kva__vf x) {
    kva__vu sign = (kva__vu)x & 0x80000000u;
    kva__vf ax = (kva__vf)((kva__vu)x & 0x7fffffffu);
    kva__vf x2 = x * x;
    kva__vf p = kva__splat(21844.0f / 6081075.0f);
    p = kva__fma(p, x2, kva__splat(-1382.0f / 155925.0f));
    p = kva__fma(p, x2, kva__splat(62.0f / 2835.0f));
    p = kva__fma(p, x2, kva__splat(-17.0f / 315.0f));
    p = kva__fma(p, x2, kva__splat(2.0f / 15.0f));
    p = kva__fma(p, x2, kva__splat(-1.0f / 3.0f));
    kva__vf series = kva__fma(p * x2, x, x);
    kva__vf e = kva__exp2(ax * kva__splat(2.0f * 1.4426950408889634f));
    kva__vf big = kva__splat(1.0f) - kva__splat(2.0f) / (e + kva__splat(1.0f));
    big = (kva__vf)((kva__vu)big | sign);
    return kva__select(ax < kva__splat(0.4f), series, big);
}

/* ---- reductions and the transpose ---------------------------------------------------------- */

/* Horizontal sum / max by a halving tree over the lanes (lane i + lane i + h, h = VL/2, VL/4, ..);
 * once per row of a block, so plain code is enough. */
KVA__INLINE float kva__hsum(kva__vf v) {
    float lanes[KVA__VL];
    memcpy(lanes, &v, sizeof lanes);
    for (int h = KVA__VL / 2; h > 0; h /= 2)
        for (int i = 0; i < h; ++i) lanes[i] += lanes[i + h];
    return lanes[0];
}

KVA__INLINE float kva__hmax(kva__vf v) {
    float lanes[KVA__VL];
    memcpy(lanes, &v, sizeof lanes);
    for (int h = KVA__VL / 2; h > 0; h /= 2)
        for (int i = 0; i < h; ++i) lanes[i] = lanes[i + h] > lanes[i] ? lanes[i + h] : lanes[i];
    return lanes[0];
}

/* One level of the transposing reduction: within groups of 2h lanes, the first h lanes of the
 * result hold a's pairwise sums (lane i + lane i+h), the last h lanes b's. */
#define KVA__FOLD(a, b, LO, HI) \
    (__builtin_shufflevector((a), (b), LO) + __builtin_shufflevector((a), (b), HI))

#if KVA__VL == 16
#define KVA__F8_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define KVA__F8_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define KVA__F4_LO 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define KVA__F4_HI 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define KVA__F2_LO 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define KVA__F2_HI 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define KVA__F1_LO 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define KVA__F1_HI 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#elif KVA__VL == 8
#define KVA__F4_LO 0, 1, 2, 3, 8, 9, 10, 11
#define KVA__F4_HI 4, 5, 6, 7, 12, 13, 14, 15
#define KVA__F2_LO 0, 1, 8, 9, 4, 5, 12, 13
#define KVA__F2_HI 2, 3, 10, 11, 6, 7, 14, 15
#define KVA__F1_LO 0, 8, 2, 10, 4, 12, 6, 14
#define KVA__F1_HI 1, 9, 3, 11, 5, 13, 7, 15
#else
#define KVA__F2_LO 0, 1, 4, 5
#define KVA__F2_HI 2, 3, 6, 7
#define KVA__F1_LO 0, 4, 2, 6
#define KVA__F1_HI 1, 5, 3, 7
#endif

/* r[i] = sum of the lanes of acc[i], i < KVA__VL: VL horizontal sums for VL - 1 vector adds and
 * 2 (VL - 1) shuffles (one horizontal sum alone costs log2(VL) of each). */
KVA__INLINE kva__vf kva__reduce_lanes(const kva__vf acc[KVA__VL]) {
    kva__vf x[KVA__VL];
    memcpy(x, acc, sizeof x);
#if KVA__VL == 16
    for (int k = 0; k < 8; ++k) x[k] = KVA__FOLD(x[k], x[k + 8], KVA__F8_LO, KVA__F8_HI);
#endif
#if KVA__VL >= 8
    for (int k = 0; k < 4; ++k) x[k] = KVA__FOLD(x[k], x[k + 4], KVA__F4_LO, KVA__F4_HI);
#endif
    for (int k = 0; k < 2; ++k) x[k] = KVA__FOLD(x[k], x[k + 2], KVA__F2_LO, KVA__F2_HI);
    return KVA__FOLD(x[0], x[1], KVA__F1_LO, KVA__F1_HI);
}

/* In-place transpose of a KVA__VL x KVA__VL block held as KVA__VL row vectors: one butterfly
 * stage per power of two b < KVA__VL, each swapping the off-diagonal b x b sub-blocks between
 * rows i and i + b. */
#define KVA__TRANSPOSE_STAGE(r, b, ...)                                                        \
    _Pragma("GCC unroll 16") for (int i_ = 0; i_ < KVA__VL; ++i_) {                            \
        if (i_ & (b)) continue;                                                                \
        kva__vf x_ = (r)[i_], y_ = (r)[i_ + (b)];                                              \
        (r)[i_] = __builtin_shufflevector(x_, y_, __VA_ARGS__);                                \
        (r)[i_ + (b)] = __builtin_shufflevector(x_, y_, KVA__HI_##b);                          \
    }

#if KVA__VL == 16
#define KVA__HI_8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define KVA__HI_4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define KVA__HI_2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define KVA__HI_1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
KVA__INLINE void kva__transpose(kva__vf r[KVA__VL]) {
    KVA__TRANSPOSE_STAGE(r, 8, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
    KVA__TRANSPOSE_STAGE(r, 4, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
    KVA__TRANSPOSE_STAGE(r, 2, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
    KVA__TRANSPOSE_STAGE(r, 1, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
}
#elif KVA__VL == 8
#define KVA__HI_4 4, 5, 6, 7, 12, 13, 14, 15
#define KVA__HI_2 2, 3, 10, 11, 6, 7, 14, 15
#define KVA__HI_1 1, 9, 3, 11, 5, 13, 7, 15
KVA__INLINE void kva__transpose(kva__vf r[KVA__VL]) {
    KVA__TRANSPOSE_STAGE(r, 4, 0, 1, 2, 3, 8, 9, 10, 11)
    KVA__TRANSPOSE_STAGE(r, 2, 0, 1, 8, 9, 4, 5, 12, 13)
    KVA__TRANSPOSE_STAGE(r, 1, 0, 8, 2, 10, 4, 12, 6, 14)
}
#else
#define KVA__HI_2 2, 3, 6, 7
#define KVA__HI_1 1, 5, 3, 7
KVA__INLINE void kva__transpose(kva__vf r[KVA__VL]) {
    KVA__TRANSPOSE_STAGE(r, 2, 0, 1, 4, 5)
    KVA__TRANSPOSE_STAGE(r, 1, 0, 4, 2, 6)
}
#endif

#endif /* KVA_SIMD_H */
