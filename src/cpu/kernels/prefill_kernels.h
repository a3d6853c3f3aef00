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
 *   S = Qt^T K^T:  an outer product per d: loads of Qt[d] times QK_KEYS broadcast K[j][d].
 *   Ot = Ot * alpha + V^T P:  per key j: loads of P[j] times PV_DIMS broadcast V[j][d].
 * The tile shapes per register file are below; the drivers (prefill_engine.c) cover a row
 * block's RC vectors with tiles of QK_VECS / PV_VECS vectors.
 */
#ifndef KVA_PREFILL_KERNELS_H
#define KVA_PREFILL_KERNELS_H

#include "simd.h"

#define KVA__PF_LANES (4 * KVA__VL) /* rows per row block */
#if KVA__NUM_VREGS == 32
/* 4 keys (or head dims) x 4 row vectors: 16 accumulators, 4 row-vector registers, broadcasts
 * folded into the FMAs. 6 x 4 and 8 x 3 tiles measured 1-3% slower (Zen 5, AVX-512). */
#define KVA__PF_QK_KEYS 4 /* keys per QK micro-tile; key blocks are padded to a multiple */
#define KVA__PF_QK_VECS 4 /* row vectors per QK micro-tile */
#define KVA__PF_PV_DIMS 4 /* head dims per PV micro-tile (a 4- and 2-dim tail follows) */
#define KVA__PF_PV_VECS 4 /* row vectors per PV micro-tile */
#else
/* 16 registers: 6 keys (or head dims) x 2 row vectors = 12 accumulators, 2 row-vector
 * registers and one broadcast; a row block's 4 vectors take two such tiles. Against 2 x 4
 * tiles (8 accumulators, too few to cover the FMA latency at two FMAs a cycle) this was
 * +25-30% in AVX2 prefill (Zen 5); it also issues fewer loads per FMA than 3 x 4 tiles with
 * the row vectors read from memory, which matters on cores with two load ports. */
#define KVA__PF_QK_KEYS 6
#define KVA__PF_QK_VECS 2
#define KVA__PF_PV_DIMS 6
#define KVA__PF_PV_VECS 2
#endif

/* Every accumulator defined, so GCC's uninitialised-use analysis never trips over the unused
 * ones of a small tile (dead stores, removed). */
KVA__INLINE void kva__pf_zero_acc(kva__vf acc[8][4]) {
    for (int i = 0; i < 8; ++i)
        for (int c = 0; c < 4; ++c)
            acc[i][c] = kva__splat(0.0f);
}

/* s[j][lanes] = sum_d qt[d][lanes] * k[j][d] for the J keys at k (row stride D), RC row
 * vectors at qt / s. */
KVA__INLINE void kva__qk_tile(const int RC, const int J, const float *restrict qt,
                              const float *restrict k, int D, float *restrict s) {
    kva__vf acc[8][4];
    kva__pf_zero_acc(acc);
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            acc[j][c] = kva__splat(0.0f);
    for (int d = 0; d < D; ++d) {
        kva__vf q[4];
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            q[c] = *(const kva__vf *)(qt + (size_t)d * KVA__PF_LANES + KVA__VL * c);
#pragma GCC unroll 8
        for (int j = 0; j < J; ++j) {
            kva__vf kj = kva__splat(k[(size_t)j * D + d]);
#pragma GCC unroll 4
            for (int c = 0; c < RC; ++c)
                acc[j][c] = kva__fma(q[c], kj, acc[j][c]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j)
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            *(kva__vf *)(s + (size_t)j * KVA__PF_LANES + KVA__VL * c) = acc[j][c];
}

/* ot[i][lanes] = ot[i][lanes] * alpha + sum_j p[j][lanes] * v[j][i] for the I dims at
 * ot / v (v row stride D), over keys 0 .. nk-1, RC row vectors at p / ot / alpha. */
KVA__INLINE void kva__pv_tile(const int RC, const int I, const float *restrict p, int nk,
                              const float *restrict v, int D, float *restrict ot,
                              const kva__vf *alpha) {
    kva__vf acc[8][4];
    kva__pf_zero_acc(acc);
#pragma GCC unroll 8
    for (int i = 0; i < I; ++i)
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            acc[i][c] = *(const kva__vf *)(ot + (size_t)i * KVA__PF_LANES + KVA__VL * c) * alpha[c];
    for (int j = 0; j < nk; ++j) {
        kva__vf pj[4];
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            pj[c] = *(const kva__vf *)(p + (size_t)j * KVA__PF_LANES + KVA__VL * c);
#pragma GCC unroll 8
        for (int i = 0; i < I; ++i) {
            kva__vf vi = kva__splat(v[(size_t)j * D + i]);
#pragma GCC unroll 4
            for (int c = 0; c < RC; ++c)
                acc[i][c] = kva__fma(pj[c], vi, acc[i][c]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < I; ++i)
#pragma GCC unroll 4
        for (int c = 0; c < RC; ++c)
            *(kva__vf *)(ot + (size_t)i * KVA__PF_LANES + KVA__VL * c) = acc[i][c];
}

#endif /* KVA_PREFILL_KERNELS_H */
