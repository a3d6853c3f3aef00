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

static inline float kva__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return kva__bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return kva__bits_to_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return kva__bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t kva__f32_to_f16(float f) {
    uint32_t u = kva__f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* overflow -> inf */
    if (a < 0x38800000u) {                                            /* subnormal or zero */
        /* add a magic number so the FPU's own rounding (to nearest even) does the work */
        float v = kva__bits_to_f32(a) + 0.5f;
        return (uint16_t)(sign | (uint16_t)(kva__f32_to_bits(v) - 0x3f000000u));
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (uint16_t)(a >> 13));
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
