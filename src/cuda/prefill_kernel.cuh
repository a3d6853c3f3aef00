/*
 * prefill_kernel.cuh -- FlashAttention-2-style prefill on tensor cores (f16/bf16 in, f32
 * accumulate), for ragged or paged K/V, from a host plan or for one dense sequence, with
 * mma.sync (sm_80 and later) or wgmma (Hopper). Included by prefill_bf16.cu and prefill_f16.cu,
 * which instantiate it per head dim, tile and path.
 *
 * Work split
 *   grid  = (work items, KV heads). Work item w is one (request, query tile, key chunk) of the
 *           plan (its 32-byte record) or, for a dense call, query tile w of the one sequence.
 *           Blocks run work items last-first: later query tiles of a causal request see more
 *           keys, so the longest blocks start first and short ones fill the tail. Blocks of one
 *           KV head launch together and share its K/V through L2.
 *   block = ROWS = 64 * MT packed query rows: row r is token r / group, query head
 *           kh * group + r % group, so every K/V tile loaded serves the whole GQA group.
 *           4 warps; warp i owns rows 16*MT*i .. +16*MT (FA2 split: no cross-warp softmax).
 *   loop  = key tiles of BN = 64 keys through a 2-stage cp.async ring in swizzled shared
 *           memory, K and V in separate commit groups so S = Q K^T starts while V lands:
 *             iteration j: issue K[j+1]; wait K[j]; S = Q K[j]^T (ldmatrix Q and K,
 *             mma.m16n8k16); mask (diagonal / window / chunk-end tiles only); online softmax
 *             in registers with exp2 (log2 e folded into the scale); issue V[j+1]; wait V[j];
 *             O += P V[j] (P re-packed from S's accumulators, V by ldmatrix.trans).
 *           Causal: tiles right of the tile's last query are never loaded; window: tiles left
 *           of its first query's window are never loaded.
 *   out   = O / l in the output dtype and LSE (natural log) when the work item covers all of
 *           its request's keys; otherwise f32 partial O and LSE into the workspace, merged by
 *           prefill_merge.cu. A row that sees no key gets 0 and LSE -inf.
 *
 * Hopper (WG = true, sm_90a): the same loop with warpgroups of 4 warps x 16 rows (two, 128
 *           rows; three, 192 rows, at d64 to match the warp-specialised kernel's items);
 *           S[64 x 64] = Q K^T per warpgroup as D/16 wgmma.m64n64k16 with both operands read
 *           by the tensor cores from shared memory (descriptors over a 128-byte-swizzled layout:
 *           64-element column blocks of 128-byte rows), O[64 x D] += P V as BN/16
 *           wgmma.m64nDk16 with P from registers (S's accumulator layout is the A-fragment
 *           layout) and V read N-major. cp.async writes are made visible to the tensor cores
 *           with fence.proxy.async before each barrier. No ldmatrix, 128 registers, 2 blocks
 *           (16 warps) per SM at D = 128.
 *
 * Per key tile and block: bytes = 2 * BN * D * 2 (K and V; 32 KB at D = 128) from L2/DRAM;
 * FLOPs = 4 * ROWS * BN * D (4.2 MFLOP at ROWS = 128, D = 128); shared-memory reads per warp =
 * (16*MT*D + 2*BN*D) * 2 bytes (Q re-read per tile, K and V once per warp).
 * Registers per thread: O = MT * D / 2 floats, S = MT * BN / 4 floats.
 */
#ifndef KVA_PREFILL_KERNEL_CUH
#define KVA_PREFILL_KERNEL_CUH

#include "cuda_common.cuh"
#include "prefill_kernels.h"
#include "wgmma.cuh"

#define KVA__PF_LN2 0.6931471805599453f
#define KVA__PF_LOG2E 1.4426950408889634f

template <typename T, int D, int MT, int WARPS, int BN_ = 64, bool WG = false>
struct kva__prefill_geom {
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int ROWS = 16 * MT * WARPS;
    static constexpr int BN = BN_;
    static constexpr int RB = D * 2;            /* bytes of a row */
    static constexpr int CPR = RB / 16;         /* 16-byte chunks per row */
    static constexpr int Q_BYTES = ROWS * RB;
    static constexpr int TILE_BYTES = BN * RB;  /* K or V of one tile */
    static constexpr int STAGES = 2;
    /* row offsets (elements) of the keys of two tiles, K and V: [2 tiles][2][BN] int64 */
    static constexpr int OFF_BYTES = 2 * 2 * BN * 8;
    /* wgmma reads 128-byte-swizzled tiles whose 8-row groups must be 1024-byte aligned */
    static constexpr int ALIGN_SLACK = WG ? 1024 : 0;
    static constexpr int SMEM = Q_BYTES + STAGES * 2 * TILE_BYTES + OFF_BYTES + ALIGN_SLACK;
    static_assert(CPR >= 8, "the swizzle needs 8 chunks per row");
};

/* Byte offset of 16-byte chunk c of row r in a swizzled tile (chunk index XOR row mod 8), so the
 * 8 row addresses of one ldmatrix hit 8 different bank groups. */
template <int RB>
__device__ __forceinline__ uint32_t kva__pf_swz(int r, int c) {
    return (uint32_t)(r * RB + ((c ^ (r & 7)) << 4));
}

/* Byte offset of 16-byte chunk c of row r in a tile of NROWS rows. The mma.sync kernels use
 * whole rows with the XOR swizzle above; the wgmma kernels store the tile as column blocks of
 * 64 elements (128-byte rows, 8-row groups of 1024 bytes) with the same XOR inside each block:
 * the 128-byte-swizzle layout the wgmma descriptors describe (K-major for Q and K, N-major for
 * V). */
template <int RB, int NROWS, bool WG>
__device__ __forceinline__ uint32_t kva__pf_tile_off(int r, int c) {
    if constexpr (WG) return (uint32_t)((c >> 3) * (NROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
    else return kva__pf_swz<RB>(r, c);
}

/* 16-byte global -> shared copy (L2 only); zero-filled when !valid. K/V keep the default L2
 * policy: every query tile of a request re-reads them. */
__device__ __forceinline__ void kva__pf_cp16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

/* The soft cap's tanh in the 16-bit kernels: one MUFU.TANH (relative error <= 2^-10.99, saturating
 * to +-1 at +-inf) instead of kva__tanh_accurate's EX2 + RCP on the unit the softmax's EX2 already
 * queues on: 16k causal d128 with a cap, 5575 -> 4487 us (H200). Its error is below what the
 * 16-bit P and V roundings already put in the output (the f16/bf16 tolerances hold); the f32
 * kernel keeps kva__tanh_accurate. */
__device__ __forceinline__ float kva__pf_tanh_fast(float x) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(x));
    return t;
}

/* x, or NaN where x is +-inf (an overflowed dot product, which must not pass for a mask):
 * 0 * x + x by one FMA instead of a compare and a select (asm: kept as written under fast math).
 * The masks of this kernel (but its wgmma d128 build) and of the Hopper one use it. */
__device__ __forceinline__ float kva__pf_nan_if_inf(float x) {
    float y;
    asm("fma.rn.f32 %0, %1, %2, %2;\n" : "=f"(y) : "f"(0.0f), "f"(x));
    return y;
}

/* Register fences: an empty asm that claims to read and write each value, so the compiler
 * keeps accesses to wgmma accumulators and operands on the right side of the wait. */
template <int N>
__device__ __forceinline__ void kva__pf_fence_regs(float *r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void kva__pf_fence_regs_u(uint32_t *r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
/* V's descriptor offsets (N-major, 128-byte swizzle): LBO between 64-dim blocks, SBO between
 * 8-key groups. */
#ifndef KVA__PF_V_SWAP
#define KVA__PF_V_LBO(BN) ((BN) * 128)
#define KVA__PF_V_SBO(BN) 1024
#else
#define KVA__PF_V_LBO(BN) 1024
#define KVA__PF_V_SBO(BN) ((BN) * 128)
#endif

/* What a block learns about its work item before streaming. */
typedef struct kva__pf_item {
    int w, b;
    int key_beg, key_end, kv_len, kv_beg;
    int q_row0, q_tokens, q_pos0;
} kva__pf_item;

/* The epilogue's global writes for one output row of a lane (query token t of the item, head qh):
 * O / l as T into o, or (a split item) the f32 partial and its LSE into the plan's workspace. o
 * holds the lane's accumulator fragment: columns d0, d0 + 1 of each 8-column block dt in
 * o[dt][2 h], o[dt][2 h + 1] (h: the row's half of the 16-row fragment). Columns past the head dim
 * are padding and not written. */
template <typename T, int DT>
__device__ __forceinline__ void kva__pf_store_row(const kva__prefill_args &a, const kva__pf_item &it, bool split,
                                                  int t, int qh, int d0, int lane, const float (&o)[DT][4], int h,
                                                  float inv, float lse) {
    const int Hq = a.num_qo_heads;
    if (!split) {
        T *orow = (T *)a.o + (int64_t)(it.q_row0 + t) * a.o_st + (int64_t)qh * a.o_sh + d0;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            if (dt * 8 < a.head_dim)
                *reinterpret_cast<uint32_t *>(orow + dt * 8) = kva__pack2<T>(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
        if (a.lse && (lane & 3) == 0) a.lse[(int64_t)(it.q_row0 + t) * Hq + qh] = lse;
    } else {
        const int64_t prow = (int64_t)it.w * a.rows_per_work + (int64_t)t * Hq + qh;
        float *orow = a.partial_o + prow * a.head_dim + d0;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            if (dt * 8 < a.head_dim)
                *reinterpret_cast<float2 *>(orow + dt * 8) = make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
        if ((lane & 3) == 0) a.partial_lse[prow] = lse;
    }
}

/* Reads work item w (its index in the plan) of the plan or of the dense call. */
__device__ __forceinline__ void kva__pf_load_record(const kva__prefill_args &a, int w, kva__pf_item &it) {
    it.w = w;
    if (a.records) {
        const int4 r0 = __ldg(a.records + 2 * it.w), r1 = __ldg(a.records + 2 * it.w + 1);
        it.b = r0.x;
        it.key_beg = r0.y;
        it.key_end = r0.z;
        it.kv_len = r0.w;
        it.kv_beg = r1.x;
        if (a.decode_records) { /* (the rest of a decode record is its merge range) */
            it.q_row0 = it.b;
            it.q_tokens = 1;
            it.q_pos0 = it.kv_len - 1;
        } else {
            it.q_row0 = r1.y;
            it.q_tokens = r1.z;
            it.q_pos0 = r1.w;
        }
    } else {
        it.b = 0;
        it.key_beg = 0;
        it.key_end = a.dense_kv_len;
        it.kv_len = a.dense_kv_len;
        it.kv_beg = 0;
        /* tiles aligned to the end, the partial one first (kva__qo_tile_span, planner.h; the
         * dense launch's num_work is the tile count) */
        const int end = a.dense_qo_len - (a.num_work - 1 - it.w) * a.qo_tile;
        it.q_row0 = end - a.qo_tile > 0 ? end - a.qo_tile : 0;
        it.q_tokens = end - it.q_row0;
        it.q_pos0 = a.dense_kv_len - a.dense_qo_len + it.q_row0;
    }
}

/* Reads work item `i` in launch order (the plan's last item first: under a causal mask a
 * request's later query tiles see more keys); false past the end. */
__device__ __forceinline__ bool kva__pf_load_item(const kva__prefill_args &a, int i, kva__pf_item &it) {
    const int num_work = a.num_work >= 0 ? a.num_work : __ldg(a.num_work_dev);
    if (i >= num_work) return false;
    kva__pf_load_record(a, num_work - 1 - i, it);
    return true;
}

/* A variant's score modifier (cuda_common.cuh, KVA_SCORE_MOD) on a key tile's scores sc[mt][nt][e]
 * of this thread's rows row0 + mt * 16 + 8 * (e / 2), after the cap and the masks: scores into
 * natural-log units, then the modifier on each visible one. It is called for every slot in one
 * straight-line block, so what it loads per row or per key is loaded once, not per score (a load
 * under a per-score condition cannot be hoisted: in tiles with masks that form ran the soft cap
 * as a snippet 33% behind the built-in cap on 32 x 512 causal rows, H200 2026-11-29). Tiles
 * without masks -- most of them -- pass every slot as it is; padding rows (>= rows: zero Q,
 * output discarded) pass a real query's position (q_last) and a real head, so the function only
 * ever sees positions and heads inside the request. There a dot product that overflowed to -inf
 * reaches the modifier as -inf and weighs 0, as an overflowed score beside finite ones does in
 * the built-in path. In tiles with masks (the cap loop made an overflow NaN, so -inf is a mask)
 * a masked slot passes a key its row sees instead -- its own, clamped into the row's visible
 * range of [lo, hi), the keys any row of the item may see -- and a score of 0, and its result is
 * dropped; a padding row, or a row that sees none of the item's keys, makes no call (a per-row
 * branch). Also used by prefill_hopper.cuh (MT = 1). */
template <int MT, int NT>
__device__ __forceinline__ void kva__pf_apply_score_mod(const kva__prefill_args &a, float (*sc)[NT][4], bool need_mask,
                                                        bool capped, int key0, int q_pos0, int q_last, int row0,
                                                        int rows, int kh, int g, int lane, int lo, int hi) {
    const float to_nat = capped ? KVA__PF_LN2 : a.scale_log2 * KVA__PF_LN2;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + mt * 16 + 8 * h, t = r / g;
            const int p = q_pos0 + t, qh = kh * g + (r - t * g);
            if (!need_mask) {
                const int pm = p < q_last ? p : q_last;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e)
                        sc[mt][nt][e] = KVA_SCORE_MOD(sc[mt][nt][e] * to_nat, pm,
                                                      key0 + nt * 8 + 2 * (lane & 3) + (e & 1), qh, a.mod_user);
            } else {
                /* the keys row p sees: [k_lo, k_hi) (64-bit: a window reaching below key 0) */
                const int64_t wl = a.window_left >= 0 ? (int64_t)p - a.window_left : (int64_t)lo;
                const int k_lo = wl > (int64_t)lo ? (int)wl : lo;
                const int k_hi = a.causal && p + 1 < hi ? p + 1 : hi;
                if (r < rows && k_lo < k_hi) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            const float x = sc[mt][nt][e] * to_nat;
                            const int key = key0 + nt * 8 + 2 * (lane & 3) + (e & 1);
                            const int kc = key < k_lo ? k_lo : key >= k_hi ? k_hi - 1 : key;
                            const bool seen = x != -INFINITY;
                            const float y = KVA_SCORE_MOD(seen ? x : 0.0f, p, kc, qh, a.mod_user);
                            sc[mt][nt][e] = seen ? y : -INFINITY;
                        }
                }
            }
        }
}

/* wgmma kernels of 8 warps at head_dim <= 128 fit two blocks (16 warps) per SM in 128 registers
 * (the 12-warp d64 one: one block) */
template <typename T, int D, int MT, int WARPS, int BN_, bool WG>
__global__ void __launch_bounds__(32 * WARPS, (WG && D <= 128 && WARPS <= 8) ? 2 : 1)
    kva__prefill_kernel(const __grid_constant__ kva__prefill_args a) {
    using G = kva__prefill_geom<T, D, MT, WARPS, BN_, WG>;
    static_assert(!WG || MT == 1, "a warpgroup's 64 rows are 16 per warp");
    constexpr int THREADS = G::THREADS;
    constexpr int BN = G::BN, RB = G::RB, CPR = G::CPR, ROWS = G::ROWS;
    constexpr int NT = BN / 8;   /* n8 tiles of S per m16 tile */
    constexpr int DT = D / 8;    /* n8 tiles of O per m16 tile */
    extern __shared__ __align__(128) unsigned char smem[];
    kva__pdl_trigger(); /* (the merge kernel may take its place as blocks end) */

    kva__pf_item it;
    if (!kva__pf_load_item(a, blockIdx.x, it)) return;
    const int kh = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = a.group;
    const int rows = it.q_tokens * g;
    const bool split = it.key_beg > 0 || it.key_end < it.kv_len;

    /* Keys any row of the tile may see. */
    int lo = it.key_beg, hi = it.key_end;
    const int q_last = it.q_pos0 + it.q_tokens - 1;
    if (a.causal && hi > q_last + 1) hi = q_last + 1;
    /* (64-bit: positions are negative when a request has more queries than keys, and a huge
     * window must not wrap) */
    if (a.window_left >= 0 && (int64_t)lo < (int64_t)it.q_pos0 - a.window_left) lo = it.q_pos0 - a.window_left;
    const int n_tiles = hi > lo ? (hi - lo + BN - 1) / BN : 0;

    const uint32_t smem_raw = kva__smem_addr(smem);
    const uint32_t q_s = WG ? (smem_raw + 1023u) & ~1023u : smem_raw;
    unsigned char *smem_base = smem + (q_s - smem_raw);
    const uint32_t kv_s = q_s + G::Q_BYTES; /* stage s: K at kv_s + s*2*TILE, V after it */

    /* ---- Q tile -> shared (rows past the tile are zero) ---- */
    {
        const T *qb = (const T *)a.q;
#pragma unroll
        for (int j = 0; j < ROWS * CPR / THREADS; ++j) {
            const int i = tid + j * THREADS, r = i / CPR, c = i % CPR;
            const bool ok = r < rows && c * 8 < a.head_dim; /* (zeros past the head dim) */
            const int t = ok ? r / g : 0, hh = ok ? r - t * g : 0;
            const T *src = qb + (int64_t)(it.q_row0 + t) * a.q_st + (int64_t)(kh * g + hh) * a.q_sh + c * 8;
            kva__pf_cp16(q_s + kva__pf_tile_off<RB, ROWS, WG>(r, c), ok ? (const void *)src : a.q, ok);
        }
    }

    /* ---- K/V tile copies ----
     * The element offsets of a tile's key rows are computed once per key, by thread `key % BN`
     * (a page-id load and a division by the page size done with a multiply), into a table in
     * shared memory two tiles deep; every thread then copies chunk tid % CPR of rows
     * tid / CPR + p * RSTEP from the table. The page id of tile j + 2 is loaded at the start of
     * iteration j and stored after the softmax, so its latency hides behind QK^T. */
    constexpr int RSTEP = THREADS / CPR; /* rows covered per pass (CPR <= 32) */
    constexpr int PASSES = (BN + RSTEP - 1) / RSTEP; /* (12 warps at d64: 48 rows, the last pass half) */
    const int my_c = tid % CPR, my_r = tid / CPR;
    const bool my_c_real = my_c * 8 < a.head_dim; /* my chunks are zeros past the head dim */
    const T *kbase = (const T *)a.k + (int64_t)kh * a.k_sh + my_c * 8;
    const T *vbase = (const T *)a.v + (int64_t)kh * a.v_sh + my_c * 8;
    int64_t *offs = reinterpret_cast<int64_t *>(smem_base + G::Q_BYTES + G::STAGES * 2 * G::TILE_BYTES);
    const bool paged = a.page_indices != NULL;
    /* key -> (page entry, slot) with the planner's magic divisor; the page id is loaded here */
    auto row_source = [&](int key, int &pid, int &slot) {
        const int pg = (int)(((uint64_t)(uint32_t)key * a.page_div_m) >> a.page_div_s);
        slot = key - pg * a.page_size;
        pid = __ldg(a.page_indices + it.kv_beg + pg);
    };
    /* writes the table entries of key `key` of the tile in table slot `ts` */
    auto put_offsets = [&](int ts, int key, int pid, int slot) {
        int64_t ko = -1, vo = -1;
        if (key < hi) {
            if (paged) {
                const int64_t base = (int64_t)pid * a.page_stride;
                ko = base + (int64_t)slot * a.k_st;
                vo = base + (int64_t)slot * a.v_st;
            } else {
                ko = (int64_t)(it.kv_beg + key) * a.k_st;
                vo = (int64_t)(it.kv_beg + key) * a.v_st;
            }
        }
        offs[(ts * 2) * BN + tid] = ko;
        offs[(ts * 2 + 1) * BN + tid] = vo;
    };
    auto fill_now = [&](int j) { /* synchronous fill of tile j (prologue) */
        if (tid < BN) {
            const int key = lo + j * BN + tid;
            int pid = 0, slot = 0;
            if (paged && key < hi) row_source(key, pid, slot);
            put_offsets(j & 1, key, pid, slot);
        }
    };
    /* dst offsets of my chunks: rows my_r + p*RSTEP, swizzled (compile-time per p) */
    auto issue = [&](const T *base, int which, int j, uint32_t dst) {
        const int64_t *tab = offs + ((j & 1) * 2 + which) * BN;
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            const int r = my_r + p * RSTEP;
            if (BN % RSTEP != 0 && r >= BN) break;
            const int64_t off = tab[r];
            const bool ok = off >= 0 && my_c_real;
            kva__pf_cp16(dst + kva__pf_tile_off<RB, BN, WG>(r, my_c), ok ? (const void *)(base + off) : a.k, ok);
        }
    };
    auto k_stage = [&](int s) { return kv_s + s * 2 * G::TILE_BYTES; };
    auto v_stage = [&](int s) { return kv_s + s * 2 * G::TILE_BYTES + G::TILE_BYTES; };

    if (n_tiles > 0) fill_now(0);
    if (n_tiles > 1) fill_now(1);
    __syncthreads();
    if (n_tiles > 0) issue(kbase, 0, 0, k_stage(0));
    kva__cp_async_commit(); /* group: Q + K[0] */
    if (n_tiles > 0) issue(vbase, 1, 0, v_stage(0));
    kva__cp_async_commit(); /* group: V[0] */

    /* ldmatrix lane addresses: rows of a fragment are 8-aligned, so row & 7 == lane & 7 and the
     * swizzled chunk of k-step kd is (lane's chunk ^ row & 7) ^ 2*kd: one XOR per load. */
    const int l7 = lane & 7;
    const uint32_t q_lane = (uint32_t)((lane & 15) * RB + ((((lane >> 4) & 1) ^ l7) << 4));
    const uint32_t k_lane = (uint32_t)((((lane >> 4) << 3) + l7) * RB + ((((lane >> 3) & 1) ^ l7) << 4));
    const uint32_t v_lane = (uint32_t)((l7 + (((lane >> 3) & 1) << 3)) * RB + (((lane >> 4) ^ l7) << 4));

    /* ---- per-thread state: rows lane/4 and lane/4 + 8 of each of my m16 tiles ---- */
    float o_acc[MT][DT][4];
    float m_st[MT][2], l_st[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_acc[mt][dt][e] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            m_st[mt][h] = -INFINITY;
            l_st[mt][h] = 0.0f;
        }
    }
    const int row_base = warp * 16 * MT;

    for (int j = 0; j < n_tiles; ++j) {
        const int s = j & 1;
        const int key0 = lo + j * BN;
        if (j + 1 < n_tiles) issue(kbase, 0, j + 1, k_stage(s ^ 1));
        kva__cp_async_commit(); /* K[j+1] */
        /* tile j+2's page id: loaded now, used after the softmax */
        const int fkey = lo + (j + 2) * BN + tid;
        const bool filler = tid < BN && j + 2 < n_tiles;
        int f_pid = 0, f_slot = 0;
        if (filler && paged && fkey < hi) row_source(fkey, f_pid, f_slot);
        kva__cp_async_wait<2>(); /* K[j] (and Q) landed for this thread */
        if constexpr (WG) kva__fence_proxy_async(); /* ... and is visible to the tensor cores */
        __syncthreads();

        /* ---- S = Q K^T ---- */
        float sc[MT][NT][4];
        if constexpr (!WG) /* wgmma's first step overwrites the accumulators (scale-d = 0) */
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[mt][nt][e] = 0.0f;
        const uint32_t ks = k_stage(s);
        if constexpr (WG) {
            /* one m64n64k16 per 16 dims: A = this warpgroup's 64 Q rows, B = the 64 keys */
            const uint32_t q_wg = q_s + (uint32_t)(warp >> 2) * 64 * 128;
            kva__wgmma_fence();
#pragma unroll
            for (int kd = 0; kd < D / 16; ++kd) {
                const uint32_t blk = (uint32_t)(kd >> 2); /* 64-dim block; 16 dims = 32 bytes in it */
                const uint64_t da = kva__wgmma_desc(q_wg + blk * ROWS * 128 + (kd & 3) * 32, 16, 1024);
                const uint64_t db = kva__wgmma_desc(ks + blk * BN * 128 + (kd & 3) * 32, 16, 1024);
                kva__wgmma_ss<T, BN>(&sc[0][0][0], da, db, kd > 0);
            }
            kva__wgmma_commit();
            kva__wgmma_wait<0>();
            kva__pf_fence_regs<MT * NT * 4>(&sc[0][0][0]);
        } else {
#pragma unroll
            for (int kd = 0; kd < D / 16; ++kd) {
                uint32_t qa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    kva__ldmatrix_x4(qa[mt], q_s + (row_base + mt * 16) * RB + (q_lane ^ (kd << 5)));
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    uint32_t kb[4];
                    kva__ldmatrix_x4(kb, ks + np * 16 * RB + (k_lane ^ (kd << 5)));
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        kva__mma16816<T>(sc[mt][2 * np], qa[mt], kb[0], kb[1]);
                        kva__mma16816<T>(sc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
                    }
                }
            }

        }

        /* ---- masks only where a tile crosses a boundary; raw scores stay unscaled (the scale
         * is positive, so the row max commutes with it) and exp2(s * scale - m) is one FFMA ---- */
        const bool need_mask = key0 + BN > hi || (a.causal && key0 + BN - 1 > it.q_pos0) ||
                               (a.window_left >= 0 && (int64_t)key0 < (int64_t)q_last - a.window_left);
        const bool capped = a.cap_log2 > 0.0f;
        /* The mask as compares against immediates (below), except in the wgmma kernel at d128,
         * where its bounds spilled registers (H200, bench/NOTES.md v6.32: mma.sync +2-7% on every
         * d64 / d128 row, wgmma d64 +1-6%, wgmma d128 -2%): there each key's own compares. */
        constexpr bool IMM_MASK = !(WG && D == 128);
        /* With a variant (KVA__HAS_SCORE_MOD) scores reach the softmax in natural-log units (the
         * modifier's), which its FFMA takes to log2 units. */
        const float mul = KVA__HAS_SCORE_MOD ? KVA__PF_LOG2E : capped ? 1.0f : a.scale_log2;
        if (capped || need_mask) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    /* query position of this row (recomputed here: registers are scarce) */
                    const int p = it.q_pos0 + (row_base + mt * 16 + (lane >> 2) + 8 * h) / g;
                    if constexpr (!IMM_MASK) {
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                            for (int e = 2 * h; e < 2 * h + 2; ++e) {
                                float x = sc[mt][nt][e];
                                if (capped)
                                    x = a.cap_log2 * kva__pf_tanh_fast(x * a.cap_inv_scale);
                                else if (x == -INFINITY)
                                    x = NAN;
                                if (need_mask) {
                                    const int key = key0 + nt * 8 + 2 * (lane & 3) + (e & 1);
                                    if (key >= hi || (a.causal && key > p) ||
                                        (a.window_left >= 0 && (int64_t)key < (int64_t)p - a.window_left))
                                        x = -INFINITY;
                                }
                                sc[mt][nt][e] = x;
                            }
                        continue; /* (two loops, not one with constexpr tests inside: each form
                                   * compiles to the code that was measured for it) */
                    }
                    /* the keys it sees as offsets from my lane's first key of the tile, base:
                     * score (nt, e) is key base + c with c = 8 nt + e % 2 a constant, visible
                     * where lo_c <= c < hi_c -- two compares against an immediate (32-bit: the
                     * causal bound is clamped into [key0, hi] first, the window's, rarely set,
                     * into [-1, BN]) */
                    const int base = key0 + 2 * (lane & 3);
                    const int hi_k = a.causal ? min(hi, max(p + 1, key0)) : hi;
                    const int hi_c = min(hi_k - base, BN);
                    int lo_c = -1;
                    if (a.window_left >= 0) {
                        const int64_t d = (int64_t)p - a.window_left - base;
                        lo_c = d > BN ? BN : d < -1 ? -1 : (int)d;
                    }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e) {
                        float x = sc[mt][nt][e];
                        /* an overflowed dot product: capped (tanh saturates, as in the float64
                         * reference), or NaN without a cap -- never a mask */
                        if (capped)
                            x = a.cap_log2 * kva__pf_tanh_fast(x * a.cap_inv_scale);
                        else
                            x = kva__pf_nan_if_inf(x);
                        const int c = nt * 8 + (e & 1);
                        if (need_mask && !(c >= lo_c && c < hi_c)) x = -INFINITY;
                        sc[mt][nt][e] = x;
                    }
                }
        }
        if constexpr (KVA__HAS_SCORE_MOD)
            kva__pf_apply_score_mod<MT, NT>(a, sc, need_mask, capped, key0, it.q_pos0, q_last,
                                            row_base + (lane >> 2), rows, kh, g, lane, lo, hi);

        /* ---- online softmax in log2 units (a row lives in the 4 lanes of a quad) ---- */
        float alpha_r[MT][2];
        bool rescale = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * h], sc[mt][nt][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float ms = __fmul_rn(mx, mul);
                /* every visible score of the tile row left f32 range below (-inf after scaling;
                 * without masks every key is visible, so a raw -inf is one too -- except with a
                 * variant, whose -inf is a mask and whose raw -inf became NaN above): the row's
                 * max remembers it as -FLT_MAX, which the epilogue turns into NaN */
                if (ms == -INFINITY && (mx != -INFINITY || (!KVA__HAS_SCORE_MOD && !need_mask))) ms = -3.402823466e38f;
                const float m_new = fmaxf(m_st[mt][h], ms);
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                const float alpha = exp2f(m_st[mt][h] - m_use);
                m_st[mt][h] = m_new;
                /* p = exp2(s * scale - m) as one FFMA: the product is not rounded, so it differs
                 * from the rounded max by up to half an ulp of m, a common factor of all p that
                 * cancels while it is small (|m| < 2^28: at most 2^4); the epilogue makes rows
                 * whose max is beyond that NaN. */
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const float p0 = exp2f(fmaf(sc[mt][nt][2 * h], mul, -m_use));
                    const float p1 = exp2f(fmaf(sc[mt][nt][2 * h + 1], mul, -m_use));
                    sc[mt][nt][2 * h] = p0;
                    sc[mt][nt][2 * h + 1] = p1;
                    sum += p0 + p1;
                }
                l_st[mt][h] = l_st[mt][h] * alpha + sum;
                alpha_r[mt][h] = alpha;
                rescale |= alpha != 1.0f;
            }
        /* O is rescaled only when some row's max moved: after the first tiles of a long row it
         * rarely does, and skipping is exact (alpha == 1). */
        if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
                    o_acc[mt][dt][0] *= alpha_r[mt][0];
                    o_acc[mt][dt][1] *= alpha_r[mt][0];
                    o_acc[mt][dt][2] *= alpha_r[mt][1];
                    o_acc[mt][dt][3] *= alpha_r[mt][1];
                }
        }
        if (filler) put_offsets(j & 1, fkey, f_pid, f_slot);

        if (j + 1 < n_tiles) issue(vbase, 1, j + 1, v_stage(s ^ 1));
        kva__cp_async_commit(); /* V[j+1] */
        kva__cp_async_wait<2>(); /* V[j] landed */
        if constexpr (WG) kva__fence_proxy_async();
        __syncthreads();

        /* ---- O += P V ---- */
        const uint32_t vs = v_stage(s);
        if constexpr (WG) {
            /* P from registers (the accumulator layout of S is the A-fragment layout), V as an
             * N-major operand: 16 keys x D dims per instruction, 64-dim blocks BN*128 bytes apart */
            uint32_t pa[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                pa[kk][0] = kva__pack2<T>(sc[0][2 * kk][0], sc[0][2 * kk][1]);
                pa[kk][1] = kva__pack2<T>(sc[0][2 * kk][2], sc[0][2 * kk][3]);
                pa[kk][2] = kva__pack2<T>(sc[0][2 * kk + 1][0], sc[0][2 * kk + 1][1]);
                pa[kk][3] = kva__pack2<T>(sc[0][2 * kk + 1][2], sc[0][2 * kk + 1][3]);
            }
            kva__pf_fence_regs<MT * DT * 4>(&o_acc[0][0][0]);
            kva__wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                const uint64_t db = kva__wgmma_desc(vs + kk * 16 * 128, KVA__PF_V_LBO(BN), KVA__PF_V_SBO(BN));
                kva__wgmma_rs<T, D>(&o_acc[0][0][0], pa[kk], db);
            }
            kva__wgmma_commit();
            kva__wgmma_wait<0>();
            kva__pf_fence_regs<MT * DT * 4>(&o_acc[0][0][0]);
            kva__pf_fence_regs_u<BN / 4>(&pa[0][0]);
        } else {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    pa[mt][0] = kva__pack2<T>(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
                    pa[mt][1] = kva__pack2<T>(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
                    pa[mt][2] = kva__pack2<T>(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
                    pa[mt][3] = kva__pack2<T>(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    uint32_t vb[4];
                    kva__ldmatrix_x4_trans(vb, vs + kk * 16 * RB + (v_lane ^ (dp << 5)));
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        kva__mma16816<T>(o_acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
                        kva__mma16816<T>(o_acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
                    }
                }
            }
        }
        /* No barrier here: stage s (and table slot j & 1, rewritten before the next iteration's
         * second barrier) is refilled only after the next iteration's first barrier, which every
         * warp reaches after finishing this tile. */
    }
    kva__cp_async_wait<0>();

    /* ---- epilogue: normalise, write o + lse, or the partial state ---- */
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_st[mt][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int r = row_base + mt * 16 + (lane >> 2) + 8 * h;
            if (r >= rows) continue;
            const int t = r / g, qh = kh * g + (r - t * g);
            /* A row max out of the range above (scores beyond ~1.9e8 in magnitude, +inf, or
             * all visible scores out of f32 range: -FLT_MAX) ends NaN, never empty or finite and
             * wrong (kvattn.h, kva_attn_params). -inf is a row that saw no key. */
            if (!(fabsf(m_st[mt][h]) < 268435456.0f) && m_st[mt][h] != -INFINITY) l = NAN;
            const float inv = kva__softmax_inv(l);
            const float lse = kva__softmax_lse(m_st[mt][h], l);
            kva__pf_store_row<T, DT>(a, it, split, t, qh, 2 * (lane & 3), lane, o_acc[mt], h, inv, lse);
        }
}

/* Instantiates the kernels of one 16-bit element type and the lookup the chooser calls:
 * (head dim, rows) -> (MT, WARPS). 128 rows: 4 warps x 32 rows at d <= 128 (26 FLOP per shared
 * byte); 8 warps x 16 rows at d = 256, where 32 rows of O do not fit in registers and 4 warps
 * alone cannot hide the latency. 64 rows: 4 warps x 16 rows. */
#define KVA__PF_CASE(T, D, MT, W, BN, WG)                                                      \
    *smem = kva__prefill_geom<T, D, MT, W, BN, WG>::SMEM;                                      \
    *threads = 32 * W;                                                                         \
    return (const void *)kva__prefill_kernel<T, D, MT, W, BN, WG>;
#define KVA__PREFILL_INSTANTIATE(T, NAME)                                                      \
    const void *NAME(int head_dim, int rows, int *smem, int *threads) {                        \
        switch (head_dim * 1000 + rows) { /* rows 999: KVA__PREFILL_ROWS_HOPPER */           \
        case 64128: KVA__PF_CASE(T, 64, 2, 4, 64, false)                                       \
        case 64064: KVA__PF_CASE(T, 64, 1, 4, 64, false)                                       \
        case 128128: KVA__PF_CASE(T, 128, 2, 4, 64, false)                                     \
        case 128064: KVA__PF_CASE(T, 128, 1, 4, 64, false)                                     \
        case 256128: KVA__PF_CASE(T, 256, 1, 8, 64, false)                                     \
        case 256064: KVA__PF_CASE(T, 256, 1, 4, 64, false)                                     \
        /* Hopper (sm_90a): warpgroups of 64 rows on wgmma, as many as the Hopper kernel's */  \
        case 64999: KVA__PF_CASE(T, 64, 1, KVA__PREFILL_WG_WARPS(64), 64, true)                \
        case 128999: KVA__PF_CASE(T, 128, 1, 8, 64, true)                                      \
        case 256999: KVA__PF_CASE(T, 256, 1, 8, 64, true)                                      \
        default: return NULL;                                                                  \
        }                                                                                      \
    }

#endif /* KVA_PREFILL_KERNEL_CUH */
