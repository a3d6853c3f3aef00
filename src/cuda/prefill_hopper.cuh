/*
 * prefill_hopper.cuh -- the Hopper (sm_90a) prefill kernel: FlashAttention-3-style warp
 * specialisation. Same work items, masks, softmax numerics, outputs and split-KV partials as the
 * tensor-core kernel of prefill_kernel.cuh (whose wgmma variant remains the fallback for K/V
 * strides a tensor map cannot describe); what changes is who moves data and when.
 *
 * Work split
 *   grid  = persistent: one block per SM (the shared memory of the K/V stages)
 *           walks (KV head, work item) pairs, head-major, so the blocks on one head share its
 *           K/V through L2; after its first pair a block takes the next one free (a ticket from
 *           the plan's workspace), so blocks that finish early take more; the producer streams
 *           the next item's tiles while the consumers finish the current one.
 *   block = ROWS packed query rows (token, GQA head) as in prefill_kernel.cuh: 128 at d128 and
 *           d256, 192 at d64 (a third consumer warpgroup: the softmax is latency-bound there);
 *           a producer warpgroup and one consumer warpgroup per 64 rows (384 or 512 threads):
 *     producer  (warpgroup 0, 72 registers; 32 with three consumers): warp 1 (the scheduler) draws the tickets, hands
 *               the items' records to the other warps and loads a whole item's Q by tensor
 *               copies; warp 2 writes the O the consumers staged by tensor copies (see "who hands
 *               what to whom" in the kernel); warps 0 and 3 stream the K and the V tiles of
 *               BN keys into a ring of stages with tensor copies (TMA) that complete on "full"
 *               mbarriers, and wait on "empty" mbarriers before reusing a stage. Every map's
 *               inner dim is the caller's head dim (copies past it land zeros: a head dim
 *               padded to D), one copy per 64-element column block. Ragged K/V: a 3-d copy
 *               (head dim, token, head) per tile and column block. Paged K/V: a 4-d copy (head
 *               dim, slot, head, page) per box of `box_rows` keys and column block (box_rows
 *               divides the page size and BN, so a box never crosses a page); each warp's lanes
 *               load page ids and issue boxes in parallel. Out-of-range V rows of the last tile are zeroed
 *               (0 * inf would poison P V).
 *     consumers (warpgroups 1 .. CWG, 216 registers; 160 with three): 64 rows each. Per key tile j:
 *               S_j = Q K_j^T (wgmma from shared memory) is issued together with
 *               O += P_{j-1} V_{j-1} (P from registers); the softmax of S_j runs while the
 *               tensor cores finish P V; then O is rescaled and P_j packed. At d <= 128 the
 *               consumers take turns issuing ("ping-pong", a ring), at d256 they issue independently
 *               (what measured faster for each); either way one's softmax overlaps the others'
 *               matrix products. At d <= 128 a work item's last P V is issued with the next
 *               item's S_0 (its Q loaded into another buffer during this item, where a tensor
 *               copy brings it: a whole item).
 *   out   = as prefill_kernel.cuh: O / l and LSE, or f32 partials for a split work item.
 *
 * Per key tile and block: bytes = 2 * BN * D * 2 from L2/DRAM (64 KB at D = 128, BN = 128);
 * FLOPs = 4 * ROWS * BN * D (8.4 MFLOP at d128). Registers per consumer thread: O = D / 2 floats,
 * S = BN / 2 floats, P = BN / 4 words.
 */
#ifndef KVA_PREFILL_HOPPER_CUH
#define KVA_PREFILL_HOPPER_CUH

#include "prefill_kernel.cuh"
#include "hopper_sync.cuh"
#include "prefill_hopper_trace.cuh"

/* K/V stages in flight: as many as fit beside the Q buffers in 227 KB (a tile from L2 takes
 * about as long to land as a tile takes to compute). */
#ifndef KVA__HP_STAGES_D128
#define KVA__HP_STAGES_D128 2
#endif
#define KVA__HP_STAGES(D) ((D) <= 64 ? 4 : (D) <= 128 ? KVA__HP_STAGES_D128 : 2)

/* How far (log2 units) a row's running max may lag the true one before O is rescaled: P then
 * stays <= 2^8 (2^10 with the exponent FMA's rounding), well inside f16 and f32
 * (FlashAttention-4's threshold; see the softmax for the range where it applies). With random
 * inputs a tile raises some row's max of a warp in ~40% of a 16k row's tiles, each paying D / 2
 * FMULs on the path between P V and the next issue; with the slack, almost none after the
 * first. 0: rescale whenever the max rises (-D for comparisons). */
#ifndef KVA__HP_RESCALE_SLACK
#define KVA__HP_RESCALE_SLACK 8
#endif

/* The built-in ALiBi variant (variant_alibi.cuh) declares itself with KVA_VARIANT_ALIBI_SLOPES
 * (and the modifier must be its function, kva_alibi: KVA__FN_IS_KVA_ALIBI, variant_compile.c):
 * its bias slope[head] * (key - query) then costs the softmax no per-score work. Split as
 * slope * (key - kb) + slope * (kb - query) for a tile starting at key kb, the first term comes
 * from the tensor cores -- one more k16 step of Q K^T, whose A operand holds each row's slope (in
 * raw-score units, as three 16-bit pieces whose sum is the f32 value to ~2^-24; a row with
 * |slope / scale| >= 2^14, beyond f16's range, adds its bias with FFMAs) and whose B operand is a
 * constant tile of column offsets 0 .. BN-1 in shared memory (exact in 16 bits) -- and the second
 * is a per-row constant of the tile, folded into the exponent's FFMA and the row max. With a soft
 * cap the bias must follow the cap, so the slopes stay 0 there and each score takes one FFMA
 * after the cap (an immediate column offset), the lane's base going into its partial row max and
 * the exponent's offset; the rows of out-of-range slopes take the same FFMA on their raw scores
 * (see alibi_rows and the softmax). Measured (v6.29): the k-step costs +7.5% per key tile at
 * d128, the FFMA form for every row (-DKVA__HP_ALIBI_TENSOR=0) +11.6%.
 * The column-offset tile is unswizzled, 16 bytes per row ([j, j, j, 0, 0, 0, 0, 0]; k-columns
 * 8-15 read the same rows, their A pieces zero): 2 KB at BN = 128. Until v6.40 it was BN rows of
 * one 128-byte swizzled row block (16 KB), which cost native ALiBi the library's third Q buffer
 * (+2-5% on short rows, v6.33). Even 2 KB does not fit beside three Q buffers at d128 (1824
 * bytes were left), so a native ALiBi build puts its mbarriers in the bytes below its aligned
 * base when there are enough of them (see bars in the kernel; G::SMEM). Two m64n64k16 steps
 * over a 1 KB tile (the second adding 64 slopes through more A columns) were tried: ptxas then
 * serialises the wgmma pipeline ("C7511 ... insufficient register resources"; ALiBi +55%). */
#if defined(KVA_VARIANT_ALIBI_SLOPES) && defined(KVA__FN_IS_KVA_ALIBI)
#define KVA__HP_ALIBI true
#else
#define KVA__HP_ALIBI false
#endif
/* A variant's source may ask for the consumers' ping-pong turns by defining KVA_VARIANT_PINGPONG
 * (kvattn.h, kva_variant): a modifier with heavy work per score (a tanh) gains from them -- the
 * soft cap as a snippet +4.5% -> +3.2% over the built-in cap (H200, 2026-11-25) -- a light one
 * loses (identity +9% -> +12%), so a generic modifier runs without them unless it asks. */
#ifdef KVA_VARIANT_PINGPONG
#define KVA__VARIANT_PINGPONG true
#else
#define KVA__VARIANT_PINGPONG false
#endif
/* (-DKVA__HP_ALIBI_TENSOR=0: every row's bias by an FFMA per score, no extra k-step) */
#ifndef KVA__HP_ALIBI_TENSOR
#define KVA__HP_ALIBI_TENSOR 1
#endif

/* Q buffers of a kernel with the cross-item tail (G::XITEM; KVA__HP_QBUFS, prefill_kernels.h): item
 * m's Q goes to buffer m % Q_BUFS, which the store warp frees once item m - Q_BUFS's staged O is
 * written. With two, a short item's tail waited for the next Q: its buffer is freed only after both
 * warpgroups' previous epilogue, the O store's reads (~2200 cycles) and the Q copy's round trip
 * (ncu of 32 x 512 causal d128: that wait was the consumers' largest single stall, 4% of their
 * samples; bench/NOTES.md, v6.33). Native ALiBi builds have as many since v6.40 (see POS_BYTES). */
static_assert(KVA__HP_QBUFS == 2 || KVA__HP_QBUFS == 3, "KVA__HP_QBUFS: 2 or 3 Q buffers");
static_assert(!(KVA__HP_LANE_RECORDS && KVA__HP_SMEM_RECORDS), "KVA__HP_LANE_RECORDS reads the workspace ring: not with KVA__HP_SMEM_RECORDS");

/* Consumer warpgroups at d64 (KVA__HP_CWG_D64, prefill_kernels.h): three (192-row items,
 * FlashAttention-3's choice there), so that three warps' softmaxes share each scheduler against
 * the same tensor work per warp -- the d64 softmax is latency-bound with two (bench/NOTES.md,
 * "d64: where the softmax's cycles go"). */
static_assert(KVA__HP_CWG_D64 == 2 || KVA__HP_CWG_D64 == 3, "KVA__HP_CWG_D64: 2 or 3 consumer warpgroups");

/* (tests only: see G::PLAIN_SMEM; a multiple of 16 below 1024, of which the launch size leaves
 * room for 16: the static_asserts there say so for larger ones) */
#ifndef KVA__HP_TEST_SMEM_SHIFT
#define KVA__HP_TEST_SMEM_SHIFT 0
#endif
static_assert(KVA__HP_TEST_SMEM_SHIFT % 16 == 0 && KVA__HP_TEST_SMEM_SHIFT >= 0 && KVA__HP_TEST_SMEM_SHIFT < 1024,
              "KVA__HP_TEST_SMEM_SHIFT: a multiple of 16 below 1024");

/* the smallest head dim whose O is staged in shared memory for the store warp (see the
 * epilogue; -DKVA__HP_STAGED_MIN_D=128 leaves d64 to the consumers' direct stores, comparisons) */
#ifndef KVA__HP_STAGED_MIN_D
#define KVA__HP_STAGED_MIN_D 64
#endif

template <typename T, int D>
struct kva__hopper_geom {
    static constexpr int CWG = D == 64 ? KVA__HP_CWG_D64 : 2; /* consumer warpgroups, 64 rows each */
    static constexpr int ROWS = 64 * CWG;
    static constexpr int THREADS = 128 * (1 + CWG);
    static constexpr int BN = D <= 128 ? 128 : 64; /* d256: O is 128 registers already */
    static constexpr int STAGES = KVA__HP_STAGES(D);
    static constexpr int CPR = D / 8;               /* 16-byte chunks per row */
    static constexpr int Q_BYTES = ROWS * D * 2;
    static constexpr int TILE_BYTES = BN * D * 2;
    /* registers per thread after reallocation: 128 * producer + 128 * CWG * consumer may not
     * exceed what the launch gave the block (384 x 168 = 64512, 512 x 128 = 65536; a larger
     * request never completes). Two consumer warpgroups: the producer warps' loops fit in 72
     * without spilling, and since v6.28 (the O stores and Q copies moved off the consumers) d256's
     * consumers fit in 216 as well (with 224 / 56 the K/V producer spilled). Three: 32 / 160
     * (d64's consumers used 168 with two; at 160 they spill 156 bytes, at 152 / 40 more;
     * -DKVA__HP_REGS3_P / _C try others, comparisons) */
#ifndef KVA__HP_REGS3_P
#define KVA__HP_REGS3_P 32
#endif
#ifndef KVA__HP_REGS3_C
#define KVA__HP_REGS3_C 160
#endif
    static constexpr int PRODUCER_REGS = CWG == 3 ? KVA__HP_REGS3_P : 72;
    static constexpr int CONSUMER_REGS = CWG == 3 ? KVA__HP_REGS3_C : 216;
    /* (what the launch gives: 64K registers over THREADS, rounded down to a multiple of 8) */
    static_assert(128 * PRODUCER_REGS + 128 * CWG * CONSUMER_REGS <= THREADS * (65536 / THREADS / 8 * 8),
                  "register reallocation exceeds what the launch gives the block");
    /* work records in flight from the scheduler warp to the other warps (slots of 16 words in
     * the workspace, see the kernel and KVA__SCHED_RING; in shared memory with
     * KVA__HP_SMEM_RECORDS) */
    static constexpr int RING = 4;
    /* native ALiBi's column-offset tile (BN rows of 16 bytes, unswizzled; see the top) */
    static constexpr int ALIBI_POS_BYTES = BN * 16;
    static_assert(ALIBI_POS_BYTES % 1024 == 0, "native ALiBi's tile keeps the Q buffers 1024-aligned");
    /* the consumers take turns issuing (see the consumer loop); -DKVA__HP_PINGPONG=0/1 forces it */
#ifdef KVA__HP_PINGPONG
    static constexpr bool PINGPONG = KVA__HP_PINGPONG;
#else
    /* (not with a variant's score modifier unless its source asks (KVA__VARIANT_PINGPONG): its
     * per-score work on the turn-holder's critical path made ALiBi 13% slower at d = 128; native
     * ALiBi: KVA__HP_ALIBI_TURNS, prefill_kernels.h) */
    static constexpr bool PINGPONG =
        D <= 128 && (!KVA__HAS_SCORE_MOD || (KVA__HP_ALIBI && (KVA__HP_ALIBI_TURNS || D <= 64)) || KVA__VARIANT_PINGPONG);
#endif
    /* an item's key tiles walked last to first: with ALiBi the bias grows toward the query, so
     * in key order nearly every tile raised the row max and rescaled O; the nearest tile first
     * sets a max the farther ones rarely pass. -DKVA__HP_REVERSE=0/1 forces it */
#ifdef KVA__HP_REVERSE
    static constexpr bool REVERSE = KVA__HP_REVERSE;
#else
    static constexpr bool REVERSE = KVA__HP_ALIBI;
#endif
    /* the next work item's S_0 issued with this item's last P V, its Q loaded during this item
     * into another buffer (see the consumer's tail): where more Q buffers fit (d <= 128), and for
     * next items whose Q a tensor copy brings (whole items, q_by_tma). At d128
     * paired H200 runs (v6.25) measured 32 x 512 +4-5%, ragged +7%, chunked +1.5% and the rows
     * from 2 x 8192 up level (it was 1-5% slower there before v6.15's uniform descriptors);
     * -DKVA__HP_XITEM=0/1 forces it (comparisons only: NVRTC builds of variants keep the
     * default geometry, and are launched with the library's shared-memory size) */
    /* a warpgroup skips the key tiles a causal mask hides from all of its rows (the diagonal's
     * far side: with 192-row items of 48 tokens at d = 64, 8% of the warpgroups' tiles at 32 x
     * 512), and every tile where it holds no row of the item (a sequence's short last item);
     * it still waits for and releases them. Not with the turns (every warpgroup takes one per
     * tile) nor walked last to first (the skipped tiles would come first). On above d = 128
     * only: measured (H200, bench/NOTES.md v6.38) the d = 64 builds 2-3% slower on every short
     * row (more code in the item loop; whether the skip itself ran there is not recorded -- with
     * the turns on at d = 64 this condition leaves it off); d = 256 0.5-3% faster on every row,
     * though none of the table's rows skips a tile there (code generation; in two sessions'
     * paired runs). A row-less warpgroup releases K and V tile by tile (draining all K first
     * deadlocks an item of more than 2 x STAGES + 1 tiles:
     * `cuda_prefill_short_items_over_long_prefix`). -DKVA__HP_SKIP=0/1 forces it where the
     * turns and the reverse walk are off: at d64 and d128 (turns on) =1 changes nothing
     * unless -DKVA__HP_PINGPONG=0 comes with it */
#ifdef KVA__HP_SKIP
    static constexpr bool SKIP = KVA__HP_SKIP && !PINGPONG && !REVERSE;
#else
    static constexpr bool SKIP = D > 128 && !PINGPONG && !REVERSE;
#endif
    /* (a warpgroup with rows skips at most 2 tiles -- its last row is within ROWS - 64 <= BN
     * keys of the item's, so in fact at most 1 -- so its K stages drained before its last P V
     * stay within the STAGES the producers may run ahead) */
    static_assert(!SKIP || (ROWS - 64 <= BN && STAGES >= 2), "G::SKIP: the drain order needs these");
#ifdef KVA__HP_XITEM
    static constexpr bool XITEM = KVA__HP_XITEM && D <= 128;
#else
    static constexpr bool XITEM = D <= 128;
#endif
    /* Without the cross-item tail (d256: one 64 KB Q buffer, no room for a second) O is staged
     * for the store warp in rings of O_SLOTS 8 KB slots per consumer warpgroup, one 64-column
     * block of its 64 rows each, instead of in the item's Q rows: the Q buffer is then free once
     * both warpgroups' last Q K^T completed (EARLY_Q), so the next item's Q copy runs under this
     * item's last softmax, P V and epilogue. Staged in the Q rows, the next Q was freed only after
     * the O store had read them -- ~2000 cycles past the next item's top, landing ~4400 past it,
     * 17% of a 32 x 512 full item (per-item trace, H200 2026-11-29, bench/NOTES.md v6.39).
     * Handing the buffer back early with the consumers storing O themselves removed that wait
     * (top -> Q 164 cycles) but their stores took ~6300 cycles more per item (d256 32 x 512 full
     * 592 -> 548 TFLOP/s). A warpgroup's own slots: no slot passes between warpgroups, so their
     * epilogues do not wait for each other, and each slot's writers are always the same warps
     * (as the Q rows were). The rings' 32 KB were the 8 KB the plain build then reserved for
     * native ALiBi's column tile (1 KB since v6.40) and 24 KB that were free; that build
     * (KVA__HP_ALIBI) stages in the Q rows and fits the same launch. -DKVA__HP_ORING=0 (default:
     * prefill_kernels.h; variant builds get the library's value): O in the Q rows (comparisons);
     * -DKVA__HP_EARLY_Q=1 with -DKVA__HP_STAGED_MIN_D=512: the early hand-back with direct
     * stores (comparisons). */
#ifndef KVA__HP_EARLY_Q
#define KVA__HP_EARLY_Q 0
#endif
#ifndef KVA__HP_QDONE_LATE
#define KVA__HP_QDONE_LATE 0
#endif
    static constexpr bool PLAIN_ORING = KVA__HP_ORING && !XITEM && D > 128; /* (the library's and other variants' builds) */
    static constexpr bool ORING = PLAIN_ORING && !KVA__HP_ALIBI;
    static constexpr int O_SLOTS = 2, O_SLOT_BYTES = 64 * 128; /* (per warpgroup) */
    static constexpr int PLAIN_ORING_BYTES = PLAIN_ORING ? CWG * O_SLOTS * O_SLOT_BYTES : 0;
    static constexpr int ORING_BYTES = ORING ? PLAIN_ORING_BYTES : 0;
    static constexpr int ORING_BARS = ORING ? 2 * CWG * O_SLOTS : 0;
    static constexpr bool EARLY_Q = !XITEM && (ORING || (KVA__HP_EARLY_Q && D < KVA__HP_STAGED_MIN_D));
    static constexpr int Q_BUFS = XITEM ? KVA__HP_QBUFS : 1;
    /* mbarriers: full/empty K/V per stage, the tail; full/empty per record slot, the K/V
     * producer's item starts; Q full, Q empty and O full per Q buffer; full / empty per O ring
     * slot (rounded to 16 bytes); then the record slots (KVA__HP_SMEM_RECORDS,
     * prefill_kernels.h) -- in the library's (plain) build and in a native ALiBi build, which has
     * no rings */
    static constexpr int RECORD_BYTES = KVA__HP_SMEM_RECORDS ? RING * 64 : 0; /* (after the mbarriers) */
    static constexpr int PLAIN_BAR_BYTES =
        (8 * (4 * STAGES + 2 + 2 * RING + 3 * Q_BUFS + (PLAIN_ORING ? 2 * CWG * O_SLOTS : 0)) + 15) / 16 * 16 +
        RECORD_BYTES;
    static constexpr int ALIBI_BAR_BYTES = (8 * (4 * STAGES + 2 + 2 * RING + 3 * Q_BUFS) + 15) / 16 * 16 + RECORD_BYTES;
    static constexpr int BAR_BYTES = KVA__HP_ALIBI ? ALIBI_BAR_BYTES : PLAIN_BAR_BYTES;
    static_assert(BAR_BYTES == (8 * (4 * STAGES + 2 + 2 * RING + 3 * Q_BUFS + ORING_BARS) + 15) / 16 * 16 + RECORD_BYTES,
                  "the barrier block's size");
    /* A variant module's kernel is launched with the library's own shared-memory size
     * (variant_load.cu, the plain build's PLAIN_SMEM), so the native ALiBi build may never need
     * more: its column-offset tile first, the same Q buffers and K/V stages, and its mbarriers
     * below the 1024-aligned base where the alignment's slack (0 .. 1008 bytes) holds them, else
     * after the K/V stages. The library's build reserves what the tile needs beyond its own
     * barriers, and what barriers of more than 512 bytes need beyond the alignment's 1024 (its O
     * rings cover it all at d256). KVA__HP_TEST_SMEM_SHIFT (tests: the kernel takes
     * its dynamic shared memory as starting that many bytes later, so that the slack is large and
     * the barriers go below the base, which the H200's 1024-aligned start never gives) counts as
     * bytes the launch gives away. */
    static constexpr int ALIBI_EXTRA_BYTES = ALIBI_POS_BYTES + (2 * ALIBI_BAR_BYTES > 1024 ? 2 * ALIBI_BAR_BYTES - 1024 : 0);
    static constexpr int PLAIN_POS_BYTES =
        PLAIN_ORING || ALIBI_EXTRA_BYTES <= PLAIN_BAR_BYTES ? 0 : (ALIBI_EXTRA_BYTES - PLAIN_BAR_BYTES);
    static constexpr int PLAIN_SMEM =
        1024 + Q_BUFS * Q_BYTES + STAGES * 2 * TILE_BYTES + PLAIN_POS_BYTES + PLAIN_ORING_BYTES + PLAIN_BAR_BYTES;
    static constexpr int ALIBI_DATA = ALIBI_POS_BYTES + Q_BUFS * Q_BYTES + STAGES * 2 * TILE_BYTES;
    static_assert(1008 + KVA__HP_TEST_SMEM_SHIFT + ALIBI_DATA <= PLAIN_SMEM,
                  "native ALiBi with its barriers below the base: beyond the library's launch");
    static_assert(ALIBI_BAR_BYTES - 16 + KVA__HP_TEST_SMEM_SHIFT + ALIBI_DATA + ALIBI_BAR_BYTES <= PLAIN_SMEM,
                  "native ALiBi with its barriers after the K/V stages: beyond the library's launch");
    static constexpr int POS_BYTES = KVA__HP_ALIBI ? ALIBI_POS_BYTES : PLAIN_POS_BYTES;
    /* (a native ALiBi build's: its tile, Q and K/V stages past the alignment, not a launch
     * size; with its barriers it needs up to max(1008, 2 BAR_BYTES - 16) + ALIBI_DATA) */
    static constexpr int SMEM = KVA__HP_ALIBI ? 1024 + ALIBI_DATA : PLAIN_SMEM;
    /* an sm_90 block gets at most 227 KB (e.g. -DKVA__HP_STAGES_D128=3 does not fit, with or
     * without the cross-item tail) */
    static_assert(SMEM <= 232448, "the Hopper prefill kernel's shared memory exceeds 227 KB");
};

/* A value every lane of the warp holds, broadcast from lane 0 so that the compiler knows it is
 * warp-uniform: wgmma descriptors derived from such values stay in uniform registers; derived
 * from values it cannot prove uniform they cost R2UR moves before every wgmma (bench/NOTES.md,
 * v6.15). -DKVA__HP_UNIFORM=0 leaves the broadcasts out (comparisons). */
#ifndef KVA__HP_UNIFORM
#define KVA__HP_UNIFORM 1
#endif
#define KVA__HP_BCAST(x) (KVA__HP_UNIFORM ? __shfl_sync(0xffffffffu, (x), 0) : (x))

/* Where a key tile's rows come from. Row r of the tile's shared-memory stage holds key kb + r;
 * keys below kmin (or at or past the block's end) are masked. Paged: tiles start at lo rounded
 * down to the copy box, so the first tile may hold keys below lo. Ragged: the last tile is
 * shifted left to end at the block's last key, so no copy reads past it. */
struct kva__hp_tile {
    int kb, kmin;
};

template <int BN>
__device__ __forceinline__ kva__hp_tile kva__hp_tile_of(int j, int lo, int lo_al, int hi, bool paged) {
    kva__hp_tile t;
    const int key0 = lo_al + j * BN;
    t.kb = key0;
    t.kmin = key0 > lo ? key0 : lo;
    if (!paged && key0 + BN > hi) t.kb = hi - BN;
    return t;
}

/* r / g for a packed row r (its token) by one high multiply: m = ceil(2^32 / g) (0 for
 * g = 1) is exact while r * g < 2^32. A division by the run-time group cost ~15 instructions, and
 * each work item's Q loads, row setup and epilogue divide ~20 times per thread. */
__device__ __forceinline__ uint32_t kva__hp_group_magic(int g) { return g == 1 ? 0u : 0xffffffffu / (uint32_t)g + 1u; }
__device__ __forceinline__ int kva__hp_div_group(int r, uint32_t m) { return m ? (int)__umulhi((uint32_t)r, m) : r; }

#ifndef KVA__HP_DYNAMIC
#define KVA__HP_DYNAMIC 1
#endif
/* Q by a tensor copy only where the K/V copy boxes hold at least this many keys (comparisons:
 * -DKVA__HP_Q_TMA_MIN_BOX=64 gives paged K/V of small pages the consumers' own Q copies; v6.28
 * measured chunked prefill (16-key pages) the same either way) */
#ifndef KVA__HP_Q_TMA_MIN_BOX
#define KVA__HP_Q_TMA_MIN_BOX 1
#endif
/* K and V tiles issued by two producer warps (0: K, 3: V) instead of warp 0 alone: a paged tile
 * of small pages takes one tensor copy per page and column block (16 per tile and operand at
 * page 16, d128), and one warp issuing them all left the consumers waiting (chunked prefill over
 * 16-key pages 1.6x slower than over contiguous K/V, v6.29). -DKVA__HP_KV_WARPS=1: warp 0 both
 * (comparisons) */
#ifndef KVA__HP_KV_WARPS
#define KVA__HP_KV_WARPS 2
#endif
static_assert(KVA__HP_KV_WARPS == 1 || KVA__HP_KV_WARPS == 2, "KVA__HP_KV_WARPS: 1 or 2 producer warps");

/* One (work item, KV head) of a block's sequence and the keys its tiles cover. */
struct kva__hp_work {
    kva__pf_item it; /* (words 0-8: w, b, key_beg, key_end, kv_len, kv_beg, q_row0, q_tokens, q_pos0) */
    int kh, lo, hi, lo_al, n_tiles; /* (words 9-13: the K/V producer reads them by index) */
};
static_assert(sizeof(kva__hp_work) == 14 * 4 && sizeof(kva__pf_item) == 9 * 4, "kva__hp_work's words moved");

/* The (KV head, work item) pair at position p of the launch order, false past the end (or for
 * p < 0). The positions run KV-head-major (prefill items from the plan's last, decode records
 * from its first), so that the blocks working at one time share one head's K/V through
 * L2. Which positions a block takes: see the
 * kernel (work distribution). */
template <int BN>
__device__ __forceinline__ bool kva__hp_work_at(const kva__prefill_args &a, int p, int box, kva__hp_work &wk) {
    const int num_work = a.num_work >= 0 ? a.num_work : __ldg(a.num_work_dev);
    if (p < 0 || num_work <= 0 || (int64_t)p >= (int64_t)num_work * a.num_kv_heads) return false;
    wk.kh = p / num_work;
    /* (decode records are longest first in plan order, so they are walked in it: a dynamic walk
     * then hands out the short ones last; prefill items from the plan's last, whose causal
     * ranges are the longest) */
    const int i = p - wk.kh * num_work;
    kva__pf_load_record(a, a.decode_records ? i : num_work - 1 - i, wk.it);
    const kva__pf_item &it = wk.it;
    int lo = it.key_beg, hi = it.key_end;
    const int q_last = it.q_pos0 + it.q_tokens - 1;
    if (a.causal && hi > q_last + 1) hi = q_last + 1;
    /* (64-bit: positions are negative when a request has more queries than keys) */
    if (a.window_left >= 0 && (int64_t)lo < (int64_t)it.q_pos0 - a.window_left) lo = it.q_pos0 - a.window_left;
    wk.lo = lo;
    wk.hi = hi;
    wk.lo_al = a.page_indices ? lo - lo % box : lo;
    wk.n_tiles = hi > lo ? (hi - wk.lo_al + BN - 1) / BN : 0;
    return true;
}

/* 2^x for x <= 10 (lazy rescaling lets P exceed 1) on the FMA and integer pipes instead of the MUFU unit (whose 16 results per
 * clock and SM bound the softmax; one in KVA__HP_EXP_FMA(D) of a row's exponentials takes
 * this path): floor(x) by a rounding-down add of 1.5 * 2^23, 2^frac by a cubic fitted
 * for the relative error (at most 9e-5, below bf16's and f16's rounding of P), the exponent added
 * as an integer. Below 2^-126 (masked scores, -inf) it returns 0; NaN stays NaN. */
__device__ __forceinline__ float kva__hp_exp2_fma(float x) {
    const float t = __fadd_rd(x, 12582912.0f);
    const float f = x - (t - 12582912.0f);
    float p = fmaf(0.07706641f, f, 0.2276457f);
    p = fmaf(p, f, 0.69511662f);
    p = fmaf(p, f, 1.0f);
    const float r = __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
    return x < -126.0f ? 0.0f : r;
}
/* Measured on an H200 (bench/NOTES.md, v6.13): one in 4 at d = 64 with two consumer
 * warpgroups (+10% on 512-token rows, level at 16k); 10-15% slower at d = 128 and 256, where the
 * MUFU unit is not what the softmax waits on, and at d = 64 with three warpgroups (v6.31: one in
 * 4 / 8 / 16 / none 440 / 463 / 461 / 476 TFLOP/s at 16k causal: issue slots, not the MUFU
 * unit, are what three warpgroups' softmaxes share). */
/* (-DKVA__HP_EXP_FMA_EVERY=N forces one in N at every head dim, 0 none) */
#ifdef KVA__HP_EXP_FMA_EVERY
#define KVA__HP_EXP_FMA(D) (KVA__HP_EXP_FMA_EVERY)
#else
#define KVA__HP_EXP_FMA(D) ((D) == 64 && KVA__HP_CWG_D64 == 2 ? 4 : 0)
#endif

/* max (MAX) or sum of t[0..N) as a tree of depth log2 N (N a power of two) */
template <int N, bool MAX>
__device__ __forceinline__ float kva__hp_tree(float *t) {
    if constexpr (N == 1) {
        return t[0];
    } else {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) t[i] = MAX ? fmaxf(t[i], t[i + N / 2]) : t[i] + t[i + N / 2];
        return kva__hp_tree<N / 2, MAX>(t);
    }
}

/* D: the head dim the shared-memory tiles, copies and stores are laid out for; DW (<= D, a
 * multiple of 16): the head dim of the matrix products and of O in registers. DW = 96 on the
 * d128 layout is Phi-3's d96: Q K^T takes 6 k16 steps instead of 8 and P V is n96, where the
 * d128 kernel spent a quarter of both on the zero columns (the copies past the real dim still
 * land zeros, the O store's box is clipped to it). */
template <typename T, int D, int DW = D, int TURNS = -1, int CAP = 0>
__global__ void __launch_bounds__(kva__hopper_geom<T, D>::THREADS, 1) kva__prefill_hopper_kernel(const __grid_constant__ kva__hopper_prefill_args ha) {
#if KVA__HAVE_WGMMA
    static_assert(DW <= D && DW % 16 == 0, "the matrix products' head dim: a multiple of 16 within the layout's");
    using G = kva__hopper_geom<T, D>;
    /* TURNS: -1 the geometry's choice (G::PINGPONG), 0 / 1 without / with the turns (the d128
     * layout's two builds, picked per call: prefill_launch.cu, hopper_fn) */
    constexpr bool PINGPONG = TURNS < 0 ? G::PINGPONG : TURNS > 0;
    /* (G::SKIP is decided without TURNS: a warpgroup skipping tiles would miss turns) */
    static_assert(!(PINGPONG && G::SKIP), "the turns and the tile skip exclude each other");
    constexpr int BN = G::BN, ROWS = G::ROWS, CPR = G::CPR, CWG = G::CWG;
    constexpr int NT = BN / 8, DT = DW / 8, CB = D / 64; /* column blocks of 64 elements */
    const kva__prefill_args &a = ha.a;
    kva__pdl_trigger(); /* (the merge kernel's blocks may be placed once every block started) */
    /* consumer warpgroups at work in this launch: a decode record is one token of a GQA group
     * (at most 128 rows), so the warpgroups past its rows would compute on zeros (the third at d64
     * did: Falcon-7B 71/1 decode 10% slower, bench/NOTES.md v6.31); they leave at once and the
     * launch runs with ceil(group / 64): arrival counts, the store warp's parts and the turn ring
     * count the warpgroups at work (one takes no turns) */
    const int ncw = a.decode_records ? min(CWG, max(1, (a.group + 63) / 64)) : CWG;
    const int cwarps = 4 * ncw; /* consumer warps at work */
    extern __shared__ __align__(1024) unsigned char smem[];

    const int tid = threadIdx.x;
    const int g = a.group;
    const uint32_t g_magic = kva__hp_group_magic(g);
    const bool g_divides_64 = 64 % g == 0; /* (once: per item it was a division's ~20 instructions) */
    const bool paged = a.page_indices != NULL;
    const int box = paged ? ha.box_rows : BN;
    kva__hp_work wk;
    /* Work distribution. Block b takes the pair at position b first. Without a plan (a.sched
     * NULL) it then takes b + gridDim.x, b + 2 gridDim.x, ...; with one, each further position is
     * a ticket drawn from a.sched[0] (plus gridDim.x) when the K/V producer begins the item
     * before it. A block that finishes early takes more items, so the blocks end within about
     * the last items handed out of each other -- short ones under a causal mask, where launch
     * order ends with each request's first query tiles (the static walk could leave long items
     * for the last round: 1 x 16k ~3%, ragged batches 15-20% over the mean block). Decode
     * records (GQA groups above 16 run here) come longest first in plan order and are walked in
     * it. Positions still run in launch order, so the blocks at work at one time keep sharing
     * K/V through L2. The scheduler warp counts its block into a.sched[1] after its last
     * ticket (a block without work at once); the last one resets both to zero for the next run.
     * (-DKVA__HP_DYNAMIC=0: the static walk for every call, comparisons) */
    const bool dyn = KVA__HP_DYNAMIC && a.sched != nullptr && (int)gridDim.x <= a.sched_blocks &&
                     a.sched_ring >= 16 * G::RING + 1 && a.sched_ring % 4 == 0;
    auto sched_done = [&]() {
        __threadfence(); /* (this block's last ticket before its count) */
        if (atomicAdd(a.sched + 1, 1u) == gridDim.x - 1) {
            __threadfence(); /* (every block's last ticket before the reset) */
            atomicExch(a.sched, 0u);
            atomicExch(a.sched + 1, 0u);
        }
    };
    if (!kva__hp_work_at<BN>(a, (int)blockIdx.x, box, wk)) {
        if (dyn && tid == 0) sched_done();
        return;
    }

    const uint32_t smem_raw = kva__smem_addr(smem) + KVA__HP_TEST_SMEM_SHIFT;
    const uint32_t base_s = (smem_raw + 1023u) & ~1023u;
    /* native ALiBi's column-offset tile first: compute-sanitizer takes its k-step's read for
     * both k-halves' bytes (BN x 32, twice the tile), which then fall in the Q buffers, not past
     * the launch's end (the plain build's reserved bytes stay after the K/V stages) */
    const uint32_t pos_s = base_s;
    const uint32_t q_s = base_s + (KVA__HP_ALIBI ? (uint32_t)G::POS_BYTES : 0u);
    const uint32_t kv_s = q_s + G::Q_BUFS * G::Q_BYTES;
    auto q_buf = [&](int b) { return q_s + (uint32_t)(b * G::Q_BYTES); };
    auto k_stage = [&](int s) { return kv_s + (uint32_t)(s * 2 * G::TILE_BYTES); };
    auto v_stage = [&](int s) { return kv_s + (uint32_t)(s * 2 * G::TILE_BYTES + G::TILE_BYTES); };
    /* (G::ORING, where POS_BYTES is 0; 1024-aligned: the copies' swizzle) */
    const uint32_t oring_s = kv_s + G::STAGES * 2 * G::TILE_BYTES + (KVA__HP_ALIBI ? 0u : (uint32_t)G::POS_BYTES);
    /* (native ALiBi: below the base where the alignment left room, see G::SMEM) */
    const uint32_t bars = KVA__HP_ALIBI && base_s - smem_raw >= (uint32_t)G::BAR_BYTES ? base_s - (uint32_t)G::BAR_BYTES
                                                                                       : oring_s + G::ORING_BYTES;
    auto bar_at = [&](int i) { return bars + 8u * (uint32_t)i; };
    const uint32_t records_s = bars + (uint32_t)(G::BAR_BYTES - G::RECORD_BYTES); /* (G::RECORD_BYTES) */
    auto full_k = [&](int s) { return bar_at(s); };
    auto full_v = [&](int s) { return bar_at(G::STAGES + s); };
    auto empty_k = [&](int s) { return bar_at(2 * G::STAGES + s); };
    auto empty_v = [&](int s) { return bar_at(3 * G::STAGES + s); };
    const uint32_t tail_bar = bar_at(4 * G::STAGES);
    /* Who hands what to whom. The producer warpgroup's warp 1 (the scheduler) decides the
     * block's items and loads their Q; warps 0 and 3 stream their K and V tiles; warp 2 stores
     * the O the consumers staged in shared memory. Item 0 (position blockIdx.x) every thread finds itself,
     * and so every item of the static walk. With tickets (dyn), item m >= 1's record
     * (kva__hp_work; kh < 0: none left) reaches the others through slot (m - 1) % RING of the
     * block's ring in the workspace, whose "full" barrier the scheduler arrives on after
     * writing it; warps 0 and 3 read it at the item's start, the store warp before the item's O, the
     * consumers (with G::XITEM) at the previous item's start where it is published by then
     * (their loads land while they compute), else in that item's tail (without G::XITEM after
     * its epilogue), each reading warp arriving on the slot's "empty" barrier once it used the
     * record. (Global memory, not shared: racecheck does not follow mbarrier hand-overs of
     * shared memory and reported the slots -- every one with ordinary stores, 14 hazards with
     * bulk copies filling them. -DKVA__HP_SMEM_RECORDS=1 puts them back in shared memory for
     * comparisons; KVA__HP_LANE_RECORDS (on by default in the library's kernels, off in variant
     * builds) keeps them here and has the consumers fetch the record after next a word per
     * lane: prefill_kernels.h.) The ticket of item m + 1 is
     * drawn once warp 0 began item m (kv_top). Item m's Q goes to buffer m % Q_BUFS, by a
     * tensor copy where the item is whole (else the consumers copy it themselves: the
     * scheduler then only passes the buffer on, "q full"); the consumers stage the item's O in
     * the same buffer and arrive on "o full"; warp 2 stores it by tensor copies and arrives on
     * "q empty", which the scheduler waits for before the buffer's next Q. The record's
     * decoding, whole items' Q copies and whole warpgroup parts' O stores (~3300 cycles per item
     * on the consumers' critical path before, v6.25 trace) thus run on other warps; the consumers
     * still copy other items' Q, store O themselves for split items and 64-row parts that are not
     * whole (or without the maps), and write the LSE. */
    auto slot_full = [&](int i) { return bar_at(4 * G::STAGES + 1 + i); };
    auto slot_empty = [&](int i) { return bar_at(4 * G::STAGES + 1 + G::RING + i); };
    const uint32_t kv_top = bar_at(4 * G::STAGES + 1 + 2 * G::RING);
    auto q_full = [&](int b) { return bar_at(4 * G::STAGES + 2 + 2 * G::RING + b); };
    auto q_empty = [&](int b) { return bar_at(4 * G::STAGES + 2 + 2 * G::RING + G::Q_BUFS + b); };
    auto o_full = [&](int b) { return bar_at(4 * G::STAGES + 2 + 2 * G::RING + 2 * G::Q_BUFS + b); };
    /* (G::ORING) slot i of warpgroup h's O ring (slot h O_SLOTS + i of oring_s) staged by its 4
     * warps / read by the store warp's copy. Warpgroup h's k-th staged block of the run (k = 0,
     * 1, ... over items, column blocks in order) takes its slot k % O_SLOTS: warpgroup h and the
     * store warp count them alike (oring_n) */
    auto oring_slot = [&](int h, int i) { return oring_s + (uint32_t)((h * G::O_SLOTS + i) * G::O_SLOT_BYTES); };
    auto oring_full = [&](int h, int i) { return bar_at(4 * G::STAGES + 2 + 2 * G::RING + 3 * G::Q_BUFS + h * G::O_SLOTS + i); };
    auto oring_empty = [&](int h, int i) {
        return bar_at(4 * G::STAGES + 2 + 2 * G::RING + 3 * G::Q_BUFS + (CWG + h) * G::O_SLOTS + i);
    };
    const int lane_id = tid & 31;
    /* item m >= 1 of this block into w (w.kh < 0: past the last; see above): with tickets its
     * record's loads are issued here and land in w's registers later (volatile: not sunk to
     * their first use); work_done(m) once w has been used frees the slot */
    auto work_fetch = [&](int m, kva__hp_work &w) {
        if (!dyn) {
            if (!kva__hp_work_at<BN>(a, (int)blockIdx.x + m * (int)gridDim.x, box, w)) w.kh = -1;
            return;
        }
        const int i = (m - 1) % G::RING;
        kva__mbar_wait(slot_full(i), (uint32_t)((m - 1) / G::RING) & 1u);
        const unsigned *src = a.sched + KVA__SCHED_HEAD + (size_t)blockIdx.x * a.sched_ring + 16 * i;
        int *wd = reinterpret_cast<int *>(&w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int x, y, z, v;
            if constexpr (G::RECORD_BYTES > 0)
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(x), "=r"(y), "=r"(z), "=r"(v)
                             : "r"(records_s + (uint32_t)(64 * i + 16 * k)));
            else
                asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(x), "=r"(y), "=r"(z), "=r"(v)
                             : "l"(src + 4 * k));
            wd[4 * k] = x;
            wd[4 * k + 1] = y;
            if (k < 3) {
                wd[4 * k + 2] = z;
                wd[4 * k + 3] = v;
            }
        }
    };
    /* work_fetch where item m's record is already published (static walk: always); false
     * without waiting where not. (The warp decides together -- published if any lane saw it, and
     * work_fetch's own wait then returns at once -- so that its lanes never split here.) */
    auto work_try_fetch = [&](int m, kva__hp_work &w) -> bool {
        if (dyn && !__any_sync(0xffffffffu, kva__mbar_test(slot_full((m - 1) % G::RING), (uint32_t)((m - 1) / G::RING) & 1u)))
            return false;
        work_fetch(m, w);
        return true;
    };
    auto work_done = [&](int m) {
        if (!dyn) return;
        __syncwarp();
        if (lane_id == 0) kva__mbar_arrive(slot_empty((m - 1) % G::RING));
    };
    /* whether item w's Q comes by a tensor copy (the scheduler's) or the consumers' copies */
    auto q_by_tma = [&](const kva__hp_work &w) {
        return (ha.qo_maps & 1) && w.it.q_tokens * g == ROWS && box >= KVA__HP_Q_TMA_MIN_BOX;
    };
    /* whether consumer warpgroup h's 64 rows of item w's O are staged for the store warp's tensor
     * copies (else the consumers store them): whole parts of unsplit items (see the epilogue) */
    auto o_staged = [&](const kva__hp_work &w, int h) {
        return D >= KVA__HP_STAGED_MIN_D && (ha.qo_maps & 2) && g_divides_64 && w.it.q_tokens * g >= (h + 1) * 64 &&
               w.it.key_beg <= 0 && w.it.key_end >= w.it.kv_len;
    };
    /* (G::ORING) the column blocks of a staged part that hold the head dim (the store's too) */
    const int o_blocks = min(D / 64, (a.head_dim + 63) / 64);

    if (tid == 0) {
        for (int s = 0; s < G::STAGES; ++s) {
            kva__mbar_init(full_k(s), 1);
            kva__mbar_init(full_v(s), 1);
            kva__mbar_init(empty_k(s), cwarps); /* one arrival per consumer warp */
            kva__mbar_init(empty_v(s), cwarps);
        }
        kva__mbar_init(tail_bar, 1);
        for (int i = 0; i < G::RING; ++i) {
            kva__mbar_init(slot_full(i), 1);
            /* the K/V producer warps, the consumer warps, the store warp */
            kva__mbar_init(slot_empty(i), KVA__HP_KV_WARPS + cwarps + 1);
        }
        kva__mbar_init(kv_top, 1);
        for (int b = 0; b < G::Q_BUFS; ++b) {
            kva__mbar_init(q_full(b), 1);
            kva__mbar_init(q_empty(b), 1);
            kva__mbar_init(o_full(b), cwarps);
        }
        for (int i = 0; i < CWG * G::O_SLOTS && G::ORING; ++i) {
            kva__mbar_init(oring_full(i / G::O_SLOTS, i % G::O_SLOTS), 4); /* (the warpgroup's warps) */
            kva__mbar_init(oring_empty(i / G::O_SLOTS, i % G::O_SLOTS), 1);
        }
        kva__mbar_init_fence();
    }
    if constexpr (KVA__HP_ALIBI) {
        /* row j of the column-offset tile: [j, j, j, 0, 0, 0, 0, 0] */
        if (tid < BN) {
            const int j = tid;
            const uint32_t jj = kva__pack2<T>((float)j, (float)j), j0 = kva__pack2<T>((float)j, 0.0f);
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(pos_s + 16u * (uint32_t)j),
                         "r"(jj), "r"(j0), "r"(0u), "r"(0u)
                         : "memory");
            kva__fence_proxy_async();
        }
    }
    __syncthreads();

    if (tid < 128) {
        kva__setmaxnreg_dec<G::PRODUCER_REGS>();
        const int warp = tid >> 5, lane = tid & 31;
        if (warp == 1) {
            /* ================= scheduler: items and their Q ================= */
            /* item w's Q -> buffer b: a tensor copy per column block of a whole item (g heads x
             * ROWS / g tokens, never past the item's rows); for other items the consumers copy it
             * (q_by_tma), this only passes the buffer on */
            auto load_q = [&](const kva__hp_work &w, int b, int m) {
                if (lane == 0) {
                    if (q_by_tma(w)) {
                        kva__mbar_arrive_expect(q_full(b), (uint32_t)G::Q_BYTES);
#pragma unroll
                        for (int c = 0; c < CB; ++c)
                            kva__tma_load_3d(q_buf(b) + (uint32_t)(c * ROWS * 128), &ha.q_map, q_full(b), c * 64,
                                             w.kh * g, w.it.q_row0);
                    } else {
                        kva__mbar_arrive(q_full(b));
                    }
                }
                KVA__HP_TRACE_WARP(m, KVA__HPT_S_Q, clock64());
            };
            if (lane == 0 && (ha.qo_maps & 1)) kva__tma_prefetch_map(&ha.q_map);
            load_q(wk, 0, 0);
            unsigned *const ring = dyn ? a.sched + KVA__SCHED_HEAD + (size_t)blockIdx.x * a.sched_ring : nullptr;
            int m = 0;
            for (;; ++m) {
                kva__hp_work nx{};
                bool ok;
                if (dyn) {
                    /* item m + 1: a ticket drawn once warp 0 began item m. (Drawing it an item
                     * earlier, to hide the atomic's round trip, measured worse: the earlier
                     * commitment cost ragged batches 10% of their balance, and short items
                     * gained nothing.) */
                    if (m >= 1) kva__mbar_wait_idle(kv_top, (uint32_t)(m - 1) & 1u);
                    unsigned ticket = 0;
                    if (lane == 0) ticket = atomicAdd(a.sched, 1u);
                    ticket = __shfl_sync(0xffffffffu, ticket, 0);
                    const int num_work = a.num_work >= 0 ? a.num_work : __ldg(a.num_work_dev);
                    const int64_t t = (int64_t)gridDim.x + ticket;
                    ok = kva__hp_work_at<BN>(a, t < (int64_t)num_work * a.num_kv_heads ? (int)t : -1, box, nx);
                    if (!ok) nx.kh = -1;
                    const int i = m % G::RING;
                    kva__mbar_wait_idle(slot_empty(i), ((uint32_t)(m / G::RING) & 1u) ^ 1u);
                    if (lane == 0) {
                        const int *wd = reinterpret_cast<const int *>(&nx); /* (14 words) */
                        if constexpr (G::RECORD_BYTES > 0) {
#pragma unroll
                            for (int k = 0; k < 4; ++k)
                                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                                 records_s + (uint32_t)(64 * i + 16 * k)),
                                             "r"(wd[4 * k]), "r"(wd[4 * k + 1]), "r"(k < 3 ? wd[4 * k + 2] : 0),
                                             "r"(k < 3 ? wd[4 * k + 3] : 0)
                                             : "memory");
                        } else {
                            unsigned *const dst = ring + 16 * i;
#pragma unroll
                            for (int k = 0; k < 14; ++k) dst[k] = (unsigned)wd[k];
                        }
                        kva__mbar_arrive(slot_full(i)); /* (release: the record before it) */
                    }
                } else {
                    work_fetch(m + 1, nx);
                    ok = nx.kh >= 0;
                }
                if (!ok) break;
                const int b = (m + 1) % G::Q_BUFS;
                kva__mbar_wait_idle(q_empty(b), ((uint32_t)((m + 1) / G::Q_BUFS) & 1u) ^ 1u);
                KVA__HP_TRACE_WARP(m + 1, KVA__HPT_S_FREE, clock64());
                load_q(nx, b, m + 1);
            }
            if (dyn && lane == 0) {
                /* (the tickets this block drew, for the tests: the dynamic walk ran) */
                ring[a.sched_ring - 1] = (unsigned)(m + 1);
                sched_done();
            }
            return;
        }
        if (warp == 2) {
            /* ================= O store ================= */
            /* item m's staged 64-row parts: one tensor copy per part and column block (g heads x 64 / g
             * tokens; a warp's 16-byte stores, or a bulk copy per row, took ~12000 cycles per
             * item beside the consumers' matrix products: v6.28 trace) */
            if (lane == 0 && (ha.qo_maps & 2)) kva__tma_prefetch_map(&ha.o_map);
            kva__hp_work w = wk;
            uint32_t oring_n[CWG] = {}; /* (G::ORING) blocks each warpgroup staged so far */
            for (int m = 0;; ++m) {
                if (m >= 1) {
                    work_fetch(m, w);
                    const bool more = w.kh >= 0;
                    work_done(m);
                    if (!more) break;
                }
                const int b = m % G::Q_BUFS;
                kva__mbar_wait_idle(o_full(b), (uint32_t)(m / G::Q_BUFS) & 1u);
                KVA__HP_TRACE_WARP(m, KVA__HPT_W_GOT, clock64());
                if constexpr (G::ORING) {
                    /* the consumers issued their last Q K^T: the buffer to the scheduler; then
                     * the item's staged blocks, each copied as soon as its warpgroup staged it
                     * (the rings polled in turn: neither warpgroup's epilogue waits for the
                     * other's), each slot handed back once its copy read it (the newest
                     * copy's read left in flight until the next one or the item's end) */
                    if (lane == 0) kva__mbar_arrive(q_empty(b));
                    int done_c[CWG], left = 0, pend = -1;
#pragma unroll
                    for (int h = 0; h < CWG; ++h) {
                        done_c[h] = h < ncw && o_staged(w, h) ? 0 : o_blocks;
                        left += o_blocks - done_c[h];
                    }
                    while (left > 0) {
                        bool any = false;
#pragma unroll
                        for (int h = 0; h < CWG; ++h) {
                            if (done_c[h] >= o_blocks) continue;
                            const int i = (int)(oring_n[h] % G::O_SLOTS);
                            const bool staged = __shfl_sync(0xffffffffu, kva__mbar_test(oring_full(h, i), (oring_n[h] / G::O_SLOTS) & 1u), 0);
                            if (!staged) continue;
                            if (lane == 0) {
                                kva__tma_store_3d(&ha.o_map, oring_slot(h, i), done_c[h] * 64, w.kh * g, w.it.q_row0 + h * (64 / g));
                                kva__bulk_commit();
                                kva__bulk_wait_read_but<1>();
                                if (pend >= 0) kva__mbar_arrive(oring_empty(pend / G::O_SLOTS, pend % G::O_SLOTS));
                            }
                            pend = h * G::O_SLOTS + i;
                            ++oring_n[h];
                            ++done_c[h];
                            --left;
                            any = true;
                        }
                        if (!any) __nanosleep(32);
                    }
                    if (lane == 0 && pend >= 0) {
                        kva__bulk_wait_read();
                        kva__mbar_arrive(oring_empty(pend / G::O_SLOTS, pend % G::O_SLOTS));
                    }
                } else if (lane == 0) {
                    for (int h = 0; h < ncw; ++h) {
                        if (!o_staged(w, h)) continue;
                        /* (column blocks past the head dim hold nothing to store) */
                        for (int c = 0; c < CB && c * 64 < a.head_dim; ++c)
                            kva__tma_store_3d(&ha.o_map, q_buf(b) + (uint32_t)(c * ROWS * 128 + h * 64 * 128), c * 64,
                                              w.kh * g, w.it.q_row0 + h * (64 / g));
                    }
                    kva__bulk_commit();
                    kva__bulk_wait_read(); /* (the buffer may take the next Q) */
                    kva__mbar_arrive(q_empty(b));
                }
                KVA__HP_TRACE_WARP(m, KVA__HPT_W_DONE, clock64());
            }
            if (lane == 0) kva__bulk_wait(); /* (every copy's writes done before the block ends) */
            return;
        }
        if (warp != 0 && (KVA__HP_KV_WARPS == 1 || warp != 3)) return;
        /* ================= K/V producers ================= */
        /* (warp 0 issues K and sets the pace of tickets, kv_top; warp 3 V -- or warp 0 both. With
         * two warps warp 0 may run up to STAGES tiles ahead of V, so tickets are drawn up to that
         * much earlier than with one: ragged batches measured level, 469-491 TFLOP/s against
         * 460-488, v6.29) */
        const bool k_warp = warp == 0, v_warp = warp == 3 || KVA__HP_KV_WARPS == 1;
        const void *kmap = &ha.k_map, *vmap = &ha.v_map;
        if (lane == 0) {
            if (k_warp) kva__tma_prefetch_map(kmap);
            if (v_warp) kva__tma_prefetch_map(vmap);
        }
        /* tiles produced so far (stage and phase run on across work items), tail uses */
        uint32_t gt = 0, tails = 0;
        for (int m = 0;; ++m) {
            if (m >= 1) { /* item m's record */
                work_fetch(m, wk);
                const bool more = wk.kh >= 0;
                work_done(m);
                if (dyn && k_warp && lane == 0) kva__mbar_arrive(kv_top);
                if (!more) break;
            }
            const int kv_beg = wk.it.kv_beg, kh = wk.kh, lo = wk.lo, hi = wk.hi, lo_al = wk.lo_al, n_tiles = wk.n_tiles;
            if (k_warp) {
                KVA__HP_TRACE_AT(0, m, KVA__HPT_P_START, clock64());
                KVA__HP_TRACE_AT(0, m, KVA__HPT_TILES, n_tiles);
            }
            const int nbox = BN / box;
            /* issues the copies of tile j of K (which 0) or V (1) onto barrier `bar`; returns the
             * bytes announced (by lane 0, before any copy is issued) */
            auto load_tile = [&](int which, int j, uint32_t dst, uint32_t bar) {
                const kva__hp_tile t = kva__hp_tile_of<BN>(j, lo, lo_al, hi, paged);
                const void *map = which ? vmap : kmap;
                if (!paged) {
                    if (lane == 0) {
                        kva__mbar_arrive_expect(bar, (uint32_t)G::TILE_BYTES);
#pragma unroll
                        for (int c = 0; c < CB; ++c)
                            kva__tma_load_3d(dst + (uint32_t)(c * BN * 128), map, bar, c * 64, kv_beg + t.kb, kh);
                    }
                    return;
                }
                /* boxes that start before the block's end; a box's rows past it are masked (K) or
                 * zeroed (V) */
                const int nvalid = min(nbox, (hi - t.kb + box - 1) / box);
                if (lane == 0) kva__mbar_arrive_expect(bar, (uint32_t)(nvalid * box * D * 2));
                __syncwarp();
                for (int i = lane; i < nvalid; i += 32) {
                    const int key = t.kb + i * box;
                    const int pg = (int)(((uint64_t)(uint32_t)key * a.page_div_m) >> a.page_div_s);
                    const int slot = key - pg * a.page_size;
                    const int pid = __ldg(a.page_indices + kv_beg + pg);
#pragma unroll
                    for (int c = 0; c < CB; ++c)
                        kva__tma_load_4d(dst + (uint32_t)(c * BN * 128 + i * box * 128), map, bar, c * 64, slot, kh, pid);
                }
            };
            for (int jn = 0; jn < n_tiles; ++jn) {
                const int s = (int)((gt + jn) % G::STAGES);
                const uint32_t ph = ((gt + jn) / G::STAGES) & 1u;
                const int j = G::REVERSE ? n_tiles - 1 - jn : jn; /* the tile's place in key order */
                if (k_warp) {
                    kva__mbar_wait(empty_k(s), ph ^ 1u);
                    if (jn == 0) KVA__HP_TRACE_AT(0, m, KVA__HPT_P_FIRST, clock64());
                    load_tile(0, j, k_stage(s), full_k(s));
                }
                if (!v_warp) continue;
                kva__mbar_wait(empty_v(s), ph ^ 1u);
                const kva__hp_tile t = kva__hp_tile_of<BN>(j, lo, lo_al, hi, paged);
                /* V rows outside [kmin, hi) that may hold another request's values or stale data */
                const int z_lo = paged ? 0 : t.kmin - t.kb;     /* rows [0, z_lo) */
                const int z_hi = paged ? hi - t.kb : BN;        /* rows [z_hi, BN) */
                if (z_lo <= 0 && z_hi >= BN) {
                    load_tile(1, j, v_stage(s), full_v(s));
                } else {
                    /* the last tile: land it on the tail barrier, zero the rows, then publish */
                    load_tile(1, j, v_stage(s), tail_bar);
                    kva__mbar_wait(tail_bar, tails & 1u);
                    ++tails;
                    const uint32_t vs = v_stage(s);
                    const int nz = (z_lo > 0 ? z_lo : 0) + (z_hi < BN ? BN - z_hi : 0);
                    for (int i = lane; i < nz * CB * 8; i += 32) {
                        const int chunk = i & 7, c = (i >> 3) % CB, zr = (i >> 3) / CB;
                        const int r = zr < z_lo ? zr : z_hi + (zr - (z_lo > 0 ? z_lo : 0));
                        const uint32_t addr = vs + (uint32_t)(c * BN * 128 + r * 128 + chunk * 16);
                        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
                    }
                    kva__fence_proxy_async();
                    __syncwarp();
                    if (lane == 0) kva__mbar_arrive(full_v(s));
                }
            }
            if (k_warp) KVA__HP_TRACE_AT(0, m, KVA__HPT_P_LAST, clock64());
            gt += (uint32_t)n_tiles;
        }
        return;
    }

    /* ================= consumers ================= */
    kva__setmaxnreg_inc<G::CONSUMER_REGS>();
    const int ct = tid - 128;                 /* thread in the consumer warpgroups */
    /* consumer warpgroup 0 .. CWG - 1 (uniform: the Q descriptors are built from it) */
    const int cw = KVA__HP_BCAST(ct >> 7);
    const int wt = ct & 127;                  /* thread in my warpgroup */
    const int lane = ct & 31, wq = wt >> 5;   /* warp in my warpgroup */
    const int row_base = cw * 64 + wq * 16;

    /* Ping-pong (PINGPONG): I issue after my barrier completes, then let the next
     * warpgroup go (a ring of ncw), so that the warpgroups' matrix products alternate and one's
     * softmax runs under the others'. Measured on an H200 (bench/NOTES.md, v6.7, v6.14): +4-7% on d = 128 rows
     * of 512-2048 tokens and level at 16k; at d = 64 2-5% slower before the cross-item tail,
     * +1-2% with it; at d = 256 1% slower over 16k, where letting both issue freely (their
     * softmaxes interleave through the hardware's own scheduling) is better. Since the cross-item
     * tail and the staged O (v6.39, 2026-11-29) d128 runs 0.7-1.6% faster without them on every
     * row but short causal items (+2% with them), so d128 has both builds (TURNS) and the launcher
     * picks per call; d64 keeps them (+8% at 32 x 512 causal, level elsewhere). All warpgroups
     * walk the same items and take the same number of turns per item (one per tile, plus one
     * for an S_0 the previous item's tail did not issue), so the turns run on across items;
     * warpgroup 0 goes first and takes the last warpgroup's last pass at the end. (Named barriers:
     * 1 .. CWG are the warpgroups' own Q copies, CWG + 1 .. 2 CWG their turns.) */
    if (cw >= ncw) return;
    const int my_turn = 1 + CWG + cw, next_turn = 1 + CWG + (cw + 1 == ncw ? 0 : cw + 1);
    auto turn_wait = [&]() {
        if constexpr (PINGPONG)
            if (ncw > 1) kva__bar_sync(my_turn, 256);
    };
    auto turn_pass = [&]() {
        if constexpr (PINGPONG)
            if (ncw > 1) kva__bar_arrive(next_turn, 256);
    };
    auto release = [&](uint32_t bar) {
        if (lane == 0) kva__mbar_arrive(bar);
    };
    /* CAP (KVA__HP_CAP_KERNEL, prefill_kernels.h; the library's kernels only, the layouts of
     * KVA__HP_CAP_BUILT): the soft cap a compile-time property of the build, launched by the cap
     * (prefill_launch.cu, hopper_fn) */
    constexpr bool CAP_BUILDS = KVA__HP_CAP_BUILT(D) && !KVA__HP_ALIBI && !KVA__HAS_SCORE_MOD;
    const bool capped = CAP_BUILDS ? CAP != 0 : a.cap_log2 > 0.0f;
    /* (CAP_BUILDS, -DKVA__HP_CAP_RAW_MAX=1) the capped build takes its row max from the raw
     * scores, so that its exponentials need not wait for every tanh (softmax) */
    constexpr bool RAW_MAX = CAP_BUILDS && CAP != 0 && KVA__HP_CAP_RAW_MAX != 0;
    /* with a variant (KVA__HAS_SCORE_MOD) scores reach the softmax in natural-log units
     * (native ALiBi: raw or capped like the built-in path's, the bias in them or in alibi_pre/_post) */
    const float mul = KVA__HAS_SCORE_MOD && !KVA__HP_ALIBI ? KVA__PF_LOG2E : capped ? 1.0f : a.scale_log2;
    if (cw == ncw - 1) turn_pass();

    /* Q buffers: with G::XITEM the next work item's Q lands in another buffer during this
     * item (the scheduler warp's copies), so the next item's first Q K^T can be issued together
     * with this item's last P V (below) instead of after this item's epilogue. */
    /* my warpgroup's 64 Q rows of work item w -> buffer b (rows past the item are zero), where
     * no tensor copy brings them (q_by_tma) */
    auto load_q = [&](const kva__hp_work &w, int b) {
        const T *qg = (const T *)a.q;
        const int rows_w = w.it.q_tokens * g;
        /* (this buffer last held the staged O of an earlier item -- Q_BUFS back: the mbarrier
         * chain through
         * the store and scheduler warps -- o_full, q_empty, q_full -- already orders those writes
         * before these copies; racecheck does not follow that chain and reported the pair, so a
         * warpgroup barrier states the order where it can see it: one per item whose Q the
         * consumers copy, i.e. a sequence's partial last item) */
        kva__bar_sync(1 + cw, 128);
#pragma unroll 4
        for (int j = 0; j < 64 * CPR / 128; ++j) {
            const int i = wt + j * 128, r = cw * 64 + i / CPR, c = i % CPR;
            const bool ok = r < rows_w && c * 8 < a.head_dim; /* (zeros past the head dim) */
            const int t = ok ? kva__hp_div_group(r, g_magic) : 0, hh = ok ? r - t * g : 0;
            const T *src = qg + (int64_t)(w.it.q_row0 + t) * a.q_st + (int64_t)(w.kh * g + hh) * a.q_sh + c * 8;
            kva__pf_cp16(q_buf(b) + kva__pf_tile_off<D * 2, ROWS, true>(r, c), ok ? (const void *)src : a.q, ok);
        }
        kva__cp_async_commit();
        kva__cp_async_wait<0>();
        kva__fence_proxy_async();
        kva__bar_sync(1 + cw, 128);
    };
    /* item m's buffer passed on (and, by a tensor copy, its Q landed) */
    auto q_wait = [&](int m) { kva__mbar_wait(q_full(m % G::Q_BUFS), (uint32_t)(m / G::Q_BUFS) & 1u); };
    /* item m (record w) whose Q no tensor copy brings: the buffer passed on, then my copies
     * (after the previous item's epilogue, where O holds no values: in the item's own top they
     * spilled registers at d128) */
    auto q_own = [&](int m, const kva__hp_work &w) {
        if (q_by_tma(w)) return;
        q_wait(m);
        load_q(w, m % G::Q_BUFS);
    };

    /* the item whose scores the softmax works on; its row positions and mask ranges */
    int q_last = 0, rows = 0, qlo[2], qhi[2];
    int alibi_q[2] = {0, 0};              /* native ALiBi: row h's query position */
    float alibi_slope[2] = {0.0f, 0.0f};  /* and its head's slope, log2 units */
    uint32_t alibi_a[4] = {0u, 0u, 0u, 0u}; /* the extra k-step's A fragment (see the top) */
    float alibi_ffma[2] = {0.0f, 0.0f};     /* row h's slope in score units where FFMAs add its bias */
    /* my rows' slopes for KV head kh (alibi_slope), and as the A fragment of the extra k-step:
     * columns 0-2 of row r hold its slope / scale in three 16-bit pieces (lane % 4 == 0: columns
     * 0, 1; == 1: column 2). A row whose bias the tensor cores cannot add -- with a soft cap (the
     * bias follows the cap), or |slope / scale| >= 2^14 (f16 pieces would overflow: a tiny
     * sm_scale) -- has zero pieces and its slope in alibi_ffma instead (log2 units with a cap,
     * raw-score units without). Set before a Q K^T of an item of kh is issued, never while one
     * runs, and never before the last softmax of an item of another head. */
    auto alibi_rows = [&](int kh) {
        if constexpr (KVA__HP_ALIBI) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row_base + (lane >> 2) + 8 * h, t = kva__hp_div_group(r, g_magic);
                const float slope = ((const float *)a.mod_user)[kh * g + (r - t * g)] * KVA__PF_LOG2E;
                const float raw = slope / a.scale_log2;
                const bool tensor = KVA__HP_ALIBI_TENSOR && !capped && fabsf(raw) < 16384.0f; /* (NaN: FFMAs) */
                alibi_slope[h] = slope;
                alibi_ffma[h] = tensor ? 0.0f : capped ? slope : raw;
                const float s = tensor ? raw : 0.0f;
                const float p0 = kva__to_f32(kva__from_f32<T>(s)), r1 = s - p0;
                const float p1 = kva__to_f32(kva__from_f32<T>(r1)), p2 = r1 - p1;
                alibi_a[h] = (lane & 3) == 0 ? kva__pack2<T>(p0, p1) : (lane & 3) == 1 ? kva__pack2<T>(p2, 0.0f) : 0u;
            }
        }
    };
    /* wk's row positions and masks (rows_ready: alibi_rows(wk.kh) already ran, in the tail) */
    auto item_setup = [&](bool rows_ready) {
        q_last = wk.it.q_pos0 + wk.it.q_tokens - 1;
        rows = wk.it.q_tokens * g;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int qp = wk.it.q_pos0 + kva__hp_div_group(row_base + (lane >> 2) + 8 * h, g_magic);
            /* the keys row h's mask lets through (before the block's own range): [qlo, qhi)
             * (literals: the run-time compiler of variants has no <stdint.h> limits) */
            const int64_t wl = a.window_left >= 0 ? (int64_t)qp - a.window_left : -2147483647 - 1;
            qlo[h] = (int)(wl > -2147483647 - 1 ? wl : -2147483647 - 1);
            qhi[h] = a.causal ? qp + 1 : 2147483647;
            alibi_q[h] = qp;
        }
        if (!rows_ready) alibi_rows(wk.kh);
    };
    /* the tiles of item w that my warpgroup works on (G::SKIP): none where it holds no row, and
     * under a causal mask only those with a key at or before its last row's position -- tile j's
     * first unmasked key is max(lo_al + j BN, lo), so they are the first (kmax - lo_al) / BN + 1;
     * the others' keys are all masked for my rows, which therefore end as they would have */
    auto own_tiles = [&](const kva__hp_work &w) -> int {
        if constexpr (!G::SKIP) return w.n_tiles;
        const int rows_w = w.it.q_tokens * g, first_row = cw * 64;
        if (first_row >= rows_w) return 0;
        if (!a.causal) return w.n_tiles;
        const int last_row = first_row + 63 < rows_w ? first_row + 63 : rows_w - 1;
        const int kmax = w.it.q_pos0 + kva__hp_div_group(last_row, g_magic);
        if (kmax < w.lo) return 0;
        const int n = (kmax - w.lo_al) / G::BN + 1;
        return n < w.n_tiles ? n : w.n_tiles;
    };

    float o_acc[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[dt][e] = 0.0f;
    float m_st[2] = {-INFINITY, -INFINITY}, l_st[2] = {0.0f, 0.0f};
    float sc[NT][4];
    uint32_t pa[BN / 16][4];

    /* wgmma descriptors: my warpgroup's Q rows in buffer b, stage 0's K and V (a stage s is
     * s * 2 * TILE_BYTES further on); each wgmma's operand is an offset from these */
    const uint64_t k_desc0 = kva__wgmma_desc(k_stage(0), 16, 1024);
    /* (unswizzled: 8-row core matrices 128 bytes apart along N; k-columns 8-15 read the same rows) */
    const uint64_t pos_desc = kva__wgmma_desc_plain(pos_s, 0, 128);
    const uint64_t v_desc0 = kva__wgmma_desc(v_stage(0), KVA__PF_V_LBO(BN), KVA__PF_V_SBO(BN));
    auto q_desc = [&](int b) { return kva__wgmma_desc(q_buf(b) + (uint32_t)cw * 64 * 128, 16, 1024); };
    auto issue_qk = [&](int s, uint64_t qd) {
        const uint64_t kd0 = kva__wgmma_desc_add(k_desc0, (uint32_t)(s * 2 * G::TILE_BYTES));
        kva__wgmma_fence();
#pragma unroll
        for (int kd = 0; kd < DW / 16; ++kd) {
            const uint32_t blk = (uint32_t)(kd >> 2);
            const uint64_t da = kva__wgmma_desc_add(qd, blk * ROWS * 128 + (kd & 3) * 32);
            const uint64_t db = kva__wgmma_desc_add(kd0, blk * BN * 128 + (kd & 3) * 32);
            kva__wgmma_ss<T, BN>(&sc[0][0], da, db, kd > 0);
        }
        if constexpr (KVA__HP_ALIBI && KVA__HP_ALIBI_TENSOR) kva__wgmma_rs_kmajor<T, BN>(&sc[0][0], alibi_a, pos_desc);
        kva__wgmma_commit();
    };
    auto issue_pv = [&](int s) {
        const uint64_t vd0 = kva__wgmma_desc_add(v_desc0, (uint32_t)(s * 2 * G::TILE_BYTES));
        kva__wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const uint64_t db = kva__wgmma_desc_add(vd0, kk * 16 * 128);
            kva__wgmma_rs<T, DW>(&o_acc[0][0], pa[kk], db);
        }
        kva__wgmma_commit();
    };

    /* mask + online softmax of tile j of wk in sc (log2 units); returns per-row alpha */
    auto softmax = [&](int j, float alpha_r[2]) -> bool {
        const int lo = wk.lo, hi = wk.hi;
        const kva__hp_tile t = kva__hp_tile_of<BN>(G::REVERSE ? wk.n_tiles - 1 - j : j, lo, wk.lo_al, hi, paged);
        const bool need_mask = t.kb + BN > hi || t.kb < t.kmin || (a.causal && t.kb + BN - 1 > wk.it.q_pos0) ||
                               (a.window_left >= 0 && (int64_t)t.kb < (int64_t)q_last - a.window_left);
        /* (need_mask) the columns [lo_c, hi_c) of my scores that row h sees, c = 8 nt + e % 2 for
         * key kb + 2 (lane % 4) + c (the mask below, and RAW_MAX's max before it: one rule) */
        auto row_cols = [&](int h, int &lo_c, int &hi_c) {
            const int k_lo = max(t.kmin, qlo[h]);
            const int k_hi = max(k_lo, min(hi, qhi[h]));
            const int base = t.kb + 2 * (lane & 3);
            lo_c = k_lo - base;
            hi_c = k_hi - base;
        };
        /* an overflowed dot product: capped (tanh saturates, as in the float64 reference), or
         * NaN without a cap -- never a mask (as prefill_kernel.cuh, which turns -inf into NaN
         * and lets +inf make the row NaN through its max; here both become NaN before a
         * variant's modifier sees them) */
        /* (RAW_MAX) each row's capped max from the max of its visible raw scores by one tanh
         * (monotonic: the same float as that score's), so that the max's tree and shuffles need
         * not wait for the scores' tanh (-inf where the row sees no key of the tile) */
        float cap_mx[2] = {-INFINITY, -INFINITY};
        if constexpr (RAW_MAX) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float tr[NT];
                bool row_sees_tile = true;
                if (need_mask) { /* (the mask below, on the raw scores) */
                    int lo_c, hi_c;
                    row_cols(h, lo_c, hi_c);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const int c = nt * 8;
                        const float x0 = c >= lo_c && c < hi_c ? sc[nt][2 * h] : -INFINITY;
                        const float x1 = c + 1 >= lo_c && c + 1 < hi_c ? sc[nt][2 * h + 1] : -INFINITY;
                        tr[nt] = fmaxf(x0, x1);
                    }
                    /* (the quad's columns together: [lo_c, hi_c) shifted back to the tile's 0..BN) */
                    const int shift = 2 * (lane & 3);
                    row_sees_tile = max(lo_c + shift, 0) < min(hi_c + shift, BN);
                } else {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) tr[nt] = fmaxf(sc[nt][2 * h], sc[nt][2 * h + 1]);
                }
                float r = kva__hp_tree<NT, true>(tr);
                r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, 1));
                r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, 2));
                cap_mx[h] = row_sees_tile ? a.cap_log2 * kva__pf_tanh_fast(r * a.cap_inv_scale) : -INFINITY;
            }
        }
        if constexpr (RAW_MAX) {
            /* the last 3/4 of my scores' tanh made to depend on the max (x 0 + inv, in asm: not
             * folded), so that the max's tanh enters the unit's queue ahead of them and the
             * exponentials can follow the tanh (left alone, ptxas issued all 64 first) */
            /* (finite, so that dep x 0 is 0 and inv_late is inv: a row seeing no key has -inf,
             * a cap whose log2 overflowed +inf) */
            const float dep = fminf(fmaxf(fmaxf(cap_mx[0], cap_mx[1]), -3.402823466e38f), 3.402823466e38f);
            float inv_late;
            asm("fma.rn.f32 %0, %1, 0f00000000, %2;" : "=f"(inv_late) : "f"(dep), "f"(a.cap_inv_scale));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    sc[nt][e] = a.cap_log2 * kva__pf_tanh_fast(sc[nt][e] * (nt >= NT / 4 ? inv_late : a.cap_inv_scale));
        } else if (capped) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[nt][e] = a.cap_log2 * kva__pf_tanh_fast(sc[nt][e] * a.cap_inv_scale);
        }
        if (need_mask) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                /* the keys row h may see, [k_lo, k_hi). My score (nt, e) is key kb + 2 (lane % 4)
                 * + c with c = 8 nt + e % 2 a constant, so the bounds move to my lane's offsets
                 * and each score takes one compare with an immediate -- two where some lane of
                 * the warp has a lower bound inside the tile (a window, a paged first tile, the
                 * shifted last tile of a ragged block); the diagonal tile of a causal mask has
                 * only the upper one. An overflowed dot product (+-inf) becomes NaN by an FMA
                 * (0 x inf), never a mask. */
                int lo_c, hi_c;
                row_cols(h, lo_c, hi_c);
                if (__any_sync(0xffffffffu, lo_c > 0)) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            const int c = nt * 8 + (e & 1);
                            const float x = capped ? sc[nt][e] : kva__pf_nan_if_inf(sc[nt][e]);
                            sc[nt][e] = c >= lo_c && c < hi_c ? x : -INFINITY;
                        }
                } else {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            const int c = nt * 8 + (e & 1);
                            const float x = capped ? sc[nt][e] : kva__pf_nan_if_inf(sc[nt][e]);
                            sc[nt][e] = c < hi_c ? x : -INFINITY;
                        }
                }
            }
        }
        /* native ALiBi, row h's bias slope * (key - q) for key = kb + 2 (lane % 4) + 8 nt + e % 2:
         * where the tensor cores added slope * (key - kb) to the raw scores, the tile's per-row
         * constant slope * (kb - q) (log2 units) is added to the row max and the exponent's
         * offset (alibi_post); elsewhere one FFMA per score adds slope * (8 nt + e % 2) (an
         * immediate) and my lane's constant slope * (kb + 2 (lane % 4) - q), in the scores'
         * units (log2 after a cap), goes into my lane's max before the row's shuffles and into
         * the exponent's offset (alibi_pre). Masked scores stay -inf. */
        float alibi_pre[2] = {0.0f, 0.0f}, alibi_post[2] = {0.0f, 0.0f};
        if constexpr (KVA__HP_ALIBI) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (KVA__HP_ALIBI_TENSOR && alibi_ffma[h] == 0.0f) {
                    alibi_post[h] = alibi_slope[h] * (float)(t.kb - alibi_q[h]);
                } else {
                    alibi_pre[h] = alibi_ffma[h] * (float)(t.kb + 2 * (lane & 3) - alibi_q[h]);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e)
                            sc[nt][e] = fmaf(alibi_ffma[h], (float)(nt * 8 + (e & 1)), sc[nt][e]);
                }
            }
        } else if constexpr (KVA__HAS_SCORE_MOD) /* a variant's modifier (prefill_kernel.cuh) */
            kva__pf_apply_score_mod<1, NT>(a, &sc, need_mask, capped, t.kb, wk.it.q_pos0, q_last,
                                           row_base + (lane >> 2), rows, wk.kh, g, lane, wk.lo, wk.hi);
#ifdef KVA__HP_NO_SOFTMAX /* experiment: the matrix products and the pipeline alone */
        return false;
#endif
        bool rescale = false;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            /* max and sum as trees: a chain of NT dependent instructions per row would put
             * its latency on the critical path (the softmax runs alone on its warp) */
            float tr[NT];
            if constexpr (!RAW_MAX) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) tr[nt] = fmaxf(sc[nt][2 * h], sc[nt][2 * h + 1]);
            }
            float mx = RAW_MAX ? cap_mx[h] : kva__hp_tree<NT, true>(tr); /* (RAW_MAX: see above) */
            if constexpr (KVA__HP_ALIBI) mx += alibi_pre[h];
            if constexpr (!RAW_MAX) {
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            }
            float ms = __fmul_rn(mx, mul);
            if constexpr (KVA__HP_ALIBI) ms = __fadd_rn(ms, alibi_post[h]);
            /* as prefill_kernel.cuh: a row whose visible scores all left f32 range keeps
             * -FLT_MAX as its max, which the epilogue turns into NaN */
            if (ms == -INFINITY && (mx != -INFINITY || (!KVA__HAS_SCORE_MOD && !need_mask)))
                ms = -3.402823466e38f;
            /* lazy rescaling: the row keeps its old max while the new one exceeds it by at most
             * KVA__HP_RESCALE_SLACK (log2 units), so O and l need no rescale (exact: O, l and the
             * LSE all use the same max); a tile that raises it further rescales as before. Only
             * below |max| 2^26, where max + slack is exact and the exponent's FMA (unrounded
             * product) adds at most 2 more: P <= 2^10. Above, floats are 8+ apart, so the slack
             * would round up to 16 and P overflow f16: there the max is exact as before (slack 0
             * is fmaxf, -inf, -FLT_MAX and NaN included), and so is the NaN rule at 2^28. */
            const float slack = fabsf(m_st[h]) < 0x1p26f ? (float)KVA__HP_RESCALE_SLACK : 0.0f;
            const float m_new = ms > m_st[h] + slack ? ms : m_st[h];
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = exp2f(m_st[h] - m_use);
            m_st[h] = m_new;
            const float sub = KVA__HP_ALIBI ? fmaf(alibi_pre[h], mul, alibi_post[h]) - m_use : -m_use;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float x0 = fmaf(sc[nt][2 * h], mul, sub), x1 = fmaf(sc[nt][2 * h + 1], mul, sub);
                constexpr int EXP_FMA = KVA__HP_EXP_FMA(D);
                const bool fma_pipe = EXP_FMA > 0 && nt % (EXP_FMA > 0 ? EXP_FMA : 1) == 0;
                const float p0 = fma_pipe ? kva__hp_exp2_fma(x0) : exp2f(x0);
                const float p1 = fma_pipe ? kva__hp_exp2_fma(x1) : exp2f(x1);
                sc[nt][2 * h] = p0;
                sc[nt][2 * h + 1] = p1;
                tr[nt] = p0 + p1;
            }
            l_st[h] = l_st[h] * alpha + kva__hp_tree<NT, false>(tr);
            alpha_r[h] = alpha;
            rescale |= alpha != 1.0f;
        }
        return __any_sync(0xffffffffu, rescale);
    };
    auto pack_p = [&]() {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            pa[kk][0] = kva__pack2<T>(sc[2 * kk][0], sc[2 * kk][1]);
            pa[kk][1] = kva__pack2<T>(sc[2 * kk][2], sc[2 * kk][3]);
            pa[kk][2] = kva__pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pa[kk][3] = kva__pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
        }
    };
    /* (G::EARLY_Q) my warpgroup read Q buffer b for the last time: to the store warp, which
     * passes it on to the scheduler (nothing staged there; see the epilogue). (After a
     * wgmma.wait_group, .sync.aligned: every lane of the warp is past it, no __syncwarp needed --
     * without the one it had in the loop's last iteration the d256 rows ran +0.4..+1.4%, v6.39.)
     * -DKVA__HP_QDONE_LATE=1: after the loop instead (comparisons) */
    auto q_done = [&](int b) {
        if constexpr (G::EARLY_Q)
            if (lane == 0) kva__mbar_arrive(o_full(b));
    };
    /* S_0 = Q K_0^T of wk alone (its first tile, at global tile index gt), softmax, P */
    auto first_tile = [&](uint32_t gt0, int b, bool last) {
        const int s0 = (int)(gt0 % G::STAGES);
        kva__mbar_wait(full_k(s0), (gt0 / G::STAGES) & 1u);
        turn_wait();
        issue_qk(s0, q_desc(b));
        turn_pass();
        kva__wgmma_wait<0>();
        if (last) q_done(b);
        kva__pf_fence_regs<NT * 4>(&sc[0][0]);
        release(empty_k(s0));
        float alpha_r[2];
        (void)softmax(0, alpha_r); /* O is zero: nothing to rescale */
        pack_p();
    };

    uint32_t gt = 0; /* tiles consumed so far */
    uint32_t oring_n = 0; /* (G::ORING) O blocks my warpgroup staged so far */
    int qb = 0;      /* the buffer holding wk's Q */
    int m = 0;       /* wk is this block's m-th (KV head, work item) */
    kva__hp_work nx; /* the next one (read at this one's tail) */
    bool s0_done = false; /* wk's first tile already went through the softmax (the last item's tail) */
    /* the next item's record: with G::XITEM read at the top of this one where published (its
     * tail needs it); without, after this one's epilogue (live across it, it spilled at d256) */
    bool have_nx = false;
    /* (G::XITEM: read early where published, else in the tail: waiting for it at the item's
     * top stalled the consumers where the scheduler had not yet drawn it) */
    bool nx_pending = false;
    /* (G::XITEM) the record as loaded early. Loaded whole (-DKVA__HP_LANE_RECORDS=0), every
     * word goes into a uniform register right behind the loads in the SASS (2026-11-30; empty
     * asm statements before its use in the tail do not stop it), so the warps wait there for
     * the L2 round trip: ~600 cycles of the gap between items, which the lane records (the
     * library's default; variant builds keep the four loads) and the shared-memory slots
     * remove (prefill_kernels.h, bench/NOTES.md v6.41) */
#if KVA__HP_LANE_RECORDS
    /* (KVA__HP_LANE_RECORDS, prefill_kernels.h) the early record as one word per lane -- word
     * lane % 16 -- loaded by each lane from its own address, so that no uniform move waits for
     * the load; the tail gathers the words by shuffles */
    static_assert(sizeof(kva__hp_work) <= 16 * 4, "one record word per lane");
    uint32_t nx_lane = 0u;
    kva__hp_work nx_static{}; /* (the static walk's record: computed, uniform) */
    auto try_fetch_early = [&](int me) -> bool {
        if (!dyn) {
            work_fetch(me, nx_static);
            return true;
        }
        const int i = (me - 1) % G::RING;
        const uint32_t parity = (uint32_t)((me - 1) / G::RING) & 1u;
        if (!__any_sync(0xffffffffu, kva__mbar_test(slot_full(i), parity))) return false;
        kva__mbar_wait(slot_full(i), parity);
        const unsigned *src = a.sched + KVA__SCHED_HEAD + (size_t)blockIdx.x * a.sched_ring + 16 * i;
        asm volatile("ld.global.cg.u32 %0, [%1];\n" : "=r"(nx_lane) : "l"(src + (lane & 15)));
        return true;
    };
    auto take_early = [&]() {
        if (!dyn) {
            nx = nx_static;
            return;
        }
        int *wd = reinterpret_cast<int *>(&nx);
#pragma unroll
        for (int k = 0; k < (int)(sizeof(kva__hp_work) / 4); ++k) wd[k] = (int)__shfl_sync(0xffffffffu, nx_lane, k);
    };
#else
    kva__hp_work nx_early{};
    auto try_fetch_early = [&](int me) -> bool { return work_try_fetch(me, nx_early); };
    auto take_early = [&]() {
        int *wd = reinterpret_cast<int *>(&nx_early);
#pragma unroll
        for (int k = 0; k < (int)(sizeof(kva__hp_work) / 4); ++k) asm volatile("" : "+r"(wd[k]));
        nx = nx_early;
    };
#endif
    if constexpr (G::XITEM) nx_pending = !try_fetch_early(1);
    q_own(0, wk);
    int trace_n = 0;      /* (KVA__HP_TRACE: items so far) */
    for (;;) {
        /* (the tile and buffer indices feed the descriptors: after the cross-item tail's
         * branches the compiler no longer knew them to be uniform) */
        gt = KVA__HP_BCAST(gt);
        qb = KVA__HP_BCAST(qb);
        const int n_tiles = KVA__HP_BCAST(wk.n_tiles);
        /* (without G::SKIP the same variable: the d = 64 kernel measured 2-3% slower with the
         * drain loops and the count compiled in, though they never ran) */
        const int n_own = G::SKIP ? KVA__HP_BCAST(own_tiles(wk)) : n_tiles;
        const uint64_t qd = q_desc(qb);
        KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_TOP, clock64());
        KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_TILES, n_own); /* (the tiles my warpgroup works on) */
        if (!s0_done) {
            item_setup(false);
            q_wait(m);
            KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_Q, clock64());
            if (n_own > 0) first_tile(gt, qb, n_own == 1);
            else q_done(qb);
        } else {
            KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_Q, clock64());
        }
        KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_S0, clock64());
        for (int j = 1; j < n_own; ++j) {
            const int s = (int)((gt + j) % G::STAGES), sp = (int)((gt + j - 1) % G::STAGES);
            kva__mbar_wait(full_k(s), ((gt + j) / G::STAGES) & 1u);
            kva__mbar_wait(full_v(sp), ((gt + j - 1) / G::STAGES) & 1u);
            turn_wait();
            issue_qk(s, qd);
            kva__pf_fence_regs<DT * 4>(&o_acc[0][0]);
            issue_pv(sp);
            turn_pass();
            kva__wgmma_wait<1>(); /* S_j landed; P V still running */
            kva__pf_fence_regs<NT * 4>(&sc[0][0]);
            release(empty_k(s));
            if (!KVA__HP_QDONE_LATE && j == n_own - 1) q_done(qb);
            float alpha_r[2];
            const bool rescale = softmax(j, alpha_r);
            /* pin the softmax before the wait: left alone, the compiler sinks half of it below
             * the wait for P V, which then stalls the warp with half the work still to do */
            kva__pf_fence_regs<NT * 4>(&sc[0][0]);
            kva__pf_fence_regs<2>(l_st);
            kva__pf_fence_regs<2>(alpha_r);
            kva__wgmma_wait<0>();
            kva__pf_fence_regs<DT * 4>(&o_acc[0][0]);
            kva__pf_fence_regs_u<BN / 4>(&pa[0][0]);
            release(empty_v(sp));
            if (rescale) {
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
                    o_acc[dt][0] *= alpha_r[0];
                    o_acc[dt][1] *= alpha_r[0];
                    o_acc[dt][2] *= alpha_r[1];
                    o_acc[dt][3] *= alpha_r[1];
                }
            }
            pack_p();
        }

        if (KVA__HP_QDONE_LATE && n_own >= 2) q_done(qb);
        KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_LOOP, clock64());
        /* ---- the tail: this item's last P V, with (G::XITEM) the next item's S_0 ---- */
        const kva__pf_item it = wk.it; /* (the epilogue's copy: wk may move on below) */
        const int kh = wk.kh, rows_o = rows;
        /* (only where the next Q comes by a tensor copy: the consumers' own copies of it here
         * spilled registers at d128) */
        if constexpr (G::XITEM) {
            if (nx_pending) work_fetch(m + 1, nx);
            else take_early();
            have_nx = nx.kh >= 0;
        }
        const bool nx_s0 = G::XITEM && have_nx && (G::SKIP ? own_tiles(nx) : nx.n_tiles) > 0 && n_own > 0 && q_by_tma(nx);
        const uint32_t gn = gt + (uint32_t)n_tiles; /* the next item's first tile */
        const uint32_t gl = G::SKIP ? gt + (uint32_t)n_own - 1u : gn - 1u; /* my last tile (n_own > 0) */
        const int sl = (int)(gl % G::STAGES), sn = (int)(gn % G::STAGES);
        /* (G::SKIP) the K tiles I skip: landed, then released, before any later K tile is waited
         * for -- the next item's first may need one's stage. Their V tiles after my last P V
         * (below): a V tile past my last one may need that one's stage. Without rows in the item
         * (n_own == 0, any number of tiles) K and V tile by tile: the other warpgroups wait for
         * V tiles whose stages only my releases free, and the K producer for their K releases. */
        if constexpr (G::SKIP)
            for (int j = n_own; j < n_tiles; ++j) {
                const uint32_t t = gt + (uint32_t)j;
                kva__mbar_wait(full_k((int)(t % G::STAGES)), (t / G::STAGES) & 1u);
                release(empty_k((int)(t % G::STAGES)));
                if (n_own == 0) {
                    kva__mbar_wait(full_v((int)(t % G::STAGES)), (t / G::STAGES) & 1u);
                    release(empty_v((int)(t % G::STAGES)));
                }
            }
        float m_o[2] = {m_st[0], m_st[1]};
        /* the finished rows' sums (the NaN rule: kvattn.h) and their inverses, before the tail's
         * waits: the shuffles' and the reciprocal's latency off the epilogue's path */
        float l_r[2], inv_r[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_st[h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (!(fabsf(m_o[h]) < 268435456.0f) && m_o[h] != -INFINITY) l = NAN;
            l_r[h] = l;
            inv_r[h] = kva__softmax_inv(l);
        }
        kva__pf_fence_regs<2>(inv_r);
        /* (two straight paths: the compiler serialises every wgmma when a conditional read of
         * sc may sit between an issue and its wait) */
        if (nx_s0) {
            /* (this item's last Q K^T and softmax are done; the slope loads overlap the waits) */
            alibi_rows(nx.kh);
            kva__mbar_wait(full_v(sl), (gl / G::STAGES) & 1u);
            q_wait(m + 1);
            kva__mbar_wait(full_k(sn), (gn / G::STAGES) & 1u);
            turn_wait();
            issue_qk(sn, q_desc(qb + 1 == G::Q_BUFS ? 0 : qb + 1));
            kva__pf_fence_regs<DT * 4>(&o_acc[0][0]);
            issue_pv(sl);
            turn_pass();
            /* the next item's S_0 landed, P V still runs: its softmax under this P V */
            kva__wgmma_wait<1>();
            kva__pf_fence_regs<NT * 4>(&sc[0][0]);
            release(empty_k(sn));
            wk = nx;
            item_setup(true);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                m_st[h] = -INFINITY;
                l_st[h] = 0.0f;
            }
            float alpha_r[2];
            (void)softmax(0, alpha_r); /* its O starts at zero: nothing to rescale */
            kva__pf_fence_regs<NT * 4>(&sc[0][0]);
            kva__pf_fence_regs<2>(l_st);
            kva__wgmma_wait<0>();
            kva__pf_fence_regs<DT * 4>(&o_acc[0][0]);
            kva__pf_fence_regs_u<BN / 4>(&pa[0][0]);
            release(empty_v(sl));
            /* (packed before the epilogue: P's 32 registers live across it instead of S's 64) */
            pack_p();
        } else if (n_own > 0) {
            kva__mbar_wait(full_v(sl), (gl / G::STAGES) & 1u);
            turn_wait();
            kva__pf_fence_regs<DT * 4>(&o_acc[0][0]);
            issue_pv(sl);
            turn_pass();
            kva__wgmma_wait<0>();
            kva__pf_fence_regs<DT * 4>(&o_acc[0][0]);
            kva__pf_fence_regs_u<BN / 4>(&pa[0][0]);
            release(empty_v(sl));
        }

        if constexpr (G::SKIP)
            for (int j = n_own > 0 ? n_own : n_tiles; j < n_tiles; ++j) {
                const uint32_t t = gt + (uint32_t)j;
                kva__mbar_wait(full_v((int)(t % G::STAGES)), (t / G::STAGES) & 1u);
                release(empty_v((int)(t % G::STAGES)));
            }
        KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_TAIL, clock64());
        /* ---- epilogue: normalise, write o + lse, or the partial state ---- */
        const bool split = it.key_beg > 0 || it.key_end < it.kv_len;
        const int Hq = a.num_qo_heads;
        const uint32_t q_o = q_buf(qb); /* this item's Q rows: free since its last Q K^T */
        /* O through shared memory: staged in my warpgroup's Q rows and written by the store
         * warp's tensor copies (bench/NOTES.md, v6.17, v6.28). Needs the O map (16-byte aligned
         * o and strides, a group dividing 64: qo_maps & 2) and my whole 64-row part of an
         * unsplit item (else the direct stores below). At d64 too since the store warp writes
         * the staged rows (2-4% on rows of 512-2048 tokens, level at 16k: bench/NOTES.md; the
         * consumers' own copies of staged rows had measured 3-6% slower at 16k causal). */
        static_assert(sizeof(T) == 2, "the Hopper kernel is built for 16-bit elements");
        const bool staged = __shfl_sync(0xffffffffu, D >= KVA__HP_STAGED_MIN_D && !split && (ha.qo_maps & 2) && g_divides_64 && rows_o >= (cw + 1) * 64, 0);
        /* (o_staged's test, which the store warp makes) */
        const int d0 = 2 * (lane & 3);
        /* (the staged path first and in one piece: with the direct and partial stores between
         * its two rows, the item's one pass through it jumped over cold code -- instruction
         * fetch stalls, bench/NOTES.md v6.34) */
        if (staged) {
            /* four 8 x 8 blocks per stmatrix (rows h = 0 / 1 of column blocks dp, dp + 1): the
             * accumulator fragment is stmatrix's own layout; lanes 8 i .. 8 i + 7 give block i's
             * row addresses (16 bytes each, swizzled as the store warp's copies expect) */
            const int blk = lane >> 3;
            const int br = row_base + 8 * (blk & 1) + (lane & 7);
            /* (kva__pf_tile_off's swizzle for chunk dp + (blk >> 1), dp even: the chunk's low bits
             * are (dp & 7) ^ ((blk >> 1) ^ (br & 7)), so one XOR with an immediate per block pair) */
            const uint32_t st_row = q_o + (uint32_t)(br * 128);
            const int st_x = (blk >> 1) ^ (br & 7);
            /* (the two forms below pack alike; written out twice so that the Q-buffer form's
             * code stays as measured) */
            if constexpr (G::ORING) {
                /* my part's column blocks into my O ring: block c is my (oring_n + c)-th (see
                 * oring_full) */
                static_assert(!G::ORING || DT == 8 * (D / 64), "the O ring holds whole column blocks");
#pragma unroll
                for (int c = 0; c < D / 64; ++c) {
                    if (c >= o_blocks) break;
                    const uint32_t k = oring_n + (uint32_t)c;
                    const int i = (int)(k % G::O_SLOTS);
                    kva__mbar_wait(oring_empty(cw, i), ((k / G::O_SLOTS) & 1u) ^ 1u);
                    const uint32_t row = oring_slot(cw, i) + (uint32_t)((br - cw * 64) * 128);
#pragma unroll
                    for (int dq = 0; dq < 8; dq += 2) {
                        const int dp = 8 * c + dq;
                        const uint32_t v0 = kva__pack2<T>(o_acc[dp][0] * inv_r[0], o_acc[dp][1] * inv_r[0]);
                        const uint32_t v1 = kva__pack2<T>(o_acc[dp][2] * inv_r[1], o_acc[dp][3] * inv_r[1]);
                        const uint32_t v2 = kva__pack2<T>(o_acc[dp + 1][0] * inv_r[0], o_acc[dp + 1][1] * inv_r[0]);
                        const uint32_t v3 = kva__pack2<T>(o_acc[dp + 1][2] * inv_r[1], o_acc[dp + 1][3] * inv_r[1]);
                        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                         row + (uint32_t)((dq ^ st_x) << 4)),
                                     "r"(v0), "r"(v1), "r"(v2), "r"(v3)
                                     : "memory");
                    }
                    kva__fence_proxy_async(); /* (the store warp's tensor copy reads it) */
                    __syncwarp();
                    if (lane == 0) kva__mbar_arrive(oring_full(cw, i));
                }
            } else {
#pragma unroll
                for (int dp = 0; dp < DT; dp += 2) {
                    const uint32_t v0 = kva__pack2<T>(o_acc[dp][0] * inv_r[0], o_acc[dp][1] * inv_r[0]);
                    const uint32_t v1 = kva__pack2<T>(o_acc[dp][2] * inv_r[1], o_acc[dp][3] * inv_r[1]);
                    const uint32_t v2 = kva__pack2<T>(o_acc[dp + 1][0] * inv_r[0], o_acc[dp + 1][1] * inv_r[0]);
                    const uint32_t v3 = kva__pack2<T>(o_acc[dp + 1][2] * inv_r[1], o_acc[dp + 1][3] * inv_r[1]);
                    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                     st_row + (uint32_t)((dp >> 3) * (ROWS * 128) + (((dp & 7) ^ st_x) << 4))),
                                 "r"(v0), "r"(v1), "r"(v2), "r"(v3)
                                 : "memory");
                }
            }
            /* (a staged part's rows are all below rows_o) */
            if (a.lse && (lane & 3) == 0) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = row_base + (lane >> 2) + 8 * h;
                    const int t = kva__hp_div_group(r, g_magic), qh = kh * g + (r - t * g);
                    a.lse[(int64_t)(it.q_row0 + t) * Hq + qh] = kva__softmax_lse(m_o[h], l_r[h]);
                }
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row_base + (lane >> 2) + 8 * h;
                if (r >= rows_o) continue;
                const int t = kva__hp_div_group(r, g_magic), qh = kh * g + (r - t * g);
                kva__pf_store_row<T, DT>(a, it, split, t, qh, d0, lane, o_acc, h, inv_r[h], kva__softmax_lse(m_o[h], l_r[h]));
            }
        }
        KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_STAGED, clock64());
        if (!G::ORING && staged) kva__fence_proxy_async(); /* (the tensor copies read it) */
        if constexpr (G::ORING)
            if (staged) oring_n += (uint32_t)o_blocks;
        /* buffer qb to the store warp (staged or not: its "q empty" frees it for a later Q;
         * with G::EARLY_Q, q_done did after my last Q K^T) */
        __syncwarp();
        if (!G::EARLY_Q && lane == 0) kva__mbar_arrive(o_full(qb));
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_acc[dt][e] = 0.0f;
        KVA__HP_TRACE_AT(1 + cw, trace_n, KVA__HPT_EPILOGUE, clock64());
        ++trace_n;
        gt = gn;

        /* ---- the next item ---- */
        ++m;
        s0_done = nx_s0;
        if constexpr (!G::XITEM) work_fetch(m, nx);
        have_nx = nx.kh >= 0;
        work_done(m);
        KVA__HP_TRACE_AT(1 + cw, trace_n - 1, KVA__HPT_GAP_DONE, clock64());
        if (!have_nx) break;
        if (!nx_s0) wk = nx;
        qb = qb + 1 == G::Q_BUFS ? 0 : qb + 1;
        if constexpr (G::XITEM) nx_pending = !try_fetch_early(m + 1);
        KVA__HP_TRACE_AT(1 + cw, trace_n - 1, KVA__HPT_GAP_NEXT, clock64());
        if (!s0_done) {
            q_own(m, wk);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                m_st[h] = -INFINITY;
                l_st[h] = 0.0f;
            }
        }
    }
    if (cw == 0) turn_wait(); /* the last warpgroup's last pass */
#endif
}

/* The warp-specialised kernel of one element type for a head dim, or NULL. (The capped builds
 * exist only on the layouts of KVA__HP_CAP_BUILT: a reference would instantiate them; elsewhere a
 * capped call gets the one build, whose cap is a run-time flag.) */
#ifndef __CUDACC_RTC__ /* (host code: not in a variant's program) */
template <typename T, int D, int DW, int TURNS>
static const void *kva__hp_fn(int capped) {
    if constexpr (KVA__HP_CAP_BUILT(D))
        if (capped) return (const void *)kva__prefill_hopper_kernel<T, D, DW, TURNS, 1>;
    (void)capped;
    return (const void *)kva__prefill_hopper_kernel<T, D, DW, TURNS>;
}
#endif
#define KVA__HP_CASE(T, D, DW, TURNS)                                                          \
    *smem = kva__hopper_geom<T, D>::SMEM;                                                      \
    *threads = kva__hopper_geom<T, D>::THREADS;                                                \
    *rows = kva__hopper_geom<T, D>::ROWS;                                                      \
    *block_n = kva__hopper_geom<T, D>::BN;                                                     \
    return kva__hp_fn<T, D, DW, TURNS>(capped);
/* (head_dim: a built dim, or 96 -- the d128 layout with d96 products; no_turns: the d128
 * layout's build without the ping-pong turns, elsewhere the one build; capped: on the layouts of
 * KVA__HP_CAP_BUILT the soft-capped build, elsewhere the one build) */
#define KVA__PREFILL_HOPPER_INSTANTIATE(T, NAME)                                               \
    const void *NAME(int head_dim, int no_turns, int capped, int *smem, int *threads, int *rows, int *block_n) { \
        switch (head_dim) {                                                                    \
        case 64: KVA__HP_CASE(T, 64, 64, -1)                                                   \
        case 96:                                                                               \
            if (no_turns) { KVA__HP_CASE(T, 128, 96, 0) }                                      \
            KVA__HP_CASE(T, 128, 96, -1)                                                       \
        case 128:                                                                              \
            if (no_turns) { KVA__HP_CASE(T, 128, 128, 0) }                                     \
            KVA__HP_CASE(T, 128, 128, -1)                                                      \
        case 256: KVA__HP_CASE(T, 256, 256, -1)                                                \
        default: return NULL;                                                                  \
        }                                                                                      \
    }

#endif /* KVA_PREFILL_HOPPER_CUH */
