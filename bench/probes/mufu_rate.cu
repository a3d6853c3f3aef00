/* mufu_rate.cu -- results per clock and SM of the special-function unit's instructions that
 * the soft-capped softmax issues (tanh.approx.f32, ex2.approx.ftz.f32), alone, mixed one to one,
 * and beside FFMA, measured with clock64 on every SM at once. The capped Hopper prefill tile
 * runs at ~3820 cycles against plain's ~2623 (bench/NOTES.md v6.41), and whether one tanh costs
 * the unit what one ex2 does decides whether that kernel is bound by the unit or by latency.
 *
 * Build and run on the device (not part of the library or its tests):
 *   nvcc -O3 -arch=sm_90a -o /tmp/mufu_rate bench/probes/mufu_rate.cu && /tmp/mufu_rate
 * Prints one line per case: results per clock per SM (the median over the SMs). */
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>

#define CHAINS 8      /* independent chains per thread: enough to cover the unit's latency */
#define ITERS 2048    /* loop trips per thread */
#define THREADS 1024  /* per block, one block per SM */

enum { K_EX2, K_TANH, K_MIX, K_EX2_FFMA4, K_FFMA, K_TANH_FFMA4 };
static const char *names[] = {"ex2.approx.ftz", "tanh.approx", "tanh + ex2 (1:1)", "ex2 + 4 ffma",
                              "ffma", "tanh + 4 ffma"};
/* results counted per case: the special-function ones (FFMA for K_FFMA) per loop trip and chain */
static const double per_trip[] = {1, 1, 2, 1, 1, 1};

/* four dependent FFMAs on the asm statement's operand %0 */
#define FFMA_1 "\n\tfma.rn.f32 %0, %0, 0f3F7FFFFF, 0f33800000;"
#define FOUR_FFMA FFMA_1 FFMA_1 FFMA_1 FFMA_1

template <int K>
__global__ void __launch_bounds__(THREADS, 1) rate_kernel(float seed, long long *cycles, float *sink) {
    float x[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) x[c] = seed * (float)(threadIdx.x + c + 1) * 1e-4f;
    __syncthreads();
    const long long t0 = clock64();
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            float y = x[c];
            if (K == K_EX2) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(y));
            if (K == K_TANH) asm volatile("tanh.approx.f32 %0, %0;" : "+f"(y));
            if (K == K_EX2_FFMA4) asm volatile("ex2.approx.ftz.f32 %0, %0;" FOUR_FFMA : "+f"(y));
            if (K == K_MIX) asm volatile("tanh.approx.f32 %0, %0;\n\tex2.approx.ftz.f32 %0, %0;" : "+f"(y));
            if (K == K_FFMA) asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFFF, 0f33800000;" : "+f"(y));
            if (K == K_TANH_FFMA4) asm volatile("tanh.approx.f32 %0, %0;" FOUR_FFMA : "+f"(y));
            x[c] = y;
        }
    }
    __syncthreads();
    const long long t1 = clock64();
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += x[c];
    if (s == 12345.678f) sink[threadIdx.x] = s; /* (keeps the chains alive) */
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

static int cmp_ll(const void *a, const void *b) {
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

template <int K>
static double run(int sms, long long *d_cycles, float *d_sink) {
    rate_kernel<K><<<sms, THREADS>>>(0.5f, d_cycles, d_sink); /* warm-up */
    rate_kernel<K><<<sms, THREADS>>>(0.5f, d_cycles, d_sink);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        exit(1);
    }
    long long c[1024];
    if (sms > 1024 || cudaMemcpy(c, d_cycles, sizeof(long long) * sms, cudaMemcpyDeviceToHost) != cudaSuccess) exit(1);
    qsort(c, (size_t)sms, sizeof c[0], cmp_ll);
    const double ops = (double)THREADS * ITERS * CHAINS * per_trip[K];
    return ops / (double)c[sms / 2];
}

int main() {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    const int sms = p.multiProcessorCount;
    long long *d_cycles;
    float *d_sink;
    cudaMalloc(&d_cycles, sizeof(long long) * sms);
    cudaMalloc(&d_sink, sizeof(float) * THREADS);
    printf("%s, %d SMs; %d threads per SM, %d independent chains each; results per clock per SM:\n", p.name, sms,
           THREADS, CHAINS);
    const double r[] = {run<K_EX2>(sms, d_cycles, d_sink), run<K_TANH>(sms, d_cycles, d_sink),
                        run<K_MIX>(sms, d_cycles, d_sink), run<K_EX2_FFMA4>(sms, d_cycles, d_sink),
                        run<K_FFMA>(sms, d_cycles, d_sink), run<K_TANH_FFMA4>(sms, d_cycles, d_sink)};
    for (int k = 0; k < 6; ++k) printf("  %-18s %7.2f\n", names[k], r[k]);
    printf("  (tanh + ex2 counts both; x + 4 ffma counts x)\n");
    cudaFree(d_cycles);
    cudaFree(d_sink);
    return 0;
}
