/*
 * hopper_sync.cuh -- inline-PTX wrappers for Hopper's asynchronous data movement and the
 * synchronisation around it (sm_90): shared-memory mbarriers with transaction counts, tensor
 * copies (TMA, cp.async.bulk.tensor) that complete on them, named barriers between warpgroups,
 * and warpgroup register reallocation (setmaxnreg, sm_90a only).
 *
 * mbarrier phases: a barrier starts in phase 0; a phase completes when its pending arrival count
 * reaches zero and every byte announced by expect_tx has landed. kva__mbar_wait(bar, parity)
 * returns once the phase of that parity has completed, so a stage's "empty" barrier is first
 * waited on with parity 1 (the phase before phase 0 counts as complete).
 */
#ifndef KVA_CUDA_HOPPER_SYNC_CUH
#define KVA_CUDA_HOPPER_SYNC_CUH

#include "cuda_common.cuh"

__device__ __forceinline__ void kva__mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialised barriers visible to the copy engine before anyone uses them. */
__device__ __forceinline__ void kva__mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* One arrival that also announces `bytes` to come from tensor copies. */
__device__ __forceinline__ void kva__mbar_arrive_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void kva__mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Whether the phase of that parity has completed: test_wait answers at once, try_wait may
 * first wait a while (a time the hardware chooses) for it. */
__device__ __forceinline__ bool kva__mbar_test(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
}
__device__ __forceinline__ bool kva__mbar_try(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
}
__device__ __forceinline__ void kva__mbar_wait(uint32_t bar, uint32_t parity) {
    while (!kva__mbar_try(bar, parity)) {
    }
}
/* The same for warps off the critical path that wait most of a work item (the Hopper prefill's
 * scheduler and store warps): a probe every ~256 ns instead of back-to-back probes, whose issue
 * slots and shared-memory traffic the computing warps of the same SM would lose. */
__device__ __forceinline__ void kva__mbar_wait_idle(uint32_t bar, uint32_t parity) {
    while (!kva__mbar_try(bar, parity)) __nanosleep(256);
}

/* Tensor copies global -> shared through a tensor map (a __grid_constant__ kernel parameter),
 * completing on `bar`. Coordinates are in elements, innermost first; out-of-bounds elements
 * (negative coordinates included) are filled with zeros and never read. */
__device__ __forceinline__ void kva__tma_load_3d(uint32_t dst, const void *map, uint32_t bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void kva__tma_load_4d(uint32_t dst, const void *map, uint32_t bar, int c0, int c1, int c2,
                                                 int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
/* A tensor copy shared -> global through a tensor map, in the issuing thread's bulk group
 * (out-of-bounds elements are not written); commit the group, then wait until the committed
 * groups have read their shared memory (read) or are done. The shared memory written by
 * ordinary stores must be fenced (kva__fence_proxy_async) by its writers first. */
__device__ __forceinline__ void kva__tma_store_3d(const void *map, uint32_t src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void kva__bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void kva__bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
/* (all but the newest N bulk groups have read their sources) */
template <int N>
__device__ __forceinline__ void kva__bulk_wait_read_but() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void kva__bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void kva__tma_prefetch_map(const void *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

/* Named barriers (ids 1..15; 0 is __syncthreads): `count` threads, a multiple of 32. */
__device__ __forceinline__ void kva__bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void kva__bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Warpgroup register reallocation: producers give registers back, consumers take them. */
template <int N> __device__ __forceinline__ void kva__setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void kva__setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
#endif

#endif /* KVA_CUDA_HOPPER_SYNC_CUH */
