/*
 * prefill_kernels.h -- what the prefill launcher (prefill_launch.cu) and the context
 * (cuda_context.cu) need from the prefill kernel files: the kernel argument block, the kernel
 * shapes, and the one chooser that both dispatches and answers "supported?". C++ only.
 */
#ifndef KVA_CUDA_PREFILL_KERNELS_H
#define KVA_CUDA_PREFILL_KERNELS_H

#include <stdint.h>
#include <cuda.h> /* CUtensorMap (a type only: the encoder is reached through the runtime) */
#include "kvattn.h"
#include "../plan/workspace_layout.h"

/* threads of the f32 kernel (the tensor-core kernels report theirs through the chooser) */
#define KVA__PREFILL_THREADS 128
/* Packed query rows ((token, query head of the group) pairs) per block: the 128-row kernel for
 * long query runs, the 64-row kernel for short ones. */
#define KVA__PREFILL_ROWS_LARGE 128
#define KVA__PREFILL_ROWS_SMALL 64
/* Consumer warpgroups (64 rows each) of the warp-specialised Hopper kernel at d64
 * (prefill_hopper.cuh): three, so its items have 192 rows there (128 at d128 / d256). The wgmma
 * kernel of the same head dim has as many warpgroups (KVA__PREFILL_WG_WARPS), so that it can run
 * a plan made for the Hopper kernel (the fallback for K/V a tensor map cannot describe, and for
 * variants without a Hopper build); f32 plans run on a kernel of any row count. A variant's
 * NVRTC build gets the library's value (variant_compile.c). -DKVA__HP_CWG_D64=2: two
 * (comparisons). */
#ifndef KVA__HP_CWG_D64
#define KVA__HP_CWG_D64 3
#endif
#define KVA__PREFILL_WG_WARPS(D) ((D) == 64 ? 4 * KVA__HP_CWG_D64 : 8)
/* Q buffers of the warp-specialised Hopper kernel where its cross-item tail runs (d <= 128;
 * prefill_hopper.cuh). Its variant builds get the library's value as well (variant_compile.c):
 * they are launched with the library's shared-memory size. -DKVA__HP_QBUFS=2: two (comparisons). */
#ifndef KVA__HP_QBUFS
#define KVA__HP_QBUFS 3
#endif
/* O staged in per-warpgroup rings of shared-memory slots where there is no cross-item tail (d256;
 * prefill_hopper.cuh, G::ORING), else in the item's Q rows. Its variant builds get the library's
 * value (variant_compile.c): their shared memory differs. -DKVA__HP_ORING=0: the Q rows
 * (comparisons). */
#ifndef KVA__HP_ORING
#define KVA__HP_ORING 1
#endif
/* Work records from the warp-specialised Hopper kernel's scheduler warp to its other warps
 * (prefill_hopper.cuh): in the workspace's per-block ring (0), or (1) in shared-memory slots after
 * the block's mbarriers, so that a fetch of a published record is four shared loads instead of an
 * L2 round trip: in the SASS the fetched words go into uniform registers right behind the loads,
 * and the traces of 2026-11-30 put ~600 cycles of the ~850-cycle gap between items there
 * (bench/NOTES.md). Off: measured on the H200 (2026-11-30, v6.41) ~0.8% faster than the lane
 * records below at d128 32 x 512 and ~1.5% at d64 32 x 512, level at 16k, but racecheck does not
 * follow mbarrier hand-overs of shared memory (the reason the records went to the workspace,
 * prefill_hopper.cuh) and reported 112 errors on the slots. The launch size: d128
 * unchanged (the bytes come out of those reserved for native ALiBi's tile), d64 +64 bytes,
 * d256 +256. Variant builds get the library's value (variant_compile.c): their shared memory
 * differs. (It turns KVA__HP_LANE_RECORDS, below, off.) */
#ifndef KVA__HP_SMEM_RECORDS
#define KVA__HP_SMEM_RECORDS 0
#endif
/* Another way past the same wait, records staying in the workspace (racecheck does not follow
 * mbarrier hand-overs of shared memory, which is why they went there: prefill_hopper.cuh): the
 * consumers' early fetch of the record after next loads one word per lane, each lane from its
 * own address, so the compiler sees no uniform value to move right behind the loads; the tail
 * gathers the words with 14 shuffles, long after they landed (and one register per thread holds
 * the record in flight instead of 14). On: paired on the H200 (2026-11-30, bench/NOTES.md v6.41)
 * the gap between items at d128 went from ~800 to ~440-490 cycles, 32 x 512 rows +0.9..+1.6%,
 * the rest level, racecheck clean. Variant builds keep the four-load fetch (measured
 * slower with lane records at 16k: variant_compile.c). -DKVA__HP_LANE_RECORDS=0: the four-load
 * fetch here too (comparisons). */
#ifndef KVA__HP_LANE_RECORDS
#define KVA__HP_LANE_RECORDS (!KVA__HP_SMEM_RECORDS)
#endif
/* Soft-capped builds of the warp-specialised Hopper kernel (1) on the layouts of KVA__HP_CAP_BUILT
 * (d128 -- d96 too -- and d256), chosen at launch by the call's cap (prefill_launch.cu, hopper_fn):
 * the cap a compile-time property, so the capped build has no run-time cap checks and the other
 * build no soft-cap code at all. Paired on the H200 (2026-11-30, bench/NOTES.md v6.42, trace
 * builds, three alternated rounds, d128 bf16): capped 16k full 9000 -> 8724 us, 16k causal ~4410 ->
 * ~4270, 8 x 2048 -3.2..-3.9%, 32 x 512 causal level (216 -> 215.5); uncapped 32 x 512 and 8 x 2048
 * -0.7..-1.7% (32 x 512 causal 181.6 -> 178.5), 16k noisy in the traces and -1.3..-1.6% in paired
 * cuda_variant_bench rounds. d256 (two rounds): capped level, uncapped 2-5% faster (8 x 2048 full
 * 1444 -> 1376 us). d64 keeps one build, the cap a run-time flag: its capped build spills 376 bytes
 * (the one build 156) and ran 1-12% slower (32 x 512 causal 191 -> 214 us), its uncapped build
 * mixed (32 x 512 -1..-2%, 16k +1..+1.5%); -DKVA__HP_CAP_D64=1 builds them. Variant modules keep
 * the run-time cap (a variant may be used with a cap). 0: one build everywhere (comparisons). */
#ifndef KVA__HP_CAP_KERNEL
#define KVA__HP_CAP_KERNEL 1
#endif
#ifndef KVA__HP_CAP_D64
#define KVA__HP_CAP_D64 0
#endif
/* whether the layout of head dim D has the soft-capped builds (host and kernel: one rule) */
#define KVA__HP_CAP_BUILT(D) (KVA__HP_CAP_KERNEL && ((D) != 64 || KVA__HP_CAP_D64))
/* -DKVA__HP_CAP_RAW_MAX=1: the capped build takes each row's max from the raw scores (tanh is
 * monotonic: the capped max is the cap of the raw max, the same float) and has the max's tanh
 * ahead of 3/4 of the scores' tanh in the special-function unit's queue (with the cap a run-time
 * flag a capped d128 tile ran ~3820 cycles against plain's ~2623, the unit ~54% busy in serial
 * phases: all tanh, the max, the exponentials). Measured (v6.42, against the default's max after
 * the tanh): 16k -3..-4%, but 8 x 2048 causal +4.6% and 32 x 512 causal +10% (238 against 216 us)
 * -- its d128 build spills 8 bytes, reloaded at each item's top, where the post-tanh max's does
 * not; taking the raw max only in tiles without masks, or without the max-first dependency,
 * spilled the same and ran as slow. Off (0): the max after the tanh. */
#ifndef KVA__HP_CAP_RAW_MAX
#define KVA__HP_CAP_RAW_MAX 0
#endif
/* Whether a variant's native ALiBi build of that kernel (KVA__HP_ALIBI) has the consumers' turns
 * on the d128 layout (d64 keeps them, as plain d64 does: unmeasured without). Off: paired on the
 * H200 (2026-11-29, d128 bf16 16k causal, two rounds each) without them ALiBi ran 1.4-1.6%
 * faster, as plain d128 over long items does (v6.39); short causal rows, where plain d128 keeps
 * the turns, are unmeasured. Variant builds get the library's value (variant_compile.c).
 * -DKVA__HP_ALIBI_TURNS=1: with them (comparisons). */
#ifndef KVA__HP_ALIBI_TURNS
#define KVA__HP_ALIBI_TURNS 0
#endif
/* the most packed rows any prefill kernel's block holds */
#define KVA__PREFILL_ROWS_MAX 192

/* Everything a prefill kernel reads that is fixed for a workspace and a layer (a captured graph
 * may bake it in); what changes between plans is read from the workspace's device part. */
typedef struct kva__prefill_args {
    const void *q;
    int64_t q_st, q_sh;           /* elements */
    void *o;
    int64_t o_st, o_sh;
    const void *k, *v;
    int64_t k_st, k_sh;           /* token (slot) and head strides of K, elements */
    int64_t v_st, v_sh;           /* the same for V (ragged tensors may differ; pages do not) */
    int64_t page_stride;          /* paged: elements between physical pages */
    const int32_t *page_indices;  /* paged: the plan's page ids; NULL: contiguous key rows */
    int32_t page_size;
    int32_t page_div_s;           /* key / page_size == (key * page_div_m) >> page_div_s */
    uint64_t page_div_m;
    float *lse;                   /* NULL or f32 [rows][num_qo_heads] */
    const int4 *records;          /* plan records, 2 int4 per work item; NULL: dense call */
    unsigned *sched;              /* plans: the Hopper kernel's work tickets and finished blocks
                                   * (zero between runs), then sched_blocks x sched_ring words of
                                   * work-record slots (workspace_layout.h); NULL: a static walk
                                   * (dense calls) */
    int32_t sched_blocks, sched_ring;
    const int32_t *num_work_dev;  /* graph plans: the work count in the device header */
    int32_t num_work;             /* >= 0: work items (non-graph plans, dense); -1: read the header */
    int32_t qo_tile;              /* query tokens per work item */
    int32_t dense_qo_len, dense_kv_len; /* dense calls (records == NULL) */
    int32_t decode_records;       /* 1: records of a decode plan (one query token per request:
                                   * row = request, position = kv_len - 1; workspace_layout.h) */
    float *partial_o;             /* f32 [work][rows_per_work][D] split partial outputs */
    float *partial_lse;           /* f32 [work][rows_per_work] */
    int64_t rows_per_work;        /* largest qo_tile * num_qo_heads */
    int32_t num_qo_heads, num_kv_heads, group;
    int32_t head_dim;             /* the caller's (<= the kernel's D: columns past it are zero-filled
                                   * on loading and never stored; partial_o rows hold head_dim) */
    int32_t causal, window_left;
    float scale_log2;             /* sm_scale * log2(e) */
    float cap_log2;               /* soft cap * log2(e), or 0 */
    float cap_inv_scale;          /* sm_scale / soft cap */
    const void *mod_user;         /* a variant's caller data (kva_attn_params.score_mod_user, device
                                   * memory); read only by kernels built with a score modifier */
} kva__prefill_args;

/* The warp-specialised Hopper kernel's argument block (prefill_hopper.cuh): the tensor maps of
 * K and V (built by the launcher per call: pointers and strides; ragged: dims head_dim x
 * token x head, a box 64 columns x a key tile; paged: head_dim x slot x head x page, a box 64
 * columns x the box's slots), of Q and O
 * (dims head_dim x head x token, a box 64 columns of g heads; a Q box is a whole item of the kernel's rows, an O box one
 * consumer warpgroup's 64 rows) and the plain arguments. */
typedef struct kva__hopper_prefill_args {
    CUtensorMap k_map, v_map, q_map, o_map;
    kva__prefill_args a;
    int32_t box_rows;  /* paged: keys per copy box (divides the page size and the key tile) */
    int32_t qo_maps;   /* 1: q_map holds (the group divides the kernel's rows), 2: o_map holds (it divides 64);
                        * without one the kernel copies Q / stores O itself */
} kva__hopper_prefill_args;

/* A prefill kernel and how to launch it. */
typedef struct kva__prefill_kernel {
    const void *fn;
    const void *fn_no_turns; /* tma, d128 layout: the build without the consumers' ping-pong
                                turns, for all but causal items of <= 1024 keys and decode
                                records (hopper_fn, prefill_launch.cu); else NULL */
    const void *fn_cap, *fn_cap_no_turns; /* tma, layouts of KVA__HP_CAP_BUILT: the soft-capped
                                             builds of fn and fn_no_turns (hopper_fn); else NULL */
    int rows;          /* packed query rows per block */
    int smem;          /* dynamic shared memory, bytes */
    int threads;
    int tma;           /* 1: the warp-specialised Hopper kernel (kva__hopper_prefill_args) */
    int block_n;       /* tma: keys per tile */
    int lookup_rows;   /* the instantiation asked for: 64, 128 or KVA__PREFILL_ROWS_HOPPER */
    int built_dim;     /* the head dim it is built for (64, 128, 256: >= the caller's) */
} kva__prefill_choice;

/* Which tensor-core path a context's prefill uses: mma.sync (sm_80 and later), the wgmma
 * version of the same kernel (sm_90a), or the warp-specialised TMA kernel (sm_90a; K/V whose
 * strides a tensor map cannot describe take the wgmma kernel). Chosen per device at context
 * creation; KVA_PREFILL_PATH=mma|wgmma|hopper forces one (the last two only where the device
 * and build have them: otherwise, as for any other value, kva_context_create fails). */
typedef enum kva__prefill_path {
    KVA__PREFILL_MMA = 0,
    KVA__PREFILL_WGMMA = 1,
    KVA__PREFILL_HOPPER = 2
} kva__prefill_path;

/* The one chooser: the kernel for (dtype, head_dim) on `path` whose block holds `rows_wanted`
 * packed rows or fewer (KVA__PREFILL_ROWS_LARGE asks for the largest there is). Any multiple of
 * 16 in 32..256 runs on the kernel of the next built head dim (64, 128, 256). Returns false
 * (and leaves *k zeroed) for an unsupported combination. The 64-row tile always takes the
 * mma.sync kernel (a warpgroup pair needs 128 rows). */
/* What the device offers: its prefill path and the shared memory one block may opt into
 * (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on Hopper, 163 KB on A100, 99 KB on
 * sm_86/89); a kernel that needs more falls back to the 64-row tile or is unsupported. */
typedef struct kva__prefill_target {
    kva__prefill_path path;
    int smem_limit;
} kva__prefill_target;

bool kva__prefill_choose(kva_dtype dtype, int head_dim, int rows_wanted,
                         const kva__prefill_target *target, kva__prefill_choice *k);

/* Query tokens per work item for a GQA group with a kernel of `rows` packed rows (>= 1; groups
 * larger than `rows` are not supported and give 0). */
static inline int32_t kva__prefill_tile_tokens_for(int rows, int group) {
    return group > 0 && group <= rows ? rows / group : 0;
}

/* Instantiation lookups (prefill_bf16.cu, prefill_f16.cu, prefill_f32.cu): kernel for a row count
 * (or KVA__PREFILL_ROWS_HOPPER: the wgmma kernel of KVA__PREFILL_WG_WARPS, 192 rows at d64 and
 * 128 elsewhere), or NULL. */
#define KVA__PREFILL_ROWS_HOPPER 999
const void *kva__prefill_bf16(int head_dim, int rows, int *smem, int *threads);
const void *kva__prefill_f16(int head_dim, int rows, int *smem, int *threads);
const void *kva__prefill_f32(int head_dim, int rows, int *smem, int *threads);
/* The warp-specialised kernels (prefill_hopper_bf16.cu, prefill_hopper_f16.cu): *rows packed rows
 * (192 at d64, else 128), *threads (a producer warpgroup and one per 64 rows), *block_n keys per
 * tile; head_dim a built dim (64, 128, 256) or 96 (the d128 layout with d96 products); NULL for
 * another. no_turns != 0: on the d128 layout the build without the ping-pong turns (the same
 * launch shape), elsewhere the one build. capped != 0: on the layouts of KVA__HP_CAP_BUILT the
 * soft-capped build (the same launch shape), elsewhere the one build (its cap a run-time flag). */
const void *kva__prefill_hopper_bf16(int head_dim, int no_turns, int capped, int *smem, int *threads, int *rows,
                                     int *block_n);
const void *kva__prefill_hopper_f16(int head_dim, int no_turns, int capped, int *smem, int *threads, int *rows,
                                    int *block_n);

/* The merge of split prefill work items (prefill_merge.cu). */
typedef struct kva__prefill_merge_args {
    void *o;
    int64_t o_st, o_sh;
    float *lse;
    const int4 *records;
    const int32_t *group_indptr;  /* [num_groups + 1] */
    const int32_t *num_groups_dev; /* device header's group count */
    const int32_t *split_dev;     /* device header's split flag */
    const int32_t *merge_groups_dev; /* device header's count of leading groups that may be split */
    const float *partial_o, *partial_lse;
    int64_t rows_per_work;
    int32_t num_qo_heads, head_dim, qo_tile; /* the plan's query tile */
    int32_t decode_records;        /* 1: a decode plan's records (query row = request) */
} kva__prefill_merge_args;

/* wide: one block per row (decode plans: few rows, many states each), else one warp per row */
const void *kva__prefill_merge_kernel_for(kva_dtype dtype, bool wide);

/* The context's target (cuda_context.cu). */
kva__prefill_target kva__cuda_prefill_target(const kva_context *ctx);

#endif /* KVA_CUDA_PREFILL_KERNELS_H */
