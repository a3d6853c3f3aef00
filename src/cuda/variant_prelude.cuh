/*
 * variant_prelude.cuh -- what a variant's source may use besides CUDA's math functions
 * (kvattn.h, kva_variant): compiled in front of the caller's source by variant_compile.c, after
 * rtc_shim.cuh (int32_t and the other fixed-width integers, INFINITY, NAN).
 */
#ifndef KVA_VARIANT_PRELUDE_CUH
#define KVA_VARIANT_PRELUDE_CUH

#define KVA_LOG2E 1.4426950408889634f

/* tanh to ~1e-7 absolute: the kernels compile with --use_fast_math, under which tanhf is the
 * hardware approximation (relative error ~5e-4); this is the library's own soft-cap tanh. */
__device__ __forceinline__ float kva_tanhf(float x) {
    const float e = exp2f(fabsf(x) * 2.8853900817779268f); /* exp(2|x|) */
    return copysignf(1.0f - __fdividef(2.0f, e + 1.0f), x);
}

/* (float)x for |x| < 2^22, exactly, on the full-rate integer and FP32 pipes: an int-to-float
 * conversion (I2F) runs at a quarter of the FMA rate, like exp2, so a modifier that converts a
 * position or distance per score can cost as much as the softmax's own exp2. (1.5 * 2^23 + x has
 * x as its low mantissa bits; subtracting 1.5 * 2^23 leaves x.) */
__device__ __forceinline__ float kva_int_to_float(int32_t x) {
    return __int_as_float(0x4B400000 + x) - 12582912.0f;
}

/* The score of a masked key (-INFINITY), as a function: usable in sources that are written as C
 * macros and stringified (examples/variant_sources.h), where INFINITY would already be expanded. */
__device__ __forceinline__ float kva_masked() { return -INFINITY; }

#endif /* KVA_VARIANT_PRELUDE_CUH */
