/*
 * decode_vec.h -- the 16-lane f32 vector toolkit of the CPU decode kernels: GCC vector types,
 * K/V row loaders that convert f32 / f16 / bf16 to f32, fused multiply-add, a vector exp2, and
 * horizontal reductions (including a transposing one that turns 16 dot-product accumulators
 * into one vector of 16 dot products).
 *
 * Written with GCC vector extensions so it compiles anywhere; where the target has them
 * (-march=native on x86) the F16C / AVX-512 conversions and FMA are used explicitly, because in
 * ISO C mode GCC neither contracts a*b+c into an FMA nor vectorises _Float16 conversions.
 *
 * Packed element order: a K/V row is consumed 32 elements at a time as two vectors (a, b). For
 * f32 and f16 a = elements 0..15, b = 16..31. For bf16 a = the even elements and b = the odd
 * ones, because a bf16 pair read as one 32-bit lane becomes two floats with one shift and one
 * mask (no widening shuffle). A trailing block of 16 (head_dim % 32 == 16) is in natural order.
 * Queries (loaded with kva__load32 too) and output accumulators are kept in the same order as
 * the rows they meet, so dot products and weighted sums need no shuffles; kva__unpack32 restores
 * natural order once per output row.
 */
#ifndef KVA_DECODE_VEC_H
#define KVA_DECODE_VEC_H

#include "kvattn.h"
#include "../common/dtype_convert.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__F16C__) || defined(__FMA__)
#include <immintrin.h>
#endif

#define KVA_AI static inline __attribute__((always_inline))

/* Without AVX-512 GCC warns that 64-byte vector arguments would change the psABI; every
 * function here is inlined, so no such call ever exists. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#if defined(__clang__)
/* clang (the fuzz build, fuzz/) has no __builtin_shuffle; these loops over constant indices
 * compile to the same shuffles. GCC builds never see them. */
static inline v16f kva__shuffle1(v16f a, v16i idx) {
    v16f r;
    for (int i = 0; i < 16; ++i) r[i] = a[idx[i] & 15];
    return r;
}
static inline v16f kva__shuffle2(v16f a, v16f b, v16i idx) {
    v16f r;
    for (int i = 0; i < 16; ++i) r[i] = (idx[i] & 16) ? b[idx[i] & 15] : a[idx[i] & 15];
    return r;
}
#define KVA__SHUFFLE_PICK(_1, _2, _3, name, ...) name
#define __builtin_shuffle(...) KVA__SHUFFLE_PICK(__VA_ARGS__, kva__shuffle2, kva__shuffle1, 0)(__VA_ARGS__)
#endif
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));

KVA_AI v16f kva__splat(float x) { return (v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

KVA_AI v16f kva__loadf(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}
KVA_AI void kva__storef(float *p, v16f v) { memcpy(p, &v, sizeof v); }

/* Bitwise select: lanes where mask is all ones take a, others b. */
KVA_AI v16f kva__select(v16i mask, v16f a, v16f b) {
    return (v16f)(((v16i)a & mask) | ((v16i)b & ~mask));
}
KVA_AI v16f kva__vmax(v16f a, v16f b) { return kva__select(a > b, a, b); }

/* a * b + c, fused where the target has FMA. */
KVA_AI v16f kva__fma(v16f a, v16f b, v16f c) {
#if defined(__AVX512F__)
    return (v16f)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    union { v16f v; __m256 h[2]; } x = {a}, y = {b}, z = {c}, r;
    r.h[0] = _mm256_fmadd_ps(x.h[0], y.h[0], z.h[0]);
    r.h[1] = _mm256_fmadd_ps(x.h[1], y.h[1], z.h[1]);
    return r.v;
#else
    return a * b + c;
#endif
}

/* ---- row loaders ---------------------------------------------------------------------- */

/* 16 f16 values (bit patterns) to f32. */
KVA_AI v16f kva__f16x16_to_f32(const void *p) {
#if defined(__AVX512F__)
    return (v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__F16C__)
    union { v16f v; __m256 h[2]; } r;
    r.h[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    r.h[1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const char *)p + 16)));
    return r.v;
#else
    /* Shift the exponent+mantissa into float position and rescale by 2^112; this is exact for
     * normals and subnormals. Infinities and NaNs get the all-ones float exponent. */
    v16u16 h16;
    memcpy(&h16, p, sizeof h16);
    v16u h = __builtin_convertvector(h16, v16u);
    v16u sign = (h & 0x8000u) << 16;
    v16u em = h & 0x7fffu;
    v16f f = (v16f)(em << 13) * kva__splat(0x1p112f);
    v16f special = (v16f)((em << 13) | 0x7f800000u);
    f = kva__select((v16i)(em >= 0x7c00u), special, f);
    return (v16f)((v16u)f | sign);
#endif
}

/* 16 consecutive elements of a row, natural order. */
KVA_AI v16f kva__load16(int dtype, const void *p) {
    if (dtype == KVA_F32) return kva__loadf((const float *)p);
    if (dtype == KVA_F16) return kva__f16x16_to_f32(p);
    v16u16 h16;
    memcpy(&h16, p, sizeof h16);
    return (v16f)(__builtin_convertvector(h16, v16u) << 16);
}

/* 32 consecutive elements of a row as two vectors in packed order (see the file comment). */
KVA_AI void kva__load32(int dtype, const void *p, v16f *a, v16f *b) {
    if (dtype == KVA_BF16) {
        v16u x;
        memcpy(&x, p, sizeof x);
        *a = (v16f)(x << 16);
        *b = (v16f)(x & 0xffff0000u);
    } else {
        size_t half = dtype == KVA_F32 ? 64 : 32;
        *a = kva__load16(dtype, p);
        *b = kva__load16(dtype, (const char *)p + half);
    }
}

/* The inverse of kva__load32's packing: lo = elements 0..15, hi = 16..31 in natural order. */
KVA_AI void kva__unpack32(int dtype, v16f a, v16f b, v16f *lo, v16f *hi) {
    if (dtype == KVA_BF16) {
        const v16i l = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
        const v16i h = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
        *lo = __builtin_shuffle(a, b, l);
        *hi = __builtin_shuffle(a, b, h);
    } else {
        *lo = a;
        *hi = b;
    }
}

/* Stores 16 floats as 16 elements of dtype, rounding to nearest even. */
KVA_AI void kva__store16(int dtype, void *p, v16f v) {
    if (dtype == KVA_F32) {
        kva__storef((float *)p, v);
    } else if (dtype == KVA_BF16) {
        v16u u = (v16u)v;
        v16u r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        v16u nan = (u >> 16) | 0x40u; /* quiet a NaN instead of rounding it to infinity */
        r = (v16u)kva__select((v16i)((u & 0x7fffffffu) > 0x7f800000u), (v16f)nan, (v16f)r);
        v16u16 h = __builtin_convertvector(r, v16u16);
        memcpy(p, &h, sizeof h);
    } else {
#if defined(__AVX512F__)
        _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__)
        union { v16f v; __m256 h[2]; } x = {v};
        _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x.h[0], _MM_FROUND_TO_NEAREST_INT));
        _mm_storeu_si128((__m128i *)((char *)p + 16), _mm256_cvtps_ph(x.h[1], _MM_FROUND_TO_NEAREST_INT));
#else
        uint16_t h[16];
        for (int i = 0; i < 16; ++i) h[i] = kva__f32_to_f16(v[i]);
        memcpy(p, h, sizeof h);
#endif
    }
}

/* ---- exp2 and reductions ---------------------------------------------------------------- */

/* 2^x for x <= 0 (scores minus their max), relative error ~2e-7; exactly 0 below -125, so
 * masked (-inf) scores contribute nothing. */
KVA_AI v16f kva__exp2(v16f x) {
    const v16f lo = kva__splat(-125.0f);
    v16i keep = x >= lo;
    x = kva__select(keep, x, lo);
    x = kva__select(x > kva__splat(0.0f), kva__splat(0.0f), x);
    const v16f magic = kva__splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    v16f n = (x + magic) - magic;
    v16f f = x - n; /* in [-0.5, 0.5] */
    /* Taylor series of e^(f ln 2) to degree 6. */
    v16f p = kva__splat(1.5403530393381608e-4f);
    p = kva__fma(p, f, kva__splat(1.3333558146428443e-3f));
    p = kva__fma(p, f, kva__splat(9.6181291076284772e-3f));
    p = kva__fma(p, f, kva__splat(5.5504108664821580e-2f));
    p = kva__fma(p, f, kva__splat(2.4022650695910071e-1f));
    p = kva__fma(p, f, kva__splat(6.9314718055994531e-1f));
    p = kva__fma(p, f, kva__splat(1.0f));
    v16i bits = (v16i)p + (__builtin_convertvector(n, v16i) << 23);
    return (v16f)(bits & keep);
}

KVA_AI v16f kva__shuffle(v16f a, v16f b, v16i idx) { return __builtin_shuffle(a, b, idx); }

KVA_AI float kva__hsum(v16f v) {
    const v16i s8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
    const v16i s4 = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
    const v16i s2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
    const v16i s1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
    v16f x = v + __builtin_shuffle(v, s8);
    x = x + __builtin_shuffle(x, s4);
    x = x + __builtin_shuffle(x, s2);
    x = x + __builtin_shuffle(x, s1);
    return x[0];
}

KVA_AI float kva__hmax(v16f v) {
    const v16i s8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
    const v16i s4 = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
    const v16i s2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
    const v16i s1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
    v16f x = kva__vmax(v, __builtin_shuffle(v, s8));
    x = kva__vmax(x, __builtin_shuffle(x, s4));
    x = kva__vmax(x, __builtin_shuffle(x, s2));
    x = kva__vmax(x, __builtin_shuffle(x, s1));
    return x[0];
}

/* One level of the transposing reduction: within groups of 2h lanes, the first h lanes of the
 * result hold a's pairwise sums (lane i + lane i+h), the last h lanes b's. */
KVA_AI v16f kva__fold(v16f a, v16f b, v16i lo, v16i hi) {
    return kva__shuffle(a, b, lo) + kva__shuffle(a, b, hi);
}

/* r[i] = sum of the lanes of acc[i]: 16 horizontal sums for the price of 15 vector adds and 30
 * shuffles (one horizontal sum alone costs 4 adds and 4 shuffles). */
KVA_AI v16f kva__reduce16(const v16f acc[16]) {
    const v16i lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const v16i hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const v16i lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const v16i hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const v16i lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const v16i hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const v16i lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const v16i hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    v16f b[8], c[4], d[2];
    for (int k = 0; k < 8; ++k) b[k] = kva__fold(acc[k], acc[k + 8], lo8, hi8);
    for (int k = 0; k < 4; ++k) c[k] = kva__fold(b[k], b[k + 4], lo4, hi4);
    for (int k = 0; k < 2; ++k) d[k] = kva__fold(c[k], c[k + 2], lo2, hi2);
    return kva__fold(d[0], d[1], lo1, hi1);
}

#endif /* KVA_DECODE_VEC_H */
