/* prefill_hopper_bf16.cu -- bf16 instantiations of the warp-specialised Hopper prefill kernel
 * (prefill_hopper.cuh), in their own file so the builds run in parallel. */
#include "prefill_hopper.cuh"

KVA__PREFILL_HOPPER_INSTANTIATE(__nv_bfloat16, kva__prefill_hopper_bf16)

#ifdef KVA__HP_TRACE
/* The trace of the last bf16 Hopper prefill launch (prefill_hopper_trace.cuh) into dst
 * [blocks][roles][items][points] (count values at most), then cleared. Returns the CUDA error. */
extern "C" int kva__hp_trace_read(long long *dst, size_t count) {
    static const long long zero[KVA__HP_TRACE_BLOCKS][KVA__HP_TRACE_ROLES][KVA__HP_TRACE_ITEMS][KVA__HP_TRACE_POINTS] = {};
    const size_t n = sizeof zero / sizeof(long long);
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpyFromSymbol(dst, kva__hp_trace_buf, (count < n ? count : n) * sizeof(long long));
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(kva__hp_trace_buf, zero, sizeof zero);
    return (int)e;
}
#endif
