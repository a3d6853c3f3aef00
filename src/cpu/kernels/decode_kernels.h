/*
 * decode_kernels.h -- the two inner loops of CPU decode over one block of keys, for the G query
 * heads that share one KV head (GQA):
 *
 *   kva__block_scores:     s[g][t] = dot(q[g], k[t])      (G heads x T keys)
 *   kva__block_accumulate: o[g] += sum_t p[g][t] * v[t]
 *
 * Each K and V row is read from memory and converted to f32 once for all G heads: the score
 * loop works on tiles of GB heads x TB keys (GB * TB = KVA__VL independent FMA chains, reduced
 * to VL dot products by one transposing reduction: 16 zmm accumulators on AVX-512, 8 ymm on
 * AVX2, which leaves AVX2 room for the loads in its 16 registers), the accumulation loop keeps
 * GB heads x 2 VL output lanes in registers (GB <= KVA__ACC_HEADS: 16 accumulators with 32
 * registers, 8 with 16) while it walks the block's keys. Keys are given as row pointers, so page
 * size, pool strides (NHD / HND, separate / interleaved) and page order never reach these loops.
 *
 * q and o are f32 [G][head_dim] in the packed order of simd.h (kva__load_pair), rows 64-byte
 * aligned. head_dim is a multiple of 16, so a row is whole pairs of vectors except with
 * AVX-512, where head_dim % 32 == 16 leaves one natural-order vector at the end.
 * Everything is always_inline with dtype a constant at the call site, so each dtype gets its
 * own straight-line code. Both loops take an optional prefetch cursor that they advance once per
 * tile / pass, so the caller's software prefetches are interleaved with the FMAs.
 */
#ifndef KVA_DECODE_KERNELS_H
#define KVA_DECODE_KERNELS_H

#include "simd.h"

/* Keys per window: score rows are padded to a multiple of this (the widest tile: VL keys, and
 * 16 is a multiple of every VL); the padding lanes read real rows (the caller's choice) and
 * their scores are discarded. */
#define KVA_DECODE_KEY_PAD 16
_Static_assert(KVA_DECODE_KEY_PAD % KVA__VL == 0, "a window holds whole score tiles");

/* Query heads the accumulation loop keeps in registers at once (2 vectors each). */
#define KVA__ACC_HEADS (KVA__NUM_VREGS / 4)

KVA__INLINE size_t kva__elem_size(int dtype) { return dtype == KVA_F32 ? 4 : 2; }

/* A software-prefetch cursor over a list of contiguous byte ranges (spans: the caller merges
 * the rows of adjacent keys and heads, so an NHD page read across all its heads is one span of
 * page_size * Hk rows): the kernels below advance it by `step` lines at every tile, so the
 * prefetches of the next window are spread over the compute of this one. A prefetch that
 * misses every cache holds a line-fill buffer for a whole memory latency and the core stalls
 * when they are all taken; issued a few at a time between FMAs, they keep the buffers busy
 * while the core computes instead of stalling it in bursts. A step is a pointer increment and
 * a compare per line (the per-row cursor it replaces spent ~12 instructions per line, a
 * quarter of decode's time with the data already in cache). */
typedef struct kva__pf_span {
    const unsigned char *begin, *end;
} kva__pf_span;

typedef struct kva__prefetch_cursor {
    const unsigned char *p, *end;         /* the current span: next line, end */
    const kva__pf_span *next, *last;      /* the spans after it */
    int32_t step;                         /* lines per kernel step */
} kva__prefetch_cursor;

KVA__INLINE void kva__prefetch_step(kva__prefetch_cursor *c) {
    if (!c) return;
    int32_t left = c->step;
    while (left > 0) {
        if (c->p >= c->end) {
            if (c->next == c->last) return;
            c->p = c->next->begin;
            c->end = c->next->end;
            ++c->next;
        }
        /* the lines left in this span, up to the step: no bound check per line */
        int32_t n = (int32_t)((c->end - c->p + 63) / 64);
        if (n > left) n = left;
        for (int32_t i = 0; i < n; ++i) __builtin_prefetch(c->p + 64 * i, 0, 2);
        c->p += 64 * n;
        left -= n;
    }
}

/* s[g * ld + t] for GB heads x TB keys; GB * TB == KVA__VL. */
KVA__INLINE void kva__score_tile(kva_dtype dtype, int GB, int TB, int32_t D, const float *q,
                                 const unsigned char *const *rows, ptrdiff_t head_off, float *s,
                                 int32_t ld, kva__prefetch_cursor *pf) {
    enum { W = 2 * KVA__VL }; /* elements per pair of vectors */
    const size_t es = kva__elem_size(dtype);
    kva__prefetch_step(pf);
    kva__vf acc[KVA__VL];
#pragma GCC unroll 16
    for (int i = 0; i < KVA__VL; ++i) acc[i] = kva__splat(0.0f);
    int32_t j = 0;
    for (; j + W <= D; j += W) {
#pragma GCC unroll 16
        for (int t = 0; t < TB; ++t) {
            kva__vf ka, kb;
            kva__load_pair(dtype, rows[t] + head_off + (ptrdiff_t)j * (ptrdiff_t)es, &ka, &kb);
#pragma GCC unroll 16
            for (int g = 0; g < GB; ++g) {
                const float *qg = q + (size_t)g * D + j;
                acc[g * TB + t] = kva__fma(kva__loadu(qg), ka, acc[g * TB + t]);
                acc[g * TB + t] = kva__fma(kva__loadu(qg + KVA__VL), kb, acc[g * TB + t]);
            }
        }
    }
    if (j < D) { /* AVX-512 and head_dim % 32 == 16: one natural-order vector */
#pragma GCC unroll 16
        for (int t = 0; t < TB; ++t) {
            kva__vf k = kva__loadv(rows[t] + head_off + (ptrdiff_t)j * (ptrdiff_t)es, dtype);
#pragma GCC unroll 16
            for (int g = 0; g < GB; ++g)
                acc[g * TB + t] = kva__fma(kva__loadu(q + (size_t)g * D + j), k, acc[g * TB + t]);
        }
    }
    kva__vf r = kva__reduce_lanes(acc);
#pragma GCC unroll 16
    for (int g = 0; g < GB; ++g)
#pragma GCC unroll 16
        for (int t = 0; t < TB; ++t) s[(size_t)g * ld + t] = r[g * TB + t];
}

/* s[g * ld + t] = dot(q[g], k[t]) for g < G, t < round_up(T, 16), where key t's row is
 * rows[t] + head_off; rows holds that many valid pointers (scores past T are to be discarded).
 * Tiles: 4 heads x VL/4 keys while 4 heads are left, then 2 x VL/2, then 1 x VL. */
KVA__INLINE void kva__block_scores(kva_dtype dtype, int32_t G, int32_t D, const float *q,
                                   const unsigned char *const *rows, ptrdiff_t head_off,
                                   int32_t T, float *s, int32_t ld, kva__prefetch_cursor *pf) {
    const int32_t Tpad = (T + KVA_DECODE_KEY_PAD - 1) / KVA_DECODE_KEY_PAD * KVA_DECODE_KEY_PAD;
    for (int32_t g0 = 0; g0 < G;) {
        const float *qg = q + (size_t)g0 * D;
        float *sg = s + (size_t)g0 * ld;
        int32_t left = G - g0;
        if (left >= 4) {
            for (int32_t t = 0; t < Tpad; t += KVA__VL / 4)
                kva__score_tile(dtype, 4, KVA__VL / 4, D, qg, rows + t, head_off, sg + t, ld, pf);
            g0 += 4;
        } else if (left >= 2) {
            for (int32_t t = 0; t < Tpad; t += KVA__VL / 2)
                kva__score_tile(dtype, 2, KVA__VL / 2, D, qg, rows + t, head_off, sg + t, ld, pf);
            g0 += 2;
        } else {
            for (int32_t t = 0; t < Tpad; t += KVA__VL)
                kva__score_tile(dtype, 1, KVA__VL, D, qg, rows + t, head_off, sg + t, ld, pf);
            g0 += 1;
        }
    }
}

/* Score tiles (kva__prefetch_step calls) kva__block_scores runs per KVA_DECODE_KEY_PAD keys. */
static inline int32_t kva__score_steps(int32_t G) {
    int32_t tiles = G / 4 * (KVA_DECODE_KEY_PAD / (KVA__VL / 4)) +
                    (G % 4 >= 2) * (KVA_DECODE_KEY_PAD / (KVA__VL / 2)) +
                    (G % 2) * (KVA_DECODE_KEY_PAD / KVA__VL);
    return tiles;
}

/* o[g] += sum_{t < T} p[g * ld + t] * v[t] for GB heads. */
KVA__INLINE void kva__accumulate_group(kva_dtype dtype, int GB, int32_t D, const float *p,
                                       int32_t ld, const unsigned char *const *rows,
                                       ptrdiff_t head_off, int32_t T, float *o,
                                       kva__prefetch_cursor *pf) {
    enum { W = 2 * KVA__VL };
    const size_t es = kva__elem_size(dtype);
    int32_t j = 0;
    for (; j + W <= D; j += W) {
        kva__prefetch_step(pf);
        kva__vf a[KVA__ACC_HEADS], b[KVA__ACC_HEADS];
#pragma GCC unroll 8
        for (int g = 0; g < GB; ++g) {
            a[g] = kva__loadu(o + (size_t)g * D + j);
            b[g] = kva__loadu(o + (size_t)g * D + j + KVA__VL);
        }
        for (int32_t t = 0; t < T; ++t) {
            kva__vf va, vb;
            kva__load_pair(dtype, rows[t] + head_off + (ptrdiff_t)j * (ptrdiff_t)es, &va, &vb);
#pragma GCC unroll 8
            for (int g = 0; g < GB; ++g) {
                kva__vf w = kva__splat(p[(size_t)g * ld + t]);
                a[g] = kva__fma(w, va, a[g]);
                b[g] = kva__fma(w, vb, b[g]);
            }
        }
#pragma GCC unroll 8
        for (int g = 0; g < GB; ++g) {
            kva__storeu(o + (size_t)g * D + j, a[g]);
            kva__storeu(o + (size_t)g * D + j + KVA__VL, b[g]);
        }
    }
    if (j < D) {
        kva__prefetch_step(pf);
        kva__vf a[KVA__ACC_HEADS];
#pragma GCC unroll 8
        for (int g = 0; g < GB; ++g) a[g] = kva__loadu(o + (size_t)g * D + j);
        for (int32_t t = 0; t < T; ++t) {
            kva__vf v = kva__loadv(rows[t] + head_off + (ptrdiff_t)j * (ptrdiff_t)es, dtype);
#pragma GCC unroll 8
            for (int g = 0; g < GB; ++g)
                a[g] = kva__fma(kva__splat(p[(size_t)g * ld + t]), v, a[g]);
        }
#pragma GCC unroll 8
        for (int g = 0; g < GB; ++g) kva__storeu(o + (size_t)g * D + j, a[g]);
    }
}

/* o[g] += sum_{t < T} p[g][t] * v[t] for g < G, key t's row at rows[t] + head_off; heads in
 * groups of KVA__ACC_HEADS, then 4, 2, 1. */
KVA__INLINE void kva__block_accumulate(kva_dtype dtype, int32_t G, int32_t D, const float *p,
                                       int32_t ld, const unsigned char *const *rows,
                                       ptrdiff_t head_off, int32_t T, float *o,
                                       kva__prefetch_cursor *pf) {
    for (int32_t g0 = 0; g0 < G;) {
        const float *pg = p + (size_t)g0 * ld;
        float *og = o + (size_t)g0 * D;
        int32_t left = G - g0;
        if (left >= KVA__ACC_HEADS) {
            kva__accumulate_group(dtype, KVA__ACC_HEADS, D, pg, ld, rows, head_off, T, og, pf);
            g0 += KVA__ACC_HEADS;
        } else if (left >= 4) {
            kva__accumulate_group(dtype, 4, D, pg, ld, rows, head_off, T, og, pf);
            g0 += 4;
        } else if (left >= 2) {
            kva__accumulate_group(dtype, 2, D, pg, ld, rows, head_off, T, og, pf);
            g0 += 2;
        } else {
            kva__accumulate_group(dtype, 1, D, pg, ld, rows, head_off, T, og, pf);
            g0 += 1;
        }
    }
}

/* Passes (kva__prefetch_step calls) kva__block_accumulate makes for G heads. */
static inline int32_t kva__value_steps(int32_t G, int32_t D) {
    int32_t rest = G % KVA__ACC_HEADS;
    int32_t groups = G / KVA__ACC_HEADS + rest / 4 + (rest % 4 >= 2) + (rest % 2);
    return groups * ((D + 2 * KVA__VL - 1) / (2 * KVA__VL));
}

#endif /* KVA_DECODE_KERNELS_H */
