/* decode_bf16.cu -- bf16 instantiations of the decode kernel (decode_kernel.cuh), one file per
 * element type so the builds run in parallel. */
#include "decode_kernel.cuh"

KVA__DECODE_INSTANTIATE(__nv_bfloat16, 64, kva__decode_bf16_d64)
KVA__DECODE_INSTANTIATE(__nv_bfloat16, 128, kva__decode_bf16_d128)
KVA__DECODE_INSTANTIATE(__nv_bfloat16, 256, kva__decode_bf16_d256)
/* (whether these kernels wait for a programmatic primary: cuda_context.cu launches them as
 * dependents only if every decode file says so) */
int kva__decode_bf16_pdl(void) { return KVA__DECODE_PDL; }

#ifdef KVA__DECODE_TRACE
/* The trace of the last traced launches (decode_trace.cuh), then cleared: ns and clk each hold
 * KVA__DT_BLOCKS x KVA__DT_POINTS values. Returns a cudaError_t. */
#include <cuda_runtime.h>
extern "C" int kva__decode_trace_read(unsigned long long *ns, long long *clk) {
    static const unsigned long long zero[KVA__DT_BLOCKS][KVA__DT_POINTS] = {};
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpyFromSymbol(ns, kva__dt_ns, sizeof zero);
    if (e == cudaSuccess) e = cudaMemcpyFromSymbol(clk, kva__dt_clk, sizeof zero);
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(kva__dt_ns, zero, sizeof zero);
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(kva__dt_clk, zero, sizeof zero);
    return (int)e;
}
#endif
