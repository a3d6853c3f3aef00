/*
 * ceiling_probe.c -- read-bandwidth and FMA-rate loops of one CPU kernel variant (see
 * ceiling_probe.h); compiled once per variant like src/cpu/kernels/.
 *
 * Read: 8 independent vector accumulators, so the adds never limit the loads (add latency
 * 3-4 cycles x 2 ports needs >= 8 in flight) and the loop is as wide as the kernels' loads.
 * FMA: `chains` independent register-resident FMA chains at the native width; FMA latency
 * (4 cycles) x 2 FMA ports needs >= 8 in flight; 12 leave margin. 16 only where 32 vector
 * registers hold them (16 chains of AVX2 would spill, which is what the old probe measured).
 */
#include "ceiling_probe.h"
#include "../../src/cpu/kernels/simd.h"

#define CAT2(a, b) kva_probe_##a##_##b
#define CAT(a, b) CAT2(a, b)
#define FN(name) CAT(KVA_ISA, name)
#define STR2(x) #x
#define STR(x) STR2(x)

static float FN(read)(const float *p, size_t n) {
    kva__vf acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = kva__splat(0.0f);
    for (size_t i = 0; i + 8 * KVA__VL <= n; i += 8 * KVA__VL) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) acc[k] += kva__loadu(p + i + (size_t)k * KVA__VL);
    }
    kva__vf s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return kva__hsum(s);
}

#define FMA_LOOP(CH)                                                                             \
    static float fma_##CH(long iters, float seed) {                                              \
        const kva__vf m = kva__splat(0.9999999f), c = kva__splat(1e-7f);                         \
        kva__vf a[CH];                                                                           \
        _Pragma("GCC unroll 16") for (int k = 0; k < CH; ++k)                                    \
            a[k] = kva__splat(seed + 0.01f * (float)k);                                          \
        for (long i = 0; i < iters; ++i) {                                                       \
            _Pragma("GCC unroll 16") for (int k = 0; k < CH; ++k) a[k] = kva__fma(a[k], m, c);   \
        }                                                                                        \
        kva__vf s = kva__splat(0.0f);                                                            \
        for (int k = 0; k < CH; ++k) s += a[k];                                                  \
        return kva__hsum(s);                                                                     \
    }
FMA_LOOP(8)
FMA_LOOP(12)
#if KVA__NUM_VREGS >= 32
FMA_LOOP(16)
#endif

static float FN(fma)(long iters, float seed, int chains) {
#if KVA__NUM_VREGS >= 32
    if (chains >= 16) return fma_16(iters, seed);
#endif
    return chains >= 12 ? fma_12(iters, seed) : fma_8(iters, seed);
}

extern const kva_ceiling_probe FN(ceiling);
const kva_ceiling_probe FN(ceiling) = {STR(KVA_ISA), KVA__VL, KVA__NUM_VREGS >= 32 ? 16 : 12,
                                       FN(read), FN(fma)};
