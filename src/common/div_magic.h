/*
 * div_magic.h -- division of a key position by the page size without a divide instruction: the
 * decode kernel splits every tile's key position into (page, slot) by the run-time page size,
 * and a 32-bit integer division there is ~20 instructions (I2F, MUFU.RCP, F2I and fix-ups) per
 * tile of ~350 (bench/NOTES.md, "Paired KV heads", call 7). For 0 <= n < 2^31 and 1 <= d < 2^31,
 * with l = ceil(log2 d) and m = ceil(2^(31 + l) / d):
 *     n / d == (n * m) >> (31 + l)          (64-bit product; m < 2^32)
 * (Granlund and Montgomery's round-up method: m * d - 2^(31 + l) < d <= 2^l, so the error
 * n * (m * d - 2^(31 + l)) / (d * 2^(31 + l)) stays below 1 / d for n < 2^31.)
 * Host and device (C and CUDA C); tests/test_div_magic.c checks it against the division.
 */
#ifndef KVA_DIV_MAGIC_H
#define KVA_DIV_MAGIC_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KVA__DIV_MAGIC_FN __host__ __device__ static inline
#else
#define KVA__DIV_MAGIC_FN static inline
#endif

typedef struct kva__div_magic {
    uint32_t mul;  /* m */
    int32_t shift; /* 31 + l */
} kva__div_magic;

/* The multiplier and shift for divisor d (1 <= d < 2^31). */
KVA__DIV_MAGIC_FN kva__div_magic kva__div_magic_for(int32_t d) {
    int l = 0;
    while (((uint64_t)1 << l) < (uint64_t)d) ++l;
    const uint64_t p = (uint64_t)1 << (31 + l);
    kva__div_magic r;
    r.mul = (uint32_t)((p + (uint64_t)d - 1) / (uint64_t)d);
    r.shift = 31 + l;
    return r;
}

/* n / d for 0 <= n < 2^31, with dm = kva__div_magic_for(d). */
KVA__DIV_MAGIC_FN int32_t kva__div_by(int32_t n, kva__div_magic dm) {
    return (int32_t)(((uint64_t)(uint32_t)n * dm.mul) >> dm.shift);
}

#endif /* KVA_DIV_MAGIC_H */
