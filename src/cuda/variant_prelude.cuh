/*
 * variant_prelude.cuh -- what a variant's source may use besides CUDA's math functions
 * (kvattn.h, kva_variant): compiled in front of the caller's source by variant_compile.c, after
 * rtc_shim.cuh (int32_t and the other fixed-width integers, INFINITY, NAN).
 */
#ifndef KVA_VARIANT_PRELUDE_CUH
#define KVA_VARIANT_PRELUDE_CUH

#define KVA_LOG2E 1.4426950408889634f

/* The soft cap's tanh, the same one the built-in soft cap uses in the kernel it is compiled into:
 * the one-instruction hardware tanh (tanh.approx.f32, relative error <= 2^-10.99) in the f16/bf16
 * prefill modules (variant_compile.c defines KVA__VARIANT_FAST_TANH there), where its error is
 * below the 16-bit roundings of P and V and the accurate form costs a second unit-queue trip per
 * score; elsewhere (decode, f32) kva__tanh_accurate (cuda_common.cuh, compiled in front of this
 * file). tanhf under --use_fast_math is coarser than either near 0. */
__device__ __forceinline__ float kva_tanhf(float x) {
#if defined(KVA__VARIANT_FAST_TANH)
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(x));
    return t;
#else
    return kva__tanh_accurate(x);
#endif
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
