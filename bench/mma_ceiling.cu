/*
 * mma_ceiling.cu -- the device's tensor-core ceiling for bench/bench_torch.py's prefill table:
 * the rate of the widest wgmma (m64n256k16, f32 accumulators, A from registers, B from shared
 * memory in the layout of the prefill kernel's V tiles) issued back to back by three warpgroups
 * per SM, one block per SM, on random operands (a tensor core's power, hence the clock the board
 * holds, depends on the bits it multiplies). No attention kernel can exceed it: its products are
 * of the same instruction family with nothing else in the way. cuBLAS's 8192^3 GEMM, the earlier
 * ceiling, stays beside it as a peer (d = 256 attention measured 101-104% of it).
 * Built as libkvattn_mma_ceiling.so (CMake target kvattn_mma_ceiling) for sm_90a; elsewhere the
 * entry point answers "unsupported" (-1) and the bench prints the GEMM alone.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "wgmma.cuh"

#define KVA_MMA_WARPGROUPS 3
#define KVA_MMA_CHAIN 32   /* wgmma per commit group: the drain between groups is ~1% of them */
#define KVA_MMA_B_BYTES (16 * 256 * 2)


template <typename T> struct kva_mma_exponent { static constexpr uint32_t bits = 0x3E00u; };
template <> struct kva_mma_exponent<__half> { static constexpr uint32_t bits = 0x3400u; };

template <typename T>
__global__ void __launch_bounds__(128 * KVA_MMA_WARPGROUPS, 1) kva_bench_mma_kernel(int groups, uint32_t seed, float *sink) {
    __shared__ __align__(1024) unsigned char b_tile[KVA_MMA_B_BYTES];
    uint32_t x = seed ^ (threadIdx.x * 0x9E3779B9u) ^ (blockIdx.x * 0x85EBCA6Bu);
    auto next = [&]() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        return x;
    };
    /* random 16-bit values below 1 in magnitude: random sign and low mantissa bits over a fixed
     * exponent (bf16 0.125.., f16 0.25..) */
    auto rand_pair = [&]() -> uint32_t {
        const uint32_t r = next(), e = kva_mma_exponent<T>::bits;
        return ((r & 0x807Fu) | e) | (((r >> 16) & 0x807Fu) | e) << 16;
    };
    uint32_t *b32 = (uint32_t *)b_tile;
    for (int i = threadIdx.x; i < KVA_MMA_B_BYTES / 4; i += blockDim.x) b32[i] = rand_pair();
    uint32_t a[4];
    for (int i = 0; i < 4; ++i) a[i] = rand_pair();
#if KVA__HAVE_WGMMA
    kva__fence_proxy_async();
    __syncthreads();
    float acc[128];
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    /* B: 16 keys x 256 columns, four 64-column blocks of 16 x 128 bytes (LBO), 8-key groups 1024
     * bytes apart (SBO): the prefill kernel's V tile for BN = 16 */
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(b_tile);
    const uint64_t desc = kva__wgmma_desc(base, 16 * 128, 1024);
    for (int g = 0; g < groups; ++g) {
        kva__wgmma_fence();
#pragma unroll
        for (int k = 0; k < KVA_MMA_CHAIN; ++k) kva__wgmma_rs<T, 256>(acc, a, desc);
        kva__wgmma_commit();
        kva__wgmma_wait<0>();
    }
#else
    /* (a build without sm_90a's wgmma: says so in sink[0] instead of trapping) */
    float acc[128] = {0.f};
    if (blockIdx.x == 0 && threadIdx.x == 0) sink[0] = -1.f;
    (void)groups;
#endif
    float s = 0.f;
    for (int i = 0; i < 128; ++i) s += acc[i];
    if (s == 1234.5f) sink[blockIdx.x] = s; /* never in practice; keeps the sum (and the loop) live */
}

/* Runs the loop on `stream`: one block of three warpgroups per SM, `groups` commit groups of
 * KVA_MMA_CHAIN wgmma each per warpgroup. dtype 0: bf16, 1: f16. *flops receives the call's
 * FLOP count (2 x 64 x 256 x 16 per wgmma). sink: zeroed device memory of at least 4 x SMs
 * bytes; sink[0] reads -1.0 after a call where the running code has no wgmma (a build for an
 * architecture other than sm_90a). Returns 0, -1 on a device other than compute capability 9.x,
 * or the cudaError_t of the launch. */
extern "C" int kva_bench_mma(int dtype, int groups, void *sink, void *stream, double *flops) {
    int dev = 0, sms = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (major != 9) return -1;
    dim3 grid((unsigned)sms), block(128 * KVA_MMA_WARPGROUPS);
    if (dtype)
        kva_bench_mma_kernel<__half><<<grid, block, 0, (cudaStream_t)stream>>>(groups, 0x2545F491u, (float *)sink);
    else
        kva_bench_mma_kernel<__nv_bfloat16><<<grid, block, 0, (cudaStream_t)stream>>>(groups, 0x2545F491u, (float *)sink);
    *flops = (double)sms * KVA_MMA_WARPGROUPS * groups * KVA_MMA_CHAIN * 2.0 * 64 * 256 * 16;
    return (int)cudaGetLastError();
}
