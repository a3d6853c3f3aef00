/* sm_stream_rate.cu -- how fast one SM reads global memory, by copy method: 16-byte loads into
 * registers (as bench/read_ceiling.cu), 16-byte cp.async into a per-warp shared-memory ring (as the
 * decode kernel: 4 warps, 8 KB tiles), and bulk copies (cp.async.bulk, the TMA engine's 1-D form)
 * issued by one thread into a ring of mbarrier-tracked stages. The decode kernel's small batches
 * stream at ~32 GB/s per SM from L2 and DRAM alike (bench/NOTES.md, "The sub-group round's test",
 * call 3); whether another method moves more bytes per SM decides whether 1 x 8192 can get nearer
 * the launch floor. Each block reads its own 8 MB, 7 times (timing the last 5): one block's 8 MB
 * stay in L2 (63 MB), 16 and more blocks' do not.
 *
 * Build and run on the device (not part of the library or its tests):
 *   nvcc -O3 -arch=sm_90a -o /tmp/sm_stream_rate bench/probes/sm_stream_rate.cu && /tmp/sm_stream_rate
 * Prints one line per (method, blocks): median time of 5 runs, GB/s per block and in all (per SM
 * where the blocks fit one per SM: the cp.async and bulk kernels' shared memory keeps them apart
 * at 132 blocks; the ld.global ones may pair up). The cp.async "decode" rows copy the decode
 * kernel's ring shape (4 warps x 2 stages of 8 KB) from contiguous memory, not its 256-byte K and V
 * rows from two pools. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>

#define PER_BLOCK (8u << 20) /* bytes each block reads */
#define TILE 8192u           /* cp.async: bytes per warp and stage */

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte loads, 8 in flight per thread */
__global__ void read_ldg(const uint4 *__restrict__ buf, unsigned *sink) {
    const size_t n = PER_BLOCK / 16, T = blockDim.x;
    const uint4 *p = buf + (size_t)blockIdx.x * n;
    unsigned acc = 0;
    size_t i = threadIdx.x;
    for (; i + 7 * T < n; i += 8 * T) {
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = __ldcs(p + i + j * T);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(sink + blockIdx.x, acc);
}

/* per-warp ring of S stages of TILE bytes, 16-byte cp.async; warp w reads tiles w, w + W, ... */
template <int S>
__global__ void read_cp_async(const unsigned char *__restrict__ buf, unsigned *sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const unsigned char *p = buf + (size_t)blockIdx.x * PER_BLOCK;
    const uint32_t ring = smem_addr(sm) + (uint32_t)warp * S * TILE;
    const int tiles = (int)(PER_BLOCK / TILE), mine = (tiles - warp + W - 1) / W;
    auto issue = [&](int k) {
        const unsigned char *src = p + (size_t)(warp + k * W) * TILE;
        const uint32_t dst = ring + (uint32_t)(k % S) * TILE;
#pragma unroll
        for (int j = 0; j < (int)(TILE / 512); ++j)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + (lane + 32 * j) * 16),
                         "l"(src + (lane + 32 * j) * 16)
                         : "memory");
    };
    for (int k = 0; k < S - 1; ++k) {
        if (k < mine) issue(k);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    unsigned acc = 0;
    for (int k = 0; k < mine; ++k) {
        if (k + S - 1 < mine) issue(k + S - 1);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1) : "memory");
        unsigned v;
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(ring + (uint32_t)(k % S) * TILE + lane * 16));
        acc ^= v;
        __syncwarp();
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) atomicXor(sink + blockIdx.x, acc);
}

/* one thread issues bulk copies of CH bytes into a ring of S stages, each on its own mbarrier */
template <int S, int CH>
__global__ void read_bulk(const unsigned char *__restrict__ buf, unsigned *sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) uint64_t bars[S];
    const unsigned char *p = buf + (size_t)blockIdx.x * PER_BLOCK;
    const int n = (int)(PER_BLOCK / CH);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(&bars[s])));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    unsigned acc = 0;
    if (threadIdx.x == 0) {
        auto issue = [&](int k) {
            const uint32_t bar = smem_addr(&bars[k % S]), dst = smem_addr(sm) + (uint32_t)(k % S) * CH;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(CH) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                         "l"(p + (size_t)k * CH), "r"(CH), "r"(bar)
                         : "memory");
        };
        for (int k = 0; k < S && k < n; ++k) issue(k);
        for (int k = 0; k < n; ++k) {
            const uint32_t bar = smem_addr(&bars[k % S]), parity = (uint32_t)(k / S) & 1u;
            uint32_t done = 0;
            while (!done)
                asm volatile("{\n.reg .pred q;\nmbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2;\nselp.u32 %0, 1, 0, q;\n}\n"
                             : "=r"(done)
                             : "r"(bar), "r"(parity)
                             : "memory");
            acc ^= *(volatile unsigned *)(sm + (size_t)(k % S) * CH);
            if (k + S < n) issue(k + S);
        }
        atomicXor(sink + blockIdx.x, acc);
    }
}

static float time_it(void (*launch)(int, int, int, const unsigned char *, unsigned *, const void *), const void *fn,
                     int grid, int threads, int smem, const unsigned char *buf, unsigned *sink) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float t[5];
    for (int r = 0; r < 7; ++r) {
        CK(cudaEventRecord(a));
        launch(grid, threads, smem, buf, sink, fn);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 2) t[r - 2] = ms;
    }
    CK(cudaGetLastError());
    for (int i = 0; i < 5; ++i)
        for (int j = i + 1; j < 5; ++j)
            if (t[j] < t[i]) {
                float x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return t[2];
}

static void launch_ldg(int g, int th, int smem, const unsigned char *buf, unsigned *sink, const void *fn) {
    (void)fn;
    read_ldg<<<g, th, smem>>>((const uint4 *)buf, sink);
}
template <int S>
static void launch_cp(int g, int th, int smem, const unsigned char *buf, unsigned *sink, const void *fn) {
    (void)fn;
    read_cp_async<S><<<g, th, smem>>>(buf, sink);
}
template <int S, int CH>
static void launch_bulk(int g, int th, int smem, const unsigned char *buf, unsigned *sink, const void *fn) {
    (void)fn;
    read_bulk<S, CH><<<g, th, smem>>>(buf, sink);
}

int main(void) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned char *buf;
    unsigned *sink;
    const size_t bytes = (size_t)sms * PER_BLOCK;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(&sink, 4 * (size_t)sms));
    CK(cudaMemset(buf, 1, bytes));
    CK(cudaFuncSetAttribute(read_cp_async<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 2 * TILE));
    CK(cudaFuncSetAttribute(read_cp_async<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * TILE));
    CK(cudaFuncSetAttribute(read_cp_async<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 6 * TILE));
    CK(cudaFuncSetAttribute(read_bulk<4, 16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 16384));
    CK(cudaFuncSetAttribute(read_bulk<8, 16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 16384));
    CK(cudaFuncSetAttribute(read_bulk<6, 32768>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * 32768));
    struct {
        const char *name;
        void (*launch)(int, int, int, const unsigned char *, unsigned *, const void *);
        int threads, smem;
    } m[] = {{"ld.global 16 B, 128 threads", launch_ldg, 128, 0},
             {"ld.global 16 B, 1024 threads", launch_ldg, 1024, 0},
             {"cp.async 16 B, 4 warps x 2 stages x 8 KB (decode ring)", launch_cp<2>, 128, 4 * 2 * TILE},
             {"cp.async 16 B, 4 warps x 6 stages x 8 KB", launch_cp<6>, 128, 4 * 6 * TILE},
             {"cp.async 16 B, 8 warps x 3 stages x 8 KB", launch_cp<3>, 256, 8 * 3 * TILE},
             {"bulk 4 x 16 KB, one thread", launch_bulk<4, 16384>, 32, 4 * 16384},
             {"bulk 8 x 16 KB, one thread", launch_bulk<8, 16384>, 32, 8 * 16384},
             {"bulk 6 x 32 KB, one thread", launch_bulk<6, 32768>, 32, 6 * 32768}};
    const int grids[] = {1, 16, 66, sms};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; ++i)
        for (size_t g = 0; g < sizeof grids / sizeof grids[0]; ++g) {
            const int G = grids[g];
            const float ms = time_it(m[i].launch, NULL, G, m[i].threads, m[i].smem, buf, sink);
            printf("%-52s blocks %3d: %8.1f us, %6.1f GB/s per block, %7.1f GB/s in all\n", m[i].name, G,
                   ms * 1e3, PER_BLOCK / (ms * 1e-3) / 1e9, (double)G * PER_BLOCK / (ms * 1e-3) / 1e9);
            fflush(stdout);
        }
    return 0;
}
