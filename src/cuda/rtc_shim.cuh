/*
 * rtc_shim.cuh -- what the kernels take from the CUDA toolkit's headers, for the NVRTC build of
 * a variant (variant_compile.c). A user's machine has libnvrtc but not the toolkit's headers
 * (NVRTC 12/13 does not build in cuda_fp16.h / cuda_bf16.h), so this file stands in for
 * <cuda_bf16.h>, <cuda_fp16.h>, <math.h> and <stdint.h>: the fixed-width integers, INFINITY and
 * NAN, and the two 16-bit float types as 2-byte storage with the conversions the kernels use,
 * each the PTX instruction the toolkit's header emits on sm_80 and later (so the kernels compile
 * to the same code as in the library build). Never included by nvcc builds.
 */
#ifndef KVA_RTC_SHIM_CUH
#define KVA_RTC_SHIM_CUH

#ifndef KVA__RTC_STDINT
#define KVA__RTC_STDINT
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#endif

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

struct __align__(2) __half { unsigned short x; };
struct __align__(4) __half2 { __half x, y; };
struct __align__(2) __nv_bfloat16 { unsigned short x; };
struct __align__(4) __nv_bfloat162 { __nv_bfloat16 x, y; };

__device__ __forceinline__ __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    __nv_bfloat162 v;
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(*reinterpret_cast<unsigned *>(&v)) : "f"(lo), "f"(hi));
    return v;
}
__device__ __forceinline__ __half2 __floats2half2_rn(float lo, float hi) {
    __half2 v;
    asm("cvt.rn.f16x2.f32 %0, %2, %1;\n" : "=r"(*reinterpret_cast<unsigned *>(&v)) : "f"(lo), "f"(hi));
    return v;
}
__device__ __forceinline__ float __half2float(__half h) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h.x));
    return f;
}
__device__ __forceinline__ float __bfloat162float(__nv_bfloat16 h) {
    return __uint_as_float((unsigned)h.x << 16);
}
__device__ __forceinline__ __half __float2half_rn(float f) {
    __half h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h.x) : "f"(f));
    return h;
}
__device__ __forceinline__ __nv_bfloat16 __float2bfloat16_rn(float f) {
    __nv_bfloat16 h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h.x) : "f"(f));
    return h;
}

#endif /* KVA_RTC_SHIM_CUH */
