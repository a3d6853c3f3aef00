/*
 * trace_util.h -- what the trace printers (bench/hopper_trace, bench/decode_trace) share: a
 * check that exits on a failed library call, a monotonic clock, bf16 random inputs, a qsort
 * comparison of long longs.
 */
#ifndef KVA_BENCH_TRACE_UTIL_H
#define KVA_BENCH_TRACE_UTIL_H

#include "kvattn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OK(x)                                                                                      \
    do {                                                                                           \
        if ((x) != KVA_OK) {                                                                       \
            fprintf(stderr, "%s failed: %s\n", #x, kva_last_error());                              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

/* bf16 of uniform values in [-1, 1) (truncated from f32), from the generator state *seed */
static inline void fill_bf16(uint16_t *x, size_t n, uint32_t *seed) {
    for (size_t i = 0; i < n; ++i) {
        *seed = *seed * 1664525u + 1013904223u;
        const float f = (float)(*seed >> 8) / 16777216.0f * 2.0f - 1.0f;
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        x[i] = (uint16_t)(u >> 16);
    }
}

static inline int cmp_ll(const void *a, const void *b) {
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

#endif /* KVA_BENCH_TRACE_UTIL_H */
