/*
 * read_ceiling.cu -- the device's read-bandwidth ceiling for bench/bench_torch.py: a streaming
 * reduction over a large buffer with 16-byte loads, 4 independent loads in flight per thread,
 * a full grid (every SM at full occupancy), and one word written per block so nothing is
 * optimised away. Built as libkvattn_read_ceiling.so (CMake target kvattn_read_ceiling) and
 * called through ctypes on torch's stream; the caller times it with CUDA events.
 */
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void __launch_bounds__(256) kva_bench_read_kernel(const uint4 *__restrict__ buf, size_t n,
                                                             unsigned *__restrict__ sink) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(buf + i), b = __ldcs(buf + i + stride);
        uint4 c = __ldcs(buf + i + 2 * stride), d = __ldcs(buf + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = __ldcs(buf + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(sink + blockIdx.x, acc);
}

/* Reads `bytes` (a multiple of 16) at buf once, on `stream`; sink: device memory of at least
 * 4 * 65536 bytes. Returns 0, or the cudaError_t of the launch. */
extern "C" int kva_bench_read(const void *buf, size_t bytes, void *sink, void *stream) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kva_bench_read_kernel, 256, 0);
    unsigned grid = (unsigned)(sms * (per_sm > 0 ? per_sm : 1));
    if (grid > 65536) grid = 65536;
    kva_bench_read_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>((const uint4 *)buf, bytes / 16,
                                                                  (unsigned *)sink);
    return (int)cudaGetLastError();
}

__global__ void kva_bench_empty_kernel() {}

/* One empty 1-block kernel on `stream`: the launch floor as CUDA events see it. */
extern "C" int kva_bench_empty(void *stream) {
    kva_bench_empty_kernel<<<1, 32, 0, (cudaStream_t)stream>>>();
    return (int)cudaGetLastError();
}
