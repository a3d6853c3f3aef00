/*
 * decode_kernel.cuh -- the batched paged decode kernel (one query token per request), with the
 * split-KV merge fused into its epilogue. Included by decode_bf16.cu / decode_f16.cu /
 * decode_f32.cu, which instantiate it per head dim so the builds run in parallel.
 *
 * Work split
 *   unit  = one (work item, KV head, sub-group): work item w is (request b, key chunk c), one 32-byte plan
 *           record (request, key range, kv_len, first page, merge range) in the workspace, read
 *           from the device part of the workspace (graph-safe: for graph plans nothing that
 *           changes between plans is a kernel argument; other plans pass their work count). All g = num_qo_heads / num_kv_heads query heads of the
 *           KV head are served together when g <= 16, so each K/V byte is read from memory
 *           exactly once. Larger groups are cut into nsub = ceil(g / 16) sub-groups of <= 16
 *           heads (a.sub, a.nsub), one unit each; a chunk's sub-group units are adjacent in the
 *           unit order, so they run at the same time and the repeated K/V reads mostly hit L2.
 *   grid  = persistent: min(padded_work * num_kv_heads, blocks resident at once); block i runs
 *           units i, i + grid, i + 2*grid, ... < num_work * num_kv_heads (a non-graph plan with
 *           more units than blocks in the reverse order, last to first). While a block streams
 *           unit k it already fetches unit k+1's plan entries, page ids and query, and it issues
 *           unit k+1's first copies before unit k's epilogue, so one SM streams without a gap
 *           from unit to unit (blocks finishing and starting in lockstep left every SM idle for
 *           a few microseconds per unit; see bench/NOTES.md).
 *   block = 4 warps; warp = an independent stream over the unit's key tiles w, w+4, w+8, ...
 *           (TOK keys each: 16 for f16/bf16, 8 for f32, i.e. 2*TOK*D*elem bytes = 8 KB at
 *           D = 128) through its own 2-stage cp.async ring, with its own online-softmax state
 *           (m, l, O); no block barrier inside a unit. Page ids run PFQ tiles ahead of the copies.
 *   f16/bf16: tensor cores, transposed so the query heads are the narrow N side:
 *           S^T[16 keys x 8 heads] = K[16 x D] * Q^T          (mma.m16n8k16, ldmatrix on K rows)
 *           O^T[D x 8 heads]      += V^T[D x 16 keys] * P^T     (ldmatrix.trans on V rows; P^T from
 *           S^T's accumulators by movmatrix.trans). Groups of 9..16 heads use two N tiles (NT=2).
 *   f32:    CUDA cores (tensor cores would round to tf32): a lane owns D/32 dims, dot products
 *           are reduced across the warp.
 *   Epilogue: the 4 warp states are combined in shared memory; a request covered by one work
 *           item writes o (and lse) directly. Otherwise the block writes its normalised partial
 *           O and LSE (f32) to the workspace, and the last block of (request, KV head, sub-group)
 *           to arrive (atomic counter in the workspace, reset to 0 by that block so graph
 *           replays work) merges all partial states of the request and writes o and lse -- in a
 *           two-level tree above 16 chunks; or, where every chunk unit is its block's last, all
 *           the chunk blocks share the merge (kva__merge_shared, decode_merge.cuh).
 *
 * Head dims: D is the built size (64, 128, 256); a.head_dim <= D is the real one. Copies of q,
 *   K and V past it are zero-filled (cp.async with src-size 0: no bytes read), so dot products
 *   and P V see zeros; o, partial states and the merge use the real dim. The cost is compute and
 *   shared memory for D, not bandwidth.
 * Paired KV heads (a.pair_group = g > 0; kva__decode_pair_for): where one head's row is not whole
 *   128-byte lines but two adjacent heads' rows are (d32, d96 at 2 bytes), a unit serves KV heads 2k
 *   and 2k+1 as one "head" of 2 x head_dim (a.row_dim) with 2g query rows: the first g rows hold
 *   their q at dims [0, dh) and zeros after, the last g at [dh, 2 dh), so every score is its own
 *   head's; of each row's output only its own half is kept (the other half is P times the other
 *   head's V). The launch passes the pair's geometry (KV heads / 2, group x 2, head stride x 2),
 *   so everything else -- plan records, merges, counters -- is unchanged. (A non-finite K of
 *   one head -- 0 x Inf -- makes its partner's scores NaN: documented in kvattn.h.)
 * Global rowmax (GR = true, seed 002 Alg. 2, two launches): pass 1 streams K only and writes each
 *   split chunk's row max to its partial-LSE slot; the last block of (request, KV head,
 *   sub-group) reduces
 *   them and writes the request's max back into every chunk's slot (and into lse, if given).
 *   Pass 2 streams K and V with the running max fixed at that value (no rescaling), writes
 *   unnormalised O_i and L_i, and the last block merges by O = sum O_i / sum L_i. Unsplit
 *   requests skip pass 1 (their max is their own chunk's, found online in pass 2).
 *
 * Memory traffic per run: K+V once (kv_len * num_kv_heads * D * elem * 2 summed over requests),
 * q and o once, page ids once per tile (4 bytes per TOK keys), plus for split requests
 * 2 * chunks * num_qo_heads * (D + 1) * 4 bytes of partial states (written, then read from L2).
 * Scores are in log2 units (x = s * log2 e) so the softmax uses exp2.
 */
#ifndef KVA_DECODE_KERNEL_CUH
#define KVA_DECODE_KERNEL_CUH

#include "cuda_common.cuh"
#include "decode_kernels.h"

#ifndef KVA__DECODE_STAGES
#define KVA__DECODE_STAGES 2 /* cp.async ring depth per warp; 2 keeps 2 blocks (8 streaming warps) per SM, which matters more than depth (bench/NOTES.md) */
#endif
#define KVA__DECODE_PFQ 2 /* page-id lookups in flight per warp, in tiles (>= stages - 1) */
/* S = K Q^T of a one-N-tile kernel accumulated in two independent chains of mma (the even and the
 * odd k16 steps apart, added at the end): a tile's S is on the path from its copy's arrival to
 * the next copy's issue, and each mma waits for the one before it on the same accumulator (8
 * deep at d128, 16 at d256 in one chain). Two-N-tile kernels have two chains already (one per N
 * tile). Not in variant builds (a score modifier's kernels, NVRTC): the built-in ALiBi's module
 * then spilled and its 8 x 4096 decode ran ~1 point slower (bench/NOTES.md, 2026-12-01 calls 6-7).
 * -DKVA__DECODE_S_CHAINS=1: one chain (comparisons; the library's own kernels only -- the flag
 * does not reach NVRTC) */
#ifndef KVA__DECODE_S_CHAINS
#define KVA__DECODE_S_CHAINS 2
#endif
static_assert(KVA__DECODE_S_CHAINS == 1 || KVA__DECODE_S_CHAINS == 2, "KVA__DECODE_S_CHAINS: 1 or 2");
#ifndef KVA__DECODE_REVERSE
#define KVA__DECODE_REVERSE 1 /* non-graph multi-round plans: blocks walk their units last to first */
#endif
#define KVA__LOG2E_F 1.4426950408889634f
#define KVA__LN2_F 0.6931471805599453f

/* Shared-memory geometry of the kernel for element type T, head dim D and NT query-head tiles
 * (host and device): [query rows | per-warp cp.async rings | per-warp combine buffers]. */
template <typename T, int D, int NT>
struct kva__decode_geom {
    static constexpr int ES = (int)sizeof(T);
    static constexpr int TOK = ES == 4 ? 8 : 16;    /* keys per warp tile */
    static constexpr int RB = D * ES;               /* bytes of one K or V row */
    static constexpr int CPR = RB / 16;             /* 16-byte chunks per row (>= 8) */
    static constexpr int EPC = 16 / ES;             /* elements per chunk */
    static constexpr int TILE_BYTES = TOK * RB;     /* K (or V) of one tile */
    static constexpr int STAGE_BYTES = 2 * TILE_BYTES;
    static constexpr int STAGES = D >= 256 ? 2 : KVA__DECODE_STAGES; /* 16 KB tiles at D = 256 */
    static constexpr int WARP_RING = STAGES * STAGE_BYTES;
    static constexpr int Q_ROWS = 16;               /* the largest GQA group */
    static constexpr int Q_BYTES = Q_ROWS * RB;
    static constexpr int GM = 8 * NT;               /* query heads a warp state holds */
    static constexpr int OROW = D + 4;              /* padded f32 row of a combine buffer */
    static constexpr int WARP_COMBINE = GM * OROW + 2 * GM; /* floats: O rows, m, l */
    static constexpr int RING_OFF = Q_BYTES;
    static constexpr int COMBINE_OFF = RING_OFF + KVA__DECODE_WARPS * WARP_RING;
    static constexpr int SMEM = COMBINE_OFF + KVA__DECODE_WARPS * WARP_COMBINE * 4;
    static_assert(CPR >= 8, "swizzle needs 8 chunks per row");
};

/* What a block knows about one unit (work item w, KV head kh) before streaming it. */
typedef struct kva__unit {
    int w, kh, b;
    int sg, hb, gs;           /* the unit's sub-group, its first query head and head count */
    int start, end;           /* visible keys of the chunk */
    int q_pos;                /* the query's position, kv_len - 1 (a variant's score modifier) */
    int page_beg;             /* the request's first entry in the page-index array */
    int item_beg, item_end;   /* the request's work items (its partial states) */
    int my_n;                 /* this warp's tiles */
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
    /* the built-in ALiBi's slopes (log2 units) of the 4 heads this lane scores in the mma path
     * (slot nt * 2 + j: head nt * 8 + 2 * (lane % 4) + j), loaded with the record a unit ahead
     * instead of once per score */
    float alibi[4];
#endif
} kva__unit;

/* Byte offset of 16-byte chunk c of row r in a swizzled tile (row r's chunks XOR r mod 8), so
 * 8 rows read at one column by ldmatrix hit 8 different bank groups. */
template <int RB>
__device__ __forceinline__ uint32_t kva__swz(int r, int c) {
    return (uint32_t)(r * RB + ((c ^ (r & 7)) << 4));
}

/* Reads the D/32 f32 values lane `lane` owns (dims lane*D/32 ...) of swizzled row r. */
template <int D>
__device__ __forceinline__ void kva__load_lane_f32(const unsigned char *base, int r, int lane,
                                                   float *out) {
    constexpr int VPL = D / 32, RB = D * 4;
    if constexpr (VPL == 2) {
        int e = lane * 2;
        float2 x = *reinterpret_cast<const float2 *>(base + kva__swz<RB>(r, e >> 2) + (e & 3) * 4);
        out[0] = x.x; out[1] = x.y;
    } else {
#pragma unroll
        for (int c = 0; c < VPL / 4; ++c) {
            float4 x = *reinterpret_cast<const float4 *>(base + kva__swz<RB>(r, lane * (VPL / 4) + c));
            out[4 * c] = x.x; out[4 * c + 1] = x.y; out[4 * c + 2] = x.z; out[4 * c + 3] = x.w;
        }
    }
}

/* Score of a raw dot product of a visible key, in log2 units, with the optional soft cap. A
 * score outside f32 range becomes NaN, which the softmax carries into the row's sum and output:
 * -inf would look like a masked key (an empty row), +inf already gives NaN (inf - inf). The
 * product is rounded before use: an FMA in exp2(x - max) would keep it unrounded, and at huge
 * scores its difference from the (rounded) max exceeds what exp2 can take. */
template <bool CAP>
__device__ __forceinline__ float kva__score_c(const kva__decode_args &a, float dot) {
    if (CAP) /* an overflowed dot is capped (tanh saturates), as in the reference */
        return a.cap_log2 * kva__tanh_accurate(dot * a.cap_inv_scale);
    const float x = __fmul_rn(dot, a.scale_log2); /* rounded: exp2(x - max) must not fuse it */
    return x == -INFINITY ? NAN : x;
}
__device__ __forceinline__ float kva__score(const kva__decode_args &a, float dot) {
    return a.cap_log2 > 0.0f ? kva__score_c<true>(a, dot) : kva__score_c<false>(a, dot);
}

/* Stores 4 consecutive f32 values as T (8 or 16 bytes, aligned since d % 4 == 0). */
template <typename T>
__device__ __forceinline__ void kva__store4(T *dst, float4 v) {
    if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float4 *>(dst) = v;
    } else {
        uint2 p;
        p.x = kva__pack2<T>(v.x, v.y);
        p.y = kva__pack2<T>(v.z, v.w);
        *reinterpret_cast<uint2 *>(dst) = p;
    }
}

/* The plan record of unit u's work item (workspace_layout.h: 32 bytes, two independent 16-byte
 * loads, one round trip; normally L2 hits). u must be < a.max_units. */
__device__ __forceinline__ void kva__load_record(const kva__decode_args &a, int u, int4 &r0, int4 &r1) {
    const int w = u / a.units_per_work;
    r0 = __ldg(a.records + 2 * w);
    r1 = __ldg(a.records + 2 * w + 1);
}

/* Unit u from its record: no further plan loads. */
template <int TOK>
__device__ __forceinline__ void kva__unit_from_record(const kva__decode_args &a, int u, const int4 &r0,
                                                      const int4 &r1, int warp, kva__unit &m) {
    m.w = u / a.units_per_work;
    const int r = u - m.w * a.units_per_work;
    m.kh = r / a.nsub;
    const int sg = r - m.kh * a.nsub;
    m.sg = sg;
    m.hb = m.kh * a.group + sg * a.sub;
    m.gs = a.group - sg * a.sub < a.sub ? a.group - sg * a.sub : a.sub;
    m.b = r0.x; /* KVA__UR_REQUEST */
    /* decode's query sits at kv_len-1, so causality never hides a key; a sliding window hides
     * the oldest ones */
    const int64_t kv_len = r0.w; /* KVA__UR_KV_LEN */
    m.q_pos = (int)(kv_len - 1);
    const int64_t lo = a.window_left >= 0 ? kv_len - 1 - a.window_left : 0;
    const int64_t c0 = r0.y; /* KVA__UR_KEY_BEG */
    m.start = (int)(c0 > lo ? c0 : (lo > 0 ? lo : 0));
    m.end = r0.z; /* KVA__UR_KEY_END */
    m.page_beg = r1.x;
    m.item_beg = r1.y;
    m.item_end = r1.z;
    int tiles = m.end > m.start ? (m.end - m.start + TOK - 1) / TOK : 0;
    /* global rowmax, pass 1: an unsplit request's max is its own chunk's; pass 2 finds it */
    if (a.pass == 1 && m.item_end - m.item_beg <= 1) tiles = 0;
    m.my_n = tiles > warp ? (tiles - warp + KVA__DECODE_WARPS - 1) / KVA__DECODE_WARPS : 0;
}

/* The unit's caller data that stays in registers (the built-in ALiBi's slopes). Caller data may
 * be a previous kernel's output, so for the first unit this runs after kva__pdl_wait. */
__device__ __forceinline__ void kva__unit_caller_data(const kva__decode_args &a, kva__unit &m) {
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
#pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
        const int head = (slot >> 1) * 8 + 2 * (threadIdx.x & 3) + (slot & 1);
        m.alibi[slot] = head < m.gs ? __ldg((const float *)a.mod_user + m.hb + head) * KVA__LOG2E_F : 0.0f;
    }
#else
    (void)a;
    (void)m;
#endif
}

/* A generic modifier (cuda_common.cuh, KVA_SCORE_MOD) applied to the score sn (natural-log
 * units) of key kv_pos for the unit's query head hb + head; returns log2 units, and a finite
 * modified score beyond log2 range is NaN, not a mask. */
__device__ __forceinline__ float kva__score_mod_of(const kva__decode_args &a, float sn, const kva__unit &m,
                                                   int kv_pos, int head) {
    const float s = KVA_SCORE_MOD(sn, m.q_pos, kv_pos, m.hb + head, a.mod_user);
    const float y = __fmul_rn(s, KVA__LOG2E_F);
    return y == -INFINITY && s != -INFINITY ? NAN : y;
}

/* kva__score in natural-log units, what a modifier sees: without a soft cap one rounded product
 * (dot * sm_scale) instead of kva__score's and a conversion; same NaN rules. */
__device__ __forceinline__ float kva__score_nat(const kva__decode_args &a, float dot) {
    if (a.cap_log2 > 0.0f) return kva__score(a, dot) * KVA__LN2_F;
    const float s = __fmul_rn(dot, a.scale_log2 * KVA__LN2_F);
    return s == -INFINITY ? NAN : s;
}

/* kva__score of key kv_pos for the unit's query head hb + head, then a variant's modifier
 * (cuda_common.cuh, KVA_SCORE_MOD) on kva__score_nat's score; heads >= gs are padding rows and are
 * left alone. The result is rounded like kva__score's (never fused into exp2(x - max)), and a
 * finite modified score beyond log2 range is NaN, not a mask. Without a modifier: kva__score. */
__device__ __forceinline__ float kva__score_at(const kva__decode_args &a, float dot, const kva__unit &m,
                                               int kv_pos, int head, int slot = -1) {
    const float x = kva__score(a, dot);
    if constexpr (KVA__HAS_SCORE_MOD) {
        if (head < m.gs) {
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
            /* the built-in ALiBi (variant_alibi.cuh) in log2 units: one FFMA on the rounded score
             * (x is never -inf here, so no new NaN case) instead of the hook's conversions */
            /* slot >= 0 (mma path, a compile-time index): the slope loaded with the unit */
            const float slope = slot >= 0 ? m.alibi[slot] : __ldg((const float *)a.mod_user + m.hb + head) * KVA__LOG2E_F;
            return fmaf(slope, (float)(kv_pos - m.q_pos), x);
#else
            return kva__score_mod_of(a, kva__score_nat(a, dot), m, kv_pos, head);
#endif
        }
    }
    return x;
}

/* A variant's generic modifier (not the native ALiBi) runs over a whole tile at once: see
 * kva__tile_scores */
#if KVA__HAS_SCORE_MOD && !(defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI))
#define KVA__DECODE_TILE_MOD 1
#else
#define KVA__DECODE_TILE_MOD 0
#endif

/* The scores of a 16-key mma tile through a generic modifier, every slot of the lane (key
 * tstart + lane / 4 + 8 (e / 2), head nt * 8 + 2 (lane % 4) + e % 2), masked (-inf) past the
 * unit's end, the soft cap decided at compile time (the caller tests it once per tile: a test per
 * score put a branch around each slot's score). The modifier is called for every slot at a valid
 * key and head (clamped; results of padding heads and keys past the end are dropped afterwards),
 * all in one straight-line block: behind per-slot branches each call's reads of caller data were
 * their own L1 round trip (8 per tile), here the compiler shares them. The warp ran every call
 * anyway (those branches diverge by lane). The modifier sees an overflowed dot product as -inf
 * (kvattn.h allows it); a finite modified score beyond log2 range must be NaN, not a mask, and
 * that test runs only in a tile where some slot came out -inf (a masked key or an overflow). */
template <int NT, bool CAP>
__device__ __forceinline__ void kva__tile_scores(const kva__decode_args &a, const float (&s)[NT][4],
                                                 const kva__unit &m, int tstart, int end, int lane,
                                                 float (&x)[NT][4]) {
    float sm[NT][4]; /* the modifier's results, natural-log units */
    bool some_neg_inf = false;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int kv_pos = tstart + (lane >> 2) + 8 * (e >> 1), head = nt * 8 + 2 * (lane & 3) + (e & 1);
            /* natural-log units, what a modifier sees: without a cap one rounded product */
            const float sn = CAP ? kva__score_c<true>(a, s[nt][e]) * KVA__LN2_F
                                 : __fmul_rn(s[nt][e], a.scale_log2 * KVA__LN2_F);
            sm[nt][e] = KVA_SCORE_MOD(sn, m.q_pos, min(kv_pos, end - 1), m.hb + min(head, m.gs - 1), a.mod_user);
            const float y = __fmul_rn(sm[nt][e], KVA__LOG2E_F);
            some_neg_inf |= y == -INFINITY;
            /* (padding heads' rows are never stored: any finite score does) */
            x[nt][e] = kv_pos >= end ? -INFINITY : head < m.gs ? y : 0.0f;
        }
    if (some_neg_inf) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (x[nt][e] == -INFINITY && sm[nt][e] != -INFINITY && tstart + (lane >> 2) + 8 * (e >> 1) < end)
                    x[nt][e] = NAN;
    }
}

/* The scores of a 16-key mma tile without a generic modifier (slots as kva__tile_scores: key
 * tstart + lane / 4 + 8 (e / 2), head nt * 8 + 2 (lane % 4) + e % 2; -inf past the unit's end),
 * with the soft cap decided at compile time: the caller tests it once per tile, where a test per
 * score cost each score a branch around the inlined tanh (bench/NOTES.md, "Paired KV heads",
 * call 7). The built-in ALiBi's FFMA as in kva__score_at. */
template <int NT, bool CAP>
__device__ __forceinline__ void kva__tile_scores_builtin(const kva__decode_args &a, const float (&s)[NT][4],
                                                         const kva__unit &m, int tstart, int end, int lane,
                                                         float (&x)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int kv_pos = tstart + (lane >> 2) + 8 * (e >> 1);
            float y = kva__score_c<CAP>(a, s[nt][e]);
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
            const int head = nt * 8 + 2 * (lane & 3) + (e & 1);
            if (head < m.gs) y = fmaf(m.alibi[nt * 2 + (e & 1)], (float)(kv_pos - m.q_pos), y);
#else
            (void)m;
#endif
            x[nt][e] = kv_pos < end ? y : -INFINITY;
        }
}

#include "decode_merge.cuh" /* the split-KV merges of the epilogue: last block, tree, shared */
#include "decode_trace.cuh" /* (measurement builds only) */

template <typename T, int D, int NT, bool GR>
__global__ void __launch_bounds__(KVA__DECODE_THREADS)
    kva__decode_kernel(const __grid_constant__ kva__decode_args a) {
    using G = kva__decode_geom<T, D, NT>;
    constexpr int TOK = G::TOK, RB = G::RB, CPR = G::CPR, EPC = G::EPC, GM = G::GM;
    constexpr int STAGES = G::STAGES, WARPS = KVA__DECODE_WARPS, PFQ = KVA__DECODE_PFQ;
    static_assert(PFQ >= STAGES - 1, "page ids must be ready before their tile is issued");
    constexpr bool MMA = sizeof(T) == 2;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int s_last;
    __shared__ int s_ctl[2]; /* the shared merge's role and participant count */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int u = blockIdx.x, step = (int)gridDim.x;
    KVA__DT_AT(true, KVA__DT_ENTRY, 0);
#if KVA__DECODE_REVERSE
    /* A non-graph plan with more units than blocks: each block walks its units from the last
     * (u + k * grid) down to its first (u), so the plan's first units -- the longest requests'
     * chunks, by the scheduler's order -- are their blocks' last ones and share their merge
     * (kva__merge_shared), where the short units would otherwise follow them (bench/NOTES.md). */
    if (a.num_work >= 0 && a.num_work * a.units_per_work > step && u < a.num_work * a.units_per_work) {
        u += (a.num_work * a.units_per_work - 1 - u) / step * step;
        step = -step;
    }
#endif
    /* The records of this block's first two units (they exist: u < grid <= max_units) are
     * loaded together with the unit count (graph plans), all in one round trip. From then on a
     * record is loaded two units ahead, so no unit start waits for plan data. */
    int4 rec0, rec1, rn0 = make_int4(0, 0, 0, 0), rn1 = make_int4(0, 0, 0, 0);
    kva__load_record(a, u, rec0, rec1);
    if (step > 0 ? u + step < a.max_units : u + step >= 0) kva__load_record(a, u + step, rn0, rn1);
    const int num_work = a.num_work >= 0 ? a.num_work : __ldg(&a.hdr->num_work);
    const int num_units = num_work * a.units_per_work;
    if (u >= num_units) {
#if KVA__DECODE_PDL
        kva__pdl_wait(); /* (a grid that ended before its primary would let the stream run ahead of it) */
#endif
        KVA__DT_AT(true, KVA__DT_EXIT, num_units);
        KVA__DT_COUNT(0);
        return;
    }

    const int Hq = a.num_qo_heads, dh = a.head_dim;
    const int cpr_real = a.row_dim / EPC;  /* chunks of a unit's K/V row inside the real dims */
    const int cpr_head = dh / EPC;         /* chunks of one head's row */
    const bool rowmax_pass = GR && a.pass == 1;
    unsigned char *q_smem = smem;
    unsigned char *ring = smem + G::RING_OFF;
    float *combine = reinterpret_cast<float *>(smem + G::COMBINE_OFF);
    /* Each warp's next unit is parked in the warp's own combine buffer (idle from a unit's start
     * until the warp's combine stores after its loop) instead of in registers across the tile
     * loop: written by lane 0, read by all 32 lanes. The d64 kernel 128 -> 125 registers, its
     * rows -0.2..-1%, the others level; no static shared memory, so no kernel loses a block per
     * SM to it (bench/NOTES.md, "the next unit in shared memory", calls 5, 7, 8; "The parked
     * unit's sync", call 1: the __syncwarp() before the combine stores, racecheck clean). */
    auto parked = [&]() { return reinterpret_cast<kva__unit *>(combine + warp * G::WARP_COMBINE); };
    static_assert(sizeof(kva__unit) <= sizeof(float) * G::WARP_COMBINE, "the parked unit fits a combine buffer");
    const uint32_t warp_ring = kva__smem_addr(ring) + warp * G::WARP_RING;
    const uint64_t stream_policy = kva__l2_evict_first();
    const int ps = a.page_size;
    const int my_tok = lane % TOK; /* lane i < TOK computes the address of key i of a tile */

    /* Page id of this lane's key of my tile i of unit m (ok = false past the unit's end). */
    auto load_pid = [&](const kva__unit &m, int i, int &pid, int &slot, bool &ok) {
        const int pos = m.start + (warp + WARPS * i) * TOK + my_tok;
        ok = i < m.my_n && pos < m.end;
        pid = 0;
        slot = 0;
        if (ok) {
            const int p = kva__div_by(pos, a.page_div); /* (pos / ps without a divide) */
            slot = pos - p * ps;
            pid = __ldg(a.ints + a.off_page_indices + m.page_beg + p);
        }
    };
    auto row_offset = [&](int pid, int slot, bool ok) -> int64_t {
        return ok ? (int64_t)pid * a.p_sp + (int64_t)slot * a.p_st : (int64_t)-1;
    };
    /* Copies a tile's K and V rows (this lane's offset `off` is key my_tok's row) into a stage. */
    auto issue = [&](int stage, int64_t off, int kh) {
        const uint32_t kdst = warp_ring + stage * G::STAGE_BYTES;
        const uint32_t vdst = kdst + G::TILE_BYTES;
        const T *kbase = (const T *)a.k + (int64_t)kh * a.p_sh;
        const T *vbase = (const T *)a.v + (int64_t)kh * a.p_sh;
#pragma unroll
        for (int it = 0; it < TOK * CPR / 32; ++it) {
            const int qd = lane + 32 * it, r = qd / CPR, c = qd % CPR;
            const int64_t ro = __shfl_sync(0xffffffffu, off, r);
            /* past the real head dim: zero-filled, nothing read */
            const bool ok = ro >= 0 && c < cpr_real;
            const int64_t e = (ok ? ro + c * EPC : 0);
            kva__cp_async16(kdst + kva__swz<RB>(r, c), kbase + e, ok, stream_policy);
            if (!rowmax_pass) kva__cp_async16(vdst + kva__swz<RB>(r, c), vbase + e, ok, stream_policy);
        }
    };
    /* The query rows of a unit's group (rows >= g are zeros), into registers. A unit of two KV
     * heads (a.pair_group = g) holds 2g rows, the last g at dims [dh, 2 dh) of the pair's row and
     * the first g at [0, dh), zeros elsewhere: each head's scores see only its own KV head's dims. */
    constexpr int QV = (G::Q_ROWS * CPR + KVA__DECODE_THREADS - 1) / KVA__DECODE_THREADS;
    uint4 qv[QV];
    auto load_q = [&](const kva__unit &m) {
        const T *qb = (const T *)a.q + (int64_t)m.b * a.q_st + (int64_t)m.hb * a.q_sh;
#pragma unroll
        for (int j = 0; j < QV; ++j) {
            const int i = tid + j * KVA__DECODE_THREADS, r = i / CPR, c = i % CPR;
            const int c0 = a.pair_group > 0 && r >= a.pair_group ? cpr_head : 0;
            qv[j] = make_uint4(0, 0, 0, 0);
            if (i < G::Q_ROWS * CPR && r < m.gs && c >= c0 && c < c0 + cpr_head)
                qv[j] = __ldg(reinterpret_cast<const uint4 *>(qb + r * a.q_sh + (c - c0) * EPC));
        }
    };

    /* Page-id queue of the unit being streamed: my tile t sits in slot t % PFQ; the main loop is
     * unrolled by PFQ so slot indices are compile-time constants and slots are refilled in place
     * (moving a register whose load is still in flight would make the warp wait for it). */
    int q_pid[PFQ], q_slot[PFQ];
    bool q_ok[PFQ];
    /* The same for the next unit: its prologue tiles and its queue, fetched a unit ahead. */
    int n_pid[STAGES - 1 + PFQ], n_slot[STAGES - 1 + PFQ];
    bool n_ok[STAGES - 1 + PFQ];

    kva__unit cur;
    kva__unit_from_record<TOK>(a, u, rec0, rec1, warp, cur);
#ifdef KVA__DECODE_TRACE
    KVA__DT_AT(true, KVA__DT_REC, cur.start + cur.end); /* (after the record landed) */
    bool first_unit = true;
    int units_run = 0;
#endif
#if KVA__DECODE_PDL
    /* (launched as a programmatic dependent: plan data so far -- records, page ids --, then the
     * wait for the kernel before, whose writes q, K / V and o may be; cuda_common.cuh) */
#pragma unroll
    for (int t = 0; t < STAGES - 1 + PFQ; ++t) load_pid(cur, t, n_pid[t], n_slot[t], n_ok[t]);
    kva__pdl_wait();
    KVA__DT_AT(true, KVA__DT_WAIT, 0);
    kva__unit_caller_data(a, cur);
    load_q(cur);
#else
    kva__unit_caller_data(a, cur);
    load_q(cur);
#pragma unroll
    for (int t = 0; t < STAGES - 1 + PFQ; ++t) load_pid(cur, t, n_pid[t], n_slot[t], n_ok[t]);
    KVA__DT_AT(true, KVA__DT_WAIT, 0);
#endif
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) { /* the first unit's prologue */
        if (t < cur.my_n) issue(t, row_offset(n_pid[t], n_slot[t], n_ok[t]), cur.kh);
        kva__cp_async_commit();
    }

    for (;;) {
        /* ---- start of unit `cur`: its prologue copies are in flight ---- */
#pragma unroll
        for (int t = STAGES - 1; t < STAGES - 1 + PFQ; ++t) {
            q_pid[t % PFQ] = n_pid[t];
            q_slot[t % PFQ] = n_slot[t];
            q_ok[t % PFQ] = n_ok[t];
        }
#pragma unroll
        for (int j = 0; j < QV; ++j) {
            const int i = tid + j * KVA__DECODE_THREADS;
            if (i < G::Q_ROWS * CPR) *reinterpret_cast<uint4 *>(q_smem + kva__swz<RB>(i / CPR, i % CPR)) = qv[j];
        }
        __syncthreads();

        /* The next unit's page ids and query (its record arrived a unit ago): issued here and
         * not waited for until this unit's epilogue issues the next unit's first copies. */
        const int un = u + step;
        const bool has_next = step > 0 ? un < num_units : un >= 0;
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
        float next_alibi[4]; /* (per lane: stays in registers) */
#endif
        if (has_next) {
            kva__unit nxt;
            kva__unit_from_record<TOK>(a, un, rn0, rn1, warp, nxt);
            kva__unit_caller_data(a, nxt);
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
#pragma unroll
            for (int j = 0; j < 4; ++j) next_alibi[j] = nxt.alibi[j];
#endif
#pragma unroll
            for (int t = 0; t < STAGES - 1 + PFQ; ++t) load_pid(nxt, t, n_pid[t], n_slot[t], n_ok[t]);
            load_q(nxt);
            if (lane == 0) *parked() = nxt;
        }
        if (step > 0 ? un + step < num_units : un + step >= 0) kva__load_record(a, un + step, rn0, rn1);

        /* Online-softmax state. f16/bf16: per thread, head nt*8 + 2*(lane%4) + j in slot
         * nt*2 + j, l summed over this lane's keys only (reduced across the warp at the end).
         * f32: per head, uniform across the warp. */
        float m_st[GM], l_st[GM];
#pragma unroll
        for (int h = 0; h < GM; ++h) { m_st[h] = -INFINITY; l_st[h] = 0.0f; }
        /* Global rowmax, pass 2 of a split request: every chunk exponentiates against the
         * request's row max (pass 1 left it in this chunk's partial-LSE slot), so the state never
         * rescales and the merge is a plain sum. */
        const bool fixed_max = GR && a.pass == 2 && cur.item_end - cur.item_beg > 1;
        if (fixed_max) {
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                const int head = MMA ? (h >> 1) * 8 + 2 * (lane & 3) + (h & 1) : h;
                if (head < cur.gs) m_st[h] = __ldcg(a.partial_lse + (int64_t)cur.w * Hq + cur.hb + head);
            }
        }
        constexpr int OACC = MMA ? (D / 16) * NT * 4 : GM * (D / 32);
        float o_acc[OACC];
#pragma unroll
        for (int i = 0; i < OACC; ++i) o_acc[i] = 0.0f;

        /* Q fragments (B operand of S^T = K Q^T) stay in registers when they are few. */
        constexpr bool QREG = MMA && NT * D <= 256;
        uint32_t qf[QREG ? NT * (D / 16) * 2 : 1];
        if constexpr (QREG) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int k2 = 0; k2 < D / 32; ++k2) {
                    uint32_t r[4];
                    kva__ldmatrix_x4(r, kva__smem_addr(q_smem) + kva__swz<RB>(nt * 8 + (lane & 7), k2 * 4 + (lane >> 3)));
                    uint32_t *f = qf + (nt * (D / 16) + 2 * k2) * 2;
                    f[0] = r[0]; f[1] = r[1]; f[2] = r[2]; f[3] = r[3];
                }
        }

        const int end = cur.end, my_n = cur.my_n;
        for (int i0 = 0; i0 < my_n; i0 += PFQ)
#pragma unroll
        for (int uu = 0; uu < PFQ; ++uu) {
            const int i = i0 + uu;
            if (i >= my_n) break;
            {
                /* tile i+STAGES-1 sits in slot (uu+STAGES-1) % PFQ since i0 % PFQ == 0 */
                const int j = (uu + STAGES - 1) % PFQ;
                const int64_t off = row_offset(q_pid[j], q_slot[j], q_ok[j]);
                load_pid(cur, i + STAGES - 1 + PFQ, q_pid[j], q_slot[j], q_ok[j]);
                if (i + STAGES - 1 < my_n) issue((i + STAGES - 1) % STAGES, off, cur.kh);
                kva__cp_async_commit();
            }
            kva__cp_async_wait<STAGES - 1>();
            __syncwarp();
            KVA__DT_AT(first_unit && i == 0, KVA__DT_FIRST, 0);
            const int stage = i % STAGES;
            const unsigned char *ks = ring + warp * G::WARP_RING + stage * G::STAGE_BYTES;
            const unsigned char *vs = ks + G::TILE_BYTES;
            const uint32_t ks_s = warp_ring + stage * G::STAGE_BYTES, vs_s = ks_s + G::TILE_BYTES;
            const int tstart = cur.start + (warp + WARPS * i) * TOK;

            if constexpr (MMA) {
                /* S^T[key][head] = sum_d K[key][d] Q[head][d] */
                constexpr bool S_SPLIT = KVA__DECODE_S_CHAINS == 2 && NT == 1 && !KVA__HAS_SCORE_MOD;
                float s[NT][4], s_odd[NT][4]; /* (s_odd: the odd k16 steps' chain where S_SPLIT) */
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[nt][e] = s_odd[nt][e] = 0.0f;
#pragma unroll
                for (int k2 = 0; k2 < D / 32; ++k2) {
                    uint32_t qb[NT][4];
                    if constexpr (QREG) {
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                            for (int j = 0; j < 4; ++j) qb[nt][j] = qf[(nt * (D / 16) + 2 * k2) * 2 + j];
                    } else {
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt)
                            kva__ldmatrix_x4(qb[nt], kva__smem_addr(q_smem) + kva__swz<RB>(nt * 8 + (lane & 7), k2 * 4 + (lane >> 3)));
                    }
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk) {
                        uint32_t ka[4];
                        kva__ldmatrix_x4(ka, ks_s + kva__swz<RB>(lane & 15, (2 * k2 + kk) * 2 + (lane >> 4)));
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt)
                            kva__mma16816<T>(S_SPLIT && kk == 1 ? s_odd[nt] : s[nt], ka,
                                             qb[nt][2 * kk], qb[nt][2 * kk + 1]);
                    }
                }
                if constexpr (S_SPLIT) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) s[nt][e] += s_odd[nt][e];
                }
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
                static_assert(NT <= 2, "kva__unit.alibi holds the slopes of two N tiles");
#endif
                /* Online softmax over the 16 keys of this tile, per head column, on its scores */
                float xs[NT][4];
#if KVA__DECODE_TILE_MOD
                if (a.cap_log2 > 0.0f)
                    kva__tile_scores<NT, true>(a, s, cur, tstart, end, lane, xs);
                else
                    kva__tile_scores<NT, false>(a, s, cur, tstart, end, lane, xs);
#else
                if (a.cap_log2 > 0.0f)
                    kva__tile_scores_builtin<NT, true>(a, s, cur, tstart, end, lane, xs);
                else
                    kva__tile_scores_builtin<NT, false>(a, s, cur, tstart, end, lane, xs);
#endif
                if (rowmax_pass) { /* global rowmax, pass 1: the chunk's row max only */
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int j = 0; j < 2; ++j) {
                            float mx = fmaxf(xs[nt][j], xs[nt][j + 2]);
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                            m_st[nt * 2 + j] = fmaxf(m_st[nt * 2 + j], mx);
                        }
                    __syncwarp();
                    continue;
                }
                uint32_t pb[NT][2];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    float p[4];
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const float x0 = xs[nt][j], x1 = xs[nt][j + 2];
                        float mx = fmaxf(x0, x1);
                        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                        const int h = nt * 2 + j; /* state slot of head nt*8 + 2*(lane%4) + j */
                        const float m_new = fixed_max ? m_st[h] : fmaxf(m_st[h], mx);
                        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                        const float alpha = exp2f(m_st[h] - m_use);
                        p[j] = exp2f(x0 - m_use);
                        p[j + 2] = exp2f(x1 - m_use);
                        l_st[h] = l_st[h] * alpha + p[j] + p[j + 2];
                        m_st[h] = m_new;
#pragma unroll
                        for (int md = 0; md < D / 16; ++md) {
                            o_acc[(md * NT + nt) * 4 + j] *= alpha;
                            o_acc[(md * NT + nt) * 4 + j + 2] *= alpha;
                        }
                    }
                    pb[nt][0] = kva__movmatrix_trans(kva__pack2<T>(p[0], p[1]));
                    pb[nt][1] = kva__movmatrix_trans(kva__pack2<T>(p[2], p[3]));
                }
                /* O^T[d][head] += sum_key V[key][d] P[head][key] */
#pragma unroll
                for (int md = 0; md < D / 16; ++md) {
                    uint32_t va[4];
                    kva__ldmatrix_x4_trans(va, vs_s + kva__swz<RB>(((lane >> 4) << 3) + (lane & 7), 2 * md + ((lane >> 3) & 1)));
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        kva__mma16816<T>(&o_acc[(md * NT + nt) * 4], va, pb[nt][0], pb[nt][1]);
                }
            } else {
                constexpr int VPL = D / 32;
                const int nvalid = end - tstart < TOK ? end - tstart : TOK;
                for (int t = 0; t < nvalid; ++t) {
                    float kv[VPL], vv[VPL];
                    kva__load_lane_f32<D>(ks, t, lane, kv);
                    if (!rowmax_pass) kva__load_lane_f32<D>(vs, t, lane, vv);
#pragma unroll
                    for (int h = 0; h < GM; ++h) {
                        if (h < cur.gs) {
                            float qq[VPL];
                            kva__load_lane_f32<D>(q_smem, h, lane, qq);
                            float dot = 0.0f;
#pragma unroll
                            for (int e = 0; e < VPL; ++e) dot = fmaf(qq[e], kv[e], dot);
#pragma unroll
                            for (int sh = 16; sh >= 1; sh >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, sh);
                            const float x = kva__score_at(a, dot, cur, tstart + t, h);
                            if (rowmax_pass) {
                                m_st[h] = fmaxf(m_st[h], x);
                                continue;
                            }
                            const float m_new = fixed_max ? m_st[h] : fmaxf(m_st[h], x);
                            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                            const float alpha = exp2f(m_st[h] - m_use);
                            const float p = exp2f(x - m_use);
                            l_st[h] = l_st[h] * alpha + p;
                            m_st[h] = m_new;
#pragma unroll
                            for (int e = 0; e < VPL; ++e)
                                o_acc[h * VPL + e] = fmaf(p, vv[e], o_acc[h * VPL + e] * alpha);
                        }
                    }
                }
            }
            __syncwarp(); /* every lane is done with this stage before it is refilled */
        }

        KVA__DT_AT(first_unit, KVA__DT_LOOP, 0);
        __syncwarp(); /* (lane 0's parked store, for a warp whose loop ran no tile) */
        kva__unit nxt;
        nxt.my_n = 0;
        if (has_next) {
            nxt = *parked();
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
#pragma unroll
            for (int j = 0; j < 4; ++j) nxt.alibi[j] = next_alibi[j];
#endif
        }
        /* ---- this warp's ring is free: start the next unit's copies now ---- */
#pragma unroll
        for (int t = 0; t < STAGES - 1; ++t) {
            if (t < nxt.my_n) issue(t, row_offset(n_pid[t], n_slot[t], n_ok[t]), nxt.kh);
            kva__cp_async_commit();
        }

        /* ---- this warp's state -> its combine buffer ---- */
        __syncwarp(); /* every lane has read the parked unit before these stores overwrite it */
        float *cw = combine + warp * G::WARP_COMBINE;
        float *cm = cw + GM * G::OROW, *cl = cm + GM;
        if constexpr (MMA) {
#pragma unroll
            for (int h = 0; h < 2 * NT; ++h) {
                l_st[h] += __shfl_xor_sync(0xffffffffu, l_st[h], 4);
                l_st[h] += __shfl_xor_sync(0xffffffffu, l_st[h], 8);
                l_st[h] += __shfl_xor_sync(0xffffffffu, l_st[h], 16);
            }
#pragma unroll
            for (int md = 0; md < D / 16; ++md)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int head = nt * 8 + 2 * (lane & 3) + j, d0 = md * 16 + (lane >> 2);
                        cw[head * G::OROW + d0] = o_acc[(md * NT + nt) * 4 + j];
                        cw[head * G::OROW + d0 + 8] = o_acc[(md * NT + nt) * 4 + j + 2];
                    }
            if (lane < 4) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        cm[nt * 8 + 2 * lane + j] = m_st[nt * 2 + j];
                        cl[nt * 8 + 2 * lane + j] = l_st[nt * 2 + j];
                    }
            }
        } else {
            constexpr int VPL = D / 32;
#pragma unroll
            for (int h = 0; h < GM; ++h)
                if (h < cur.gs) {
#pragma unroll
                    for (int e = 0; e < VPL; ++e) cw[h * G::OROW + lane * VPL + e] = o_acc[h * VPL + e];
                    if (lane == 0) { cm[h] = m_st[h]; cl[h] = l_st[h]; }
                }
        }
        __syncthreads();

        /* ---- combine the 4 warps; write o directly, or this chunk's partial state ---- */
        const int n_items = cur.item_end - cur.item_beg;
        const int b = cur.b, kh = cur.kh;
        if (rowmax_pass) {
            /* global rowmax, pass 1: the chunk's row max (log2 units) into its partial-LSE slot */
            if (n_items > 1)
                for (int h = tid; h < cur.gs; h += KVA__DECODE_THREADS) {
                    float M = -INFINITY;
#pragma unroll
                    for (int wi = 0; wi < WARPS; ++wi) M = fmaxf(M, combine[wi * G::WARP_COMBINE + GM * G::OROW + h]);
                    a.partial_lse[(int64_t)cur.w * Hq + cur.hb + h] = M;
                }
        } else {
            const int E4 = cur.gs * dh / 4;
            for (int i = tid; i < E4; i += KVA__DECODE_THREADS) {
                const int h = (i * 4) / dh, d = (i * 4) % dh;
                float M = -INFINITY;
#pragma unroll
                for (int wi = 0; wi < WARPS; ++wi) M = fmaxf(M, combine[wi * G::WARP_COMBINE + GM * G::OROW + h]);
                const float m_use = M == -INFINITY ? 0.0f : M;
                float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
                float L = 0.0f;
                /* (a pair's second KV head: its heads' outputs sit at dims [dh, 2 dh) of their rows) */
                const int col = h * G::OROW + (a.pair_group > 0 && h >= a.pair_group ? dh : 0) + d;
#pragma unroll
                for (int wi = 0; wi < WARPS; ++wi) {
                    const float *cww = combine + wi * G::WARP_COMBINE;
                    const float f = exp2f(cww[GM * G::OROW + h] - m_use);
                    const float4 x = *reinterpret_cast<const float4 *>(cww + col);
                    acc.x += f * x.x; acc.y += f * x.y; acc.z += f * x.z; acc.w += f * x.w;
                    L += f * cww[GM * G::OROW + GM + h];
                }
                const int qh = cur.hb + h;
                if (fixed_max) {
                    /* global rowmax, pass 2: O_i and L_i against the request's max, unnormalised */
                    *reinterpret_cast<float4 *>(a.partial_o + ((int64_t)cur.w * Hq + qh) * dh + d) = acc;
                    if (d == 0) a.partial_lse[(int64_t)cur.w * Hq + qh] = L;
                    continue;
                }
                const float inv = kva__softmax_inv(L);
                acc.x *= inv; acc.y *= inv; acc.z *= inv; acc.w *= inv;
                const float lse = kva__softmax_lse(M, L);
                if (n_items == 1) {
                    kva__store4<T>((T *)a.o + (int64_t)b * a.o_st + (int64_t)qh * a.o_sh + d, acc);
                    if (a.lse && d == 0) a.lse[(int64_t)b * Hq + qh] = lse;
                } else {
                    *reinterpret_cast<float4 *>(a.partial_o + ((int64_t)cur.w * Hq + qh) * dh + d) = acc;
                    if (d == 0) a.partial_lse[(int64_t)cur.w * Hq + qh] = lse;
                }
            }
        }

#ifdef KVA__DECODE_TRACE
        KVA__DT_AT(first_unit, KVA__DT_COMB, 0);
        first_unit = false;
        ++units_run;
#endif
        if (n_items > 1) {
            /* ---- split request: the last block of (request, KV head, sub-group) -- of its
             * n_items units -- merges the chunks of the sub-group's query heads; the sub-groups
             * of a large group merge in parallel, each on its own block ---- */
            /* partial rowmax with more chunks than one merge run: a two-level tree (below);
             * this unit's run is [run_first, run_first + run_count) */
            /* every chunk unit of this (request, KV head, sub-group) is its block's last: the
             * shared merge (above). Forward, the smallest of them (the request's first work
             * item's) is among the last grid units; walking down, the largest is below grid */
            const int r_unit = cur.kh * a.nsub + cur.sg;
            const bool all_last = step > 0 ? cur.item_beg * a.units_per_work + r_unit + (int)gridDim.x >= num_units
                                           : (cur.item_end - 1) * a.units_per_work + r_unit < (int)gridDim.x;
            const bool shared = !GR && n_items >= a.shared_merge_min && n_items <= 0xffff && all_last;
            if (shared) {
                unsigned *words = a.run_counters + ((int64_t)cur.item_beg * a.num_kv_heads + kh) * a.nsub + cur.sg;
                kva__merge_shared<T>(a, ring, tid, cur.hb, cur.gs, b, cur.item_beg, n_items,
                                     a.counters + ((int64_t)b * a.num_kv_heads + kh) * a.nsub + cur.sg, words,
                                     words + (int64_t)a.num_kv_heads * a.nsub, s_ctl);
                break; /* (no next unit) */
            }
            const bool tree = !GR && n_items > KVA__MERGE_RUN;
            const int run_first = cur.item_beg + (cur.w - cur.item_beg) / KVA__MERGE_RUN * KVA__MERGE_RUN;
            const int run_count = cur.item_end - run_first < KVA__MERGE_RUN ? cur.item_end - run_first
                                                                            : KVA__MERGE_RUN;
            __syncthreads(); /* the partial-state stores happen before thread 0's release */
            if (tid == 0) {
                unsigned *counter =
                    tree ? a.run_counters + ((int64_t)run_first * a.num_kv_heads + kh) * a.nsub + cur.sg
                         : a.counters + ((int64_t)b * a.num_kv_heads + kh) * a.nsub + cur.sg;
                /* (release: this block's states before the count; acquire: the others' states
                 * read after it, by the last one) */
                const unsigned prev = kva__atom_add_acq_rel(counter, 1u);
                s_last = prev == (unsigned)((tree ? run_count : n_items) - 1);
                if (s_last) *counter = 0u; /* ready for the next run */
            }
            __syncthreads();
            if (s_last && rowmax_pass) {
                /* Global rowmax, pass 1: the request's row max goes back into every chunk's
                 * slot (pass 2 reads only its own slot, then overwrites it with L_i) and into
                 * the lse output, where pass 2's merge finds it. */
                for (int h = tid; h < cur.gs; h += KVA__DECODE_THREADS) {
                    const int qh = cur.hb + h;
                    float M = -INFINITY;
                    for (int st = cur.item_beg; st < cur.item_end; ++st)
                        M = fmaxf(M, __ldcg(a.partial_lse + (int64_t)st * Hq + qh));
                    for (int st = cur.item_beg; st < cur.item_end; ++st) a.partial_lse[(int64_t)st * Hq + qh] = M;
                    if (a.lse) a.lse[(int64_t)b * Hq + qh] = M;
                }
            } else if (s_last && GR) {
                /* Global rowmax, pass 2: every chunk's state is relative to the same max, so the
                 * merge is O = sum O_i / sum L_i with no rescaling; MB states per round trip. */
                const int gE4 = cur.gs * dh / 4;
                for (int i = tid; i < gE4; i += KVA__DECODE_THREADS) {
                    const int h = (i * 4) / dh, d = (i * 4) % dh, qh = cur.hb + h;
                    float L = 0.0f;
                    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
                    constexpr int MB = 8;
                    for (int s0 = cur.item_beg; s0 < cur.item_end; s0 += MB) {
                        float ls[MB];
                        float4 x[MB];
#pragma unroll
                        for (int j = 0; j < MB; ++j) {
                            const int st = s0 + j < cur.item_end ? s0 + j : cur.item_end - 1;
                            ls[j] = __ldcg(a.partial_lse + (int64_t)st * Hq + qh);
                            x[j] = __ldcg(reinterpret_cast<const float4 *>(a.partial_o + ((int64_t)st * Hq + qh) * dh + d));
                        }
#pragma unroll
                        for (int j = 0; j < MB; ++j)
                            if (s0 + j < cur.item_end) {
                                acc.x += x[j].x; acc.y += x[j].y; acc.z += x[j].z; acc.w += x[j].w;
                                L += ls[j];
                            }
                    }
                    const float inv = kva__softmax_inv(L);
                    acc.x *= inv; acc.y *= inv; acc.z *= inv; acc.w *= inv;
                    kva__store4<T>((T *)a.o + (int64_t)b * a.o_st + (int64_t)qh * a.o_sh + d, acc);
                    if (a.lse && d == 0) {
                        const float M = a.lse[(int64_t)b * Hq + qh]; /* pass 1 left the row max here */
                        a.lse[(int64_t)b * Hq + qh] = kva__softmax_lse(M, L);
                    }
                }
            } else if (s_last) {
                /* Partial rowmax: states of one run of <= KVA__MERGE_RUN chunks merge into the
                 * run's first slot (level 1) when the request has more chunks than one run; the
                 * last run to finish merges the run states (level 2) into o and lse. So no block
                 * merges more than KVA__MERGE_RUN + ceil(n_items / KVA__MERGE_RUN) states, and
                 * the runs of a long request merge on different blocks at the same time. */
                if (!tree) {
                    kva__merge_states<T, D, NT>(a, ring, tid, has_next, cur.hb, cur.gs, b, cur.item_beg,
                                                n_items, 1, a.partial_lse, -1);
                } else {
                    kva__merge_states<T, D, NT>(a, ring, tid, has_next, cur.hb, cur.gs, b, run_first,
                                                run_count, 1, a.partial_lse, run_first);
                    __syncthreads(); /* the run state's stores happen before the release */
                    if (tid == 0) {
                        unsigned *counter = a.counters + ((int64_t)b * a.num_kv_heads + kh) * a.nsub + cur.sg;
                        const int runs = (n_items + KVA__MERGE_RUN - 1) / KVA__MERGE_RUN;
                        const unsigned prev = kva__atom_add_acq_rel(counter, 1u);
                        s_last = prev == (unsigned)(runs - 1);
                        if (s_last) *counter = 0u; /* ready for the next run */
                    }
                    __syncthreads();
                    if (s_last)
                        kva__merge_states<T, D, NT>(a, ring, tid, has_next, cur.hb, cur.gs, b, cur.item_beg,
                                                    (n_items + KVA__MERGE_RUN - 1) / KVA__MERGE_RUN,
                                                    KVA__MERGE_RUN, a.run_lse, -1);
                }
            }
        }
        if (!has_next) break;
        __syncthreads(); /* combine buffers and the query rows are rewritten for the next unit */
        u = un;
        cur = nxt;
    }
    KVA__DT_AT(true, KVA__DT_EXIT, 0);
    KVA__DT_COUNT(units_run);
}

/* Instantiates the kernels of one element type and head dim, and the lookups the launcher
 * calls (declared in decode_kernels.h). */
#define KVA__DECODE_INSTANTIATE(T, D, NAME)                                                    \
    const void *NAME(int nt, int gr) {                                                         \
        if (gr)                                                                                \
            return nt == 1 ? (const void *)kva__decode_kernel<T, D, 1, true>                    \
                           : (const void *)kva__decode_kernel<T, D, 2, true>;                   \
        return nt == 1 ? (const void *)kva__decode_kernel<T, D, 1, false>                       \
                       : (const void *)kva__decode_kernel<T, D, 2, false>;                      \
    }                                                                                          \
    int NAME##_smem(int nt) {                                                                  \
        return nt == 1 ? kva__decode_geom<T, D, 1>::SMEM : kva__decode_geom<T, D, 2>::SMEM;     \
    }

#endif /* KVA_DECODE_KERNEL_CUH */
