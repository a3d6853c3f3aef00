/*
 * fuzz_input.h -- reading a libFuzzer input as a stream of small choices. Past the end every
 * read returns 0, so any prefix of an input is itself a valid (shorter) scenario.
 */
#ifndef KVA_FUZZ_INPUT_H
#define KVA_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct fz_in {
    const uint8_t *p;
    size_t n, at;
} fz_in;

static inline uint8_t fz_u8(fz_in *in) { return in->at < in->n ? in->p[in->at++] : 0; }
static inline uint32_t fz_u32(fz_in *in) {
    uint32_t x = 0;
    for (int i = 0; i < 4; ++i) x = x << 8 | fz_u8(in);
    return x;
}
/* An integer in lo..hi (inclusive). */
static inline int32_t fz_range(fz_in *in, int32_t lo, int32_t hi) {
    uint32_t span = (uint32_t)(hi - lo) + 1u;
    uint32_t x = span <= 256 ? fz_u8(in) : fz_u32(in);
    return lo + (int32_t)(x % span);
}
static inline int fz_bool(fz_in *in) { return fz_u8(in) & 1; }
static inline int fz_done(const fz_in *in) { return in->at >= in->n; }

/* A deterministic generator for bulk data, seeded from the input. */
static inline uint64_t fz_rand(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}
static inline float fz_randf(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(fz_rand(s) >> 40) / (double)(1ull << 23) - 1.0);
}

/* A finding: print it and crash so libFuzzer saves the input. */
#define FZ_ASSERT(cond, ...)                                                                   \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz check failed: %s (%s:%d): ", #cond, __FILE__, __LINE__);     \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

#endif
