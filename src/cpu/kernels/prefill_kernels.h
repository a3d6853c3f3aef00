/*
 * prefill_kernels.h -- the two register-blocked micro-kernels of the CPU prefill engine.
 *
 * Layout ("rows as lanes"): a row block is up to 4 vectors of packed query rows (query token x
 * GQA head; 64 rows with AVX-512); everything per row lives in vector lanes, so the online
 * softmax needs no horizontal reductions and causal / window masks are lane compares. With
 * RC = 1..4 row vectors and L = KVA__PF_LANES:
 *   Qt   [D][L]    the row block's queries, transposed and pre-scaled (packed once per task)
 *   K, V [keys][D] the key block converted to f32, row-major (converted once per block)
 *   S    [keys][L] scores, then probabilities, of one row block
 *   Ot   [D][L]    the row block's output accumulator, transposed
 *
 *   S = Qt^T K^T:  an outer product per d: RC loads of Qt[d] times QK_KEYS broadcast K[j][d].
 *   Ot = Ot * alpha + V^T P:  per key j: RC loads of P[j] times PV_DIMS broadcast V[j][d].
 * With 32 vector registers (AVX-512, NEON) both keep 4 x 4 = 16 accumulators for RC = 4 and issue
 * 8 loads per 16 FMAs, well inside two load ports (broadcasts fold into the FMA as memory
 * operands); with 16 registers the tiles shrink to 2 x 4 so nothing spills.
 */
#ifndef KVA_PREFILL_KERNELS_H
#define KVA_PREFILL_KERNELS_H

#include "simd.h"

#define KVA__PF_LANES (4 * KVA__VL) /* rows per row block */
#if KVA__NUM_VREGS == 32
#define KVA__PF_QK_KEYS 4 /* keys per QK micro-tile; key blocks are padded to a multiple */
#define KVA__PF_PV_DIMS 4 /* head dims per PV micro-tile (divides every multiple of 16) */
#else
#define KVA__PF_QK_KEYS 2
#define KVA__PF_PV_DIMS 2
#endif

/* s[j][lanes] = sum_d qt[d][lanes] * k[j][d] for the QK_KEYS keys at k (row stride D). */
KVA__INLINE void kva__qk_tile(const int RC, const float *restrict qt, const float *restrict k,
                              int D, float *restrict s) {
    enum { J = KVA__PF_QK_KEYS };
    kva__vf acc[J][4];
#pragma GCC unroll 4
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            acc[j][c] = kva__splat(0.0f);
    for (int d = 0; d < D; ++d) {
        kva__vf q[4];
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            q[c] = *(const kva__vf *)(qt + (size_t)d * KVA__PF_LANES + KVA__VL * c);
#pragma GCC unroll 4
        for (int j = 0; j < J; ++j) {
            kva__vf kj = kva__splat(k[(size_t)j * D + d]);
#pragma GCC unroll 4
            for (int c = 0; c < RC; ++c)
                acc[j][c] = kva__fma(q[c], kj, acc[j][c]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            *(kva__vf *)(s + (size_t)j * KVA__PF_LANES + KVA__VL * c) = acc[j][c];
}

/* ot[i][lanes] = ot[i][lanes] * alpha + sum_j p[j][lanes] * v[j][i] for the PV_DIMS dims at
 * ot / v (v row stride D), over keys 0 .. nk-1. */
KVA__INLINE void kva__pv_tile(const int RC, const float *restrict p, int nk,
                              const float *restrict v, int D, float *restrict ot,
                              const kva__vf *alpha) {
    enum { I = KVA__PF_PV_DIMS };
    kva__vf acc[I][4];
#pragma GCC unroll 4
    for (int i = 0; i < I; ++i)
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            acc[i][c] = *(const kva__vf *)(ot + (size_t)i * KVA__PF_LANES + KVA__VL * c) * alpha[c];
    for (int j = 0; j < nk; ++j) {
        kva__vf pj[4];
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            pj[c] = *(const kva__vf *)(p + (size_t)j * KVA__PF_LANES + KVA__VL * c);
#pragma GCC unroll 4
        for (int i = 0; i < I; ++i) {
            kva__vf vi = kva__splat(v[(size_t)j * D + i]);
#pragma GCC unroll 4
            for (int c = 0; c < RC; ++c)
                acc[i][c] = kva__fma(pj[c], vi, acc[i][c]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < I; ++i)
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            *(kva__vf *)(ot + (size_t)i * KVA__PF_LANES + KVA__VL * c) = acc[i][c];
}

#endif /* KVA_PREFILL_KERNELS_H */
