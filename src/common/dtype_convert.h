/*
 * dtype_convert.h -- scalar f16 / bf16 <-> f32 conversions on bit patterns, portable C.
 * Round to nearest even on narrowing; NaN stays NaN; f16 overflow goes to infinity.
 * Kernels use their own vectorised forms; these are for host glue, tests and the reference.
 */
#ifndef KVA_DTYPE_CONVERT_H
#define KVA_DTYPE_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline float kva__bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t kva__f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float kva__bf16_to_f32(uint16_t h) { return kva__bits_to_f32((uint32_t)h << 16); }

static inline uint16_t kva__f32_to_bf16(float f) {
    uint32_t u = kva__f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The f16 conversions are written as selects over every case (no branches), so loops over them
 * vectorise (kva_convert); each case is what the comment next to it says. */
static inline float kva__f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;                    /* exponent and mantissa */
    const uint32_t normal = (em << 13) + 0x38000000u;   /* exponent rebiased 15 -> 127 */
    const uint32_t inf_nan = (em << 13) | 0x7f800000u;  /* exponent 31 -> 255, payload kept */
    const uint32_t small = kva__f32_to_bits((float)em * (1.0f / 16777216.0f)); /* zero, subnormal: em * 2^-24 */
    const uint32_t bits = em < 0x0400u ? small : em >= 0x7c00u ? inf_nan : normal;
    return kva__bits_to_f32(sign | bits);
}

static inline uint16_t kva__f32_to_f16(float f) {
    const uint32_t u = kva__f32_to_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    /* below 2^-14 (f16 subnormal or zero): adding 0.5 puts the value's 2^-24 units in the low
     * mantissa bits, rounded to nearest even by the FPU */
    const uint32_t small = kva__f32_to_bits(kva__bits_to_f32(a) + 0.5f) - 0x3f000000u;
    /* normal: rebias the exponent (-112 << 23) and round the 13 dropped bits to nearest even */
    const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    const uint32_t bits = a > 0x7f800000u    ? 0x7e00u  /* NaN: a quiet NaN */
                          : a >= 0x477ff000u ? 0x7c00u  /* at or past 65520: infinity */
                          : a < 0x38800000u  ? small
                                             : normal;
    return (uint16_t)(sign | bits);
}

/* Load element i of a row of the given dtype as float. */
static inline float kva__load_f32(const void *p, int dtype, int64_t i) {
    switch (dtype) {
    case 0: return ((const float *)p)[i];
    case 1: return kva__f16_to_f32(((const uint16_t *)p)[i]);
    default: return kva__bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

/* Store a float as element i of a row of the given dtype. */
static inline void kva__store_f32(void *p, int dtype, int64_t i, float v) {
    switch (dtype) {
    case 0: ((float *)p)[i] = v; break;
    case 1: ((uint16_t *)p)[i] = kva__f32_to_f16(v); break;
    default: ((uint16_t *)p)[i] = kva__f32_to_bf16(v); break;
    }
}

#endif /* KVA_DTYPE_CONVERT_H */
