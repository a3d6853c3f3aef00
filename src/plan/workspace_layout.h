/*
 * workspace_layout.h -- where a plan keeps its arrays inside the caller's workspace.
 *
 * Host part:   [plan_header | int section]
 * Device part: [plan_header | int section (uploaded copy) | partial O | partial LSE |
 *               merge counters | global-rowmax scratch]
 * The header and int section have identical offsets in both parts, so a kernel reads everything
 * that varies between plans (counts, chunk size, CSR arrays) from device memory: a captured CUDA
 * graph replays correctly after re-planning into the same workspace.
 */
#ifndef KVA_WORKSPACE_LAYOUT_H
#define KVA_WORKSPACE_LAYOUT_H

#include "kvattn.h"
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVA__PLAN_MAGIC 0x6b766131u

enum kva__plan_kind {
    KVA__PLAN_DECODE = 1,
    KVA__PLAN_PREFILL_RAGGED = 2,
    KVA__PLAN_PREFILL_PAGED = 3
};

/* How a backend wants work split (see planner.h). */
typedef struct kva__split_policy {
    int64_t max_blocks;    /* concurrent (work item x KV head) blocks: the workspace layout's
                              budget, and the split search's unless search_blocks is smaller */
    int32_t min_chunk;     /* shortest key chunk worth a work item */
    int32_t qo_tile;       /* prefill query tokens per work item (the largest tile) */
    int32_t qo_tile_min;   /* 0, or a smaller tile a plan may pick for batches of short query
                              runs (CUDA: a 64-row kernel instead of the 128-row one) */
    int32_t merge_tree;    /* decode: 1 if split requests merge as a tree of KVA__MERGE_RUN runs
                              (the CUDA decode kernel), 0 if one merger reads every state */
    int32_t lone_block_percent; /* decode: how much faster a block streams alone on its SM
                              (kva__split_problem; 0: the scheduler's default) */
    int32_t merge_level_keys; /* decode: the merge tree's second level, in key-times
                              (kva__split_problem; 0: free) */
    int32_t next_item_keys;   /* decode: a block's later unit's fixed cost, in key-times
                              (kva__split_problem; 0: the scheduler's default) */
    int32_t split_keys;       /* decode: a split plan's one-off cost, in key-times
                              (kva__split_problem; 0: none) */
    int32_t global_split_key_percent; /* decode, global rowmax: kva__split_problem's
                              split_key_percent (0: 100) */
    int64_t global_search_blocks; /* decode, global rowmax, where it runs on another kernel than
                              partial rowmax (CUDA, groups above 16 on the Hopper path: the
                              sub-group decode kernel, not the prefill one): that kernel's split
                              search budget, planned without the later-unit and split prices of
                              the prefill kernel (0: global rowmax is planned as partial rowmax) */
    int64_t subgroup_blocks;  /* decode, partial rowmax, where groups above 16 run on the
                              prefill kernel (CUDA, Hopper path): the sub-group decode kernel's
                              (work item x KV head) blocks in one round. A non-graph plan whose
                              search on that kernel fits them, with every split request in at
                              least subgroup_min_chunks chunks, runs there instead: its chunk
                              blocks share the merge (decode_merge.cuh), which the prefill
                              kernel's separate merge launch cannot (0: never) */
    int32_t subgroup_min_chunks; /* (the shared merge's minimum, KVA__SHARED_MERGE_MIN) */
    int64_t subgroup_max_keys; /* ... and the batch holds at most this many keys (summed over
                              requests and KV heads): each sub-group re-reads them, so beyond
                              ~6.3 M keys x sub-groups x built head dim (~25 MB of bf16 K and V
                              through the SMs) the prefill kernel is faster */
    int64_t subgroup_long_max_keys; /* ... or at most this many where the requests average at
                              least subgroup_long_request keys (0: no such rule): long requests
                              cost the prefill kernel long chunks and a merge of many states;
                              between half that mean and the whole the bound rises in a line
                              from subgroup_max_keys (kva__subgroup_batch_fits) */
    int32_t subgroup_long_request;
    int32_t subgroup_min_chunk; /* that kernel's shortest chunk and prices (as its own policy) */
    int32_t subgroup_lone_block_percent, subgroup_merge_level_keys;
    int64_t search_blocks;    /* 0, or a smaller budget for the split search than the layout's
                              max_blocks (the blocks that really run at once: decode on the
                              prefill kernel's persistent grid; tests: KVA_PREFILL_PERSISTENT's
                              capped grid; the workspace layout does not change with it) */
    int32_t balance_blocks;   /* prefill: the persistent launch's blocks, for
                              KVA_PLAN_FULL_ATTENTION plans (prefill_balance.h); 0: none */
    int32_t balance_tile_keys; /* prefill: its keys per tile (pieces are whole tiles) */
    int32_t balance_min_tiles; /* prefill: shorter items stay whole (0: the default, prefill_balance.h) */
    int64_t order_cache_bytes; /* prefill: the K/V (2-byte elements) a causal plan's reordered last
                              waves may touch (kva__causal_tail.cache_bytes; 0: never reorder) */
} kva__split_policy;

/* The CUDA decode kernel's lone_block_percent for a head dim. A block alone on its SM has only
 * its own ring in flight: 16 keys x head_dim x 2 bytes per warp stage (f16 / bf16; the f32
 * kernel's 8-key tiles of 4-byte rows move as many bytes per key as the 16-bit kernel at twice
 * the head dim, which this rule does not see: the limits carry no dtype), so below d128 it gains
 * less from having the SM to itself. Measured on an H200 (bf16, fixed chunks, bench/NOTES.md,
 * "Lone blocks below d128"): d128 ~1.7-1.85x a paired block (the scheduler's default 90%), d64
 * and d32 (the d64 kernel) ~1.40-1.43x: 70%; linear in between (d96: 80). */
static inline int32_t kva__cuda_decode_lone_block_percent(int32_t head_dim) {
    return head_dim >= 128 ? 90 : head_dim <= 64 ? 70 : 70 + (head_dim - 64) * 20 / 64;
}

/* The CUDA decode merge tree's second level in the scheduler's key-times: ~1 us (the last run
 * block's fence, atomic and the final merger's round trip: bench/NOTES.md, "What the split merge
 * costs"), where a key-time is one key of one KV head at a block's share of the bandwidth, ~28
 * ns at d128 (512 bytes), so 36 key-times at d128, 72 at d64. Measured on an H200 (fixed chunks,
 * 2026-11-24, before the shared merge): 32/4 d64 2 x 8192 in 32 chunks (two levels) 15.9-16.2 us
 * against 15.3-15.5 in 16 (one). That plan now merges shared, without a tree, and is paid no
 * level (12.7 against 14.5 us, 2026-11-30); requests that still merge as trees are. */
static inline int32_t kva__cuda_decode_merge_level_keys(int32_t head_dim) {
    return head_dim > 0 ? 36 * 128 / head_dim : 36;
}

/* Plan facts the kernels read; first bytes of the host and the device part. 64 bytes aligned. */
typedef struct kva__plan_header {
    uint32_t magic;
    int32_t kind;
    int32_t batch_size;
    int32_t num_work;
    int32_t padded_work;
    int32_t num_groups;     /* (request, query tile) groups; = batch for decode */
    int32_t kv_chunk_size;  /* decode: the longest chunk of a work item */
    int32_t qo_tile_size;
    int32_t split_kv;
    int32_t page_size;
    int32_t num_pages;      /* pool size the page ids were checked against */
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t algo;
    uint32_t generation;    /* bumped by every plan call into this workspace (kva_plan.generation) */
    int32_t merge_groups;   /* the split merge's groups: the first merge_groups (0 unsplit; all
                             * groups where the search split keys; 1 where prefill_balance.h cut
                             * one item, moved to group 0) */
    int32_t decode_subgroups; /* decode, CUDA: 1 if the plan runs a group above 16 on the sub-group
                               * decode kernel where the chooser would take the prefill kernel
                               * (kva__split_policy.subgroup_blocks) */
    /* int32 element offsets from the start of the int section. group_indptr is a CSR over the
     * groups in work order: prefill (request, query tile) groups in request order (a plan with
     * a cut item, merge_groups 1: its pieces first, as group 0; their key ranges, whole tiles,
     * only in the unit records); decode requests longest chunk first (decode_scheduler.h), whose
     * key ranges are in the unit records (equal chunks: kv_tile * kv_chunk_size is not the first
     * key) */
    int64_t off_request, off_qo_tile, off_kv_tile, off_group_indptr;
    int64_t off_kv_indptr;     /* paged: page indptr [batch+1]; ragged: key row indptr [batch+1] */
    int64_t off_page_indices;  /* paged only [indptr[batch]] */
    int64_t off_last_page_len; /* paged only [batch] */
    int64_t off_qo_indptr;     /* [batch+1] query rows (decode: b) */
    int64_t off_kv_len;        /* [batch] keys per request */
    int64_t off_qo_len;        /* [batch] queries per request */
    /* byte offsets from the start of the DEVICE part (see kva__workspace_layout) */
    int64_t off_partial_o;     /* f32 [work][rows_per_work][head_dim] split-KV partial outputs */
    int64_t off_partial_lse;   /* f32 [work][rows_per_work] partial LSE (natural log) */
    int64_t off_counters;      /* u32 [num_groups][num_qo_heads]; zero between runs */
    int64_t off_run_counters;  /* u32 [cap_work][num_qo_heads]: decode merge-tree runs, indexed
                                * by a run's first work item, and the shared merge's claim and
                                * departure words (decode_merge.cuh); zero between runs */
    int64_t off_run_lse;       /* f32 [cap_work][num_qo_heads]: a merged run's LSE (its O goes
                                * into the run's first partial slot) */
    int64_t off_sched;         /* CUDA: u32 [KVA__SCHED_HEAD + KVA__SCHED_MAX_BLOCKS * KVA__SCHED_RING], the
                                * Hopper prefill kernel's work tickets, finished blocks (both
                                * zero between runs) and each block's work-record slots
                                * (prefill_hopper.cuh) */
    int64_t off_scores;        /* f32 global-rowmax scratch (CPU decode) */
    int64_t rows_per_work;     /* qo_tile * num_qo_heads (decode: num_qo_heads) */
    int64_t cap_work;          /* capacity of the work arrays (= padded_work with GRAPH) */
    /* int32 offset (a multiple of 8: 32-byte aligned) of the decode unit records: per work item
     * KVA__UNIT_RECORD_INTS int32 (see below), [cap_work]; filled for decode plans only */
    int64_t off_unit_records;
} kva__plan_header;

/* The Hopper prefill kernel's dynamic work distribution (prefill_hopper.cuh): up to this many
 * persistent blocks (a larger grid walks statically). The region holds KVA__SCHED_HEAD words
 * (the ticket counter, the count of finished blocks, padding to 16 bytes), then per block
 * KVA__SCHED_RING words: 4 work-record slots of 16 words (read with 16-byte loads, hence the
 * alignment); its last word counts the tickets it drew (read by the tests). */
#define KVA__SCHED_MAX_BLOCKS 1024
#define KVA__SCHED_HEAD 4
#define KVA__SCHED_RING 68

/* CUDA decode merges a request of more than KVA__MERGE_RUN chunks as a two-level tree: each run
 * of KVA__MERGE_RUN consecutive work items is merged by its last block into the run's first
 * slot, and the last run merges the runs (src/cuda/decode_kernel.cuh). The scheduler's cost
 * model counts merges the same way (decode_scheduler.c). */
#ifndef KVA__MERGE_RUN /* (-D for experiments, the library's own kernels only: variant modules keep 16) */
#define KVA__MERGE_RUN 16
#endif

/* One decode work item's facts in one 32-byte record, so a GPU block learns everything it
 * needs before streaming from one round trip instead of a chain of dependent loads
 * (request -> kv_len / indptrs -> ...). Redundant with the CSR arrays, which stay. */
#define KVA__UNIT_RECORD_INTS 8
enum kva__unit_record_field {
    KVA__UR_REQUEST = 0,   /* request b */
    KVA__UR_KEY_BEG = 1,   /* first key of the chunk (chunk index * chunk size) */
    KVA__UR_KEY_END = 2,   /* one past its last key: min(key_beg + chunk, kv_len) */
    KVA__UR_KV_LEN = 3,    /* keys of request b (sliding windows count from its end) */
    KVA__UR_PAGE_BEG = 4,  /* request b's first entry in the page-index array */
    KVA__UR_ITEM_BEG = 5,  /* request b's work items (merge range) */
    KVA__UR_ITEM_END = 6,
    KVA__UR_PAD = 7
};
/* Prefill plans fill the same records; fields 0-4 mean the same (field 4 is the request's
 * first page entry, or its first key row for ragged K/V), and the last three describe the
 * work item's query tile. A work item covering all of its request's keys is unsplit and
 * writes o directly; any other writes its partial state (workspace_layout: partial O / LSE). */
enum kva__prefill_record_field {
    KVA__PR_Q_ROW0 = 5,   /* first query row of the tile (qo_indptr[b] + its first token,
                           * kva__qo_tile_span: tiles aligned to the request's end) */
    KVA__PR_Q_TOKENS = 6, /* query tokens in the tile (1 .. qo_tile; short: the first tile) */
    KVA__PR_Q_POS0 = 7    /* position of the tile's first query: kv_len - qo_len + first token */
};

/* Capacities and byte offsets derived from limits + policy; identical at sizing and planning. */
typedef struct kva__workspace_layout {
    int64_t cap_work, cap_groups, cap_batch, cap_pages;
    int64_t cap_split_work;       /* work items that may hold partial states */
    size_t header_bytes;          /* sizeof header rounded to 64 */
    size_t int_section_bytes;     /* int arrays, rounded to 256 */
    size_t host_bytes;            /* header + int section */
    size_t off_partial_o;         /* bytes from device part start; f32 [cap_split_work][rows][D] */
    size_t off_partial_lse;       /* f32 [cap_split_work][rows] */
    size_t off_counters;          /* u32 [cap_groups][num_qo_heads], zero between runs */
    size_t off_run_counters;      /* CUDA decode: u32 [cap_split_work][num_qo_heads] (merge tree,
                                     shared merge), zero between runs */
    size_t off_run_lse;           /* CUDA decode: f32 [cap_split_work][num_qo_heads] */
    size_t off_sched;             /* CUDA: u32 [KVA__SCHED_HEAD + KVA__SCHED_MAX_BLOCKS * KVA__SCHED_RING]: work
                                   * tickets, finished blocks (zero between runs), ring slots */
    size_t off_scores;            /* f32 global-rowmax scratch [num_qo_heads][max_total_kv] */
    size_t device_bytes;
    int64_t rows_per_work;        /* qo_tile * num_qo_heads (decode: num_qo_heads) */
    kva__split_policy policy;
} kva__workspace_layout;

/* Whether a decode batch is small enough to be searched for the sub-group kernel: at most
 * subgroup_max_keys keys summed over requests and KV heads (each sub-group re-reads them), or at
 * most subgroup_long_max_keys where its requests average subgroup_long_request keys or more, and
 * between the two bounds in proportion where they average between half that and the whole. */
int kva__subgroup_batch_fits(const int32_t *kv_len, int32_t B, int32_t num_kv_heads, const kva__split_policy *pol);

/* Whether a decode plan searched for the sub-group kernel (kva__split_policy.subgroup_blocks)
 * fits one round of it (each
 * (work item, KV head) a block of its own) with a request split in at least subgroup_min_chunks
 * chunks and none in fewer: then each split request's chunk blocks merge it together (the shared
 * merge), where the prefill kernel's merge is a launch of its own. gi: the plan's group indptr
 * (decode: one group per request); w < 0: the plan did not fit the workspace. 1 or 0 (an int:
 * the header is also compiled by NVRTC for variants, which has no <stdbool.h>). */
int kva__subgroup_plan_merges_shared(int64_t w, const int32_t *gi, int32_t B, int32_t num_kv_heads,
                                      const kva__split_policy *pol);

kva_status kva__compute_layout(const kva_context *ctx, const kva_plan_limits *limits, int kind,
                               kva__workspace_layout *layout);

/* Typed views of a plan's parts. */
static inline kva__plan_header *kva__plan_header_of(void *part) {
    return (kva__plan_header *)part;
}
static inline int32_t *kva__plan_ints(void *part) {
    return (int32_t *)((unsigned char *)part + ((sizeof(kva__plan_header) + 63) / 64 * 64));
}

/* Backend split policies (src/cpu, src/cuda). */
kva_status kva__cpu_split_policy(const kva_context *ctx, const kva_plan_limits *limits, int kind,
                                 kva__split_policy *policy);
kva_status kva__cuda_split_policy(const kva_context *ctx, const kva_plan_limits *limits, int kind,
                                  kva__split_policy *policy);

#ifdef __cplusplus
}
#endif
#endif /* KVA_WORKSPACE_LAYOUT_H */
