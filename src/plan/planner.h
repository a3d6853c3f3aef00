/*
 * planner.h -- split-KV planning shared by the CPU and CUDA backends (seed 004).
 *
 * A request with qo_len queries and kv_len keys becomes ceil(qo_len / qo_tile) query tiles, each
 * split into ceil(kv_len / chunk) key chunks (an empty request still gets one chunk, which
 * writes output 0 and LSE -inf). Every (request, query tile, key chunk) triple is one work item;
 * a backend runs each work item once per KV head. The chunk size is the smallest one whose
 * work-item count, times the KV heads, fits in the device's concurrent block budget: as much
 * parallelism as the device can hold at once, and no more merging than that needs. Prefill plans
 * use this search; decode plans use the balanced scheduler of decode_scheduler.h, which shares
 * kva__split_problem.
 */
#ifndef KVA_PLANNER_H
#define KVA_PLANNER_H

#include <stdint.h>

typedef struct kva__split_problem {
    int32_t batch_size;
    const int32_t *qo_len;  /* [batch] query tokens per request; NULL means 1 each (decode) */
    const int32_t *kv_len;  /* [batch] keys per request */
    int32_t qo_tile;        /* query tokens per work item (>= 1) */
    int32_t num_kv_heads;   /* each work item runs once per KV head */
    int64_t max_blocks;     /* concurrent (work item x KV head) blocks the device holds */
    int32_t sm_blocks;      /* decode: blocks that share one SM's bandwidth (0 or 1: none) */
    int32_t lone_block_percent; /* decode: a block alone on its SM streams this percentage of
                                 * sm_blocks times a paired block's rate (0: the scheduler's
                                 * KVA__SCHED_LONE_BLOCK_PERCENT) */
    int32_t merge_level_keys; /* decode, merge tree: what a request's second merge level adds
                               * (a fence, an atomic and a dependent round trip), in key-times */
    int32_t next_item_keys; /* decode: what a block's later unit costs beyond its keys, in
                             * key-times (0: KVA__SCHED_NEXT_ITEM_COST_KEYS) */
    int32_t split_keys;     /* decode: what a plan with any split request pays once (a merge
                             * launch), in key-times (0: nothing) */
    int32_t split_key_percent; /* decode: a split request's unit costs this percentage of its
                                * keys (0: 100; CUDA global rowmax 150: both passes read K) */
    int32_t merge_run;      /* decode: > 0: states merge as a tree of runs of this many (CUDA);
                             * 0: one block merges all of a request's states (CPU) */
    int32_t forward_walk;   /* decode, merge_run > 0: the persistent blocks walk their units
                             * first to last (CUDA graph plans), so the last round's units end
                             * their blocks; otherwise (other plans of several rounds) last to
                             * first, so the first max_blocks units do. A request whose chunk
                             * units all end their blocks merges on them at once (no tree). */
    int32_t min_chunk;      /* never split into chunks shorter than this */
    int32_t fixed_chunk;    /* > 0: use this chunk size, skip the search */
    int32_t no_split;       /* 1: chunk = longest request */
} kva__split_problem;

/* The tokens of query tile t of a request with qo_len queries (tiles of `tile` tokens): the tiles
 * are aligned to the request's end, so a partial tile is the first one, [0, qo_len % tile), not
 * the last. Queries sit at the end of the key range (bottom-right), so under a causal mask the
 * first tile sees the fewest keys: ending every other tile earlier never makes a tile walk more
 * key tiles, and often one fewer (d64 bf16 32 x 512 causal on the GPU's 48-token items: 28 key
 * tiles of 128 per request and KV head instead of 29). *tok0: first token, *ntok: tokens. */
static inline void kva__qo_tile_span(int32_t qo_len, int32_t tile, int32_t t, int32_t *tok0, int32_t *ntok) {
    const int32_t tiles = (int32_t)(((int64_t)qo_len + tile - 1) / tile);
    const int64_t end = (int64_t)qo_len - (int64_t)(tiles - 1 - t) * tile; /* one past the last */
    const int64_t beg = end - tile > 0 ? end - tile : 0;
    *tok0 = (int32_t)beg;
    *ntok = (int32_t)(end - beg);
}

/* Work items (request, query tile, key chunk) for a given chunk size. */
int64_t kva__count_work(const kva__split_problem *p, int32_t chunk);

/* The chunk size: fixed_chunk if set; the longest kv_len if no_split or if even that exceeds the
 * budget; otherwise the smallest chunk >= min_chunk with count_work * kv_heads <= max_blocks,
 * found by binary search (count_work is non-increasing in chunk). Always >= 1. */
int32_t kva__search_chunk_size(const kva__split_problem *p);

/* Flattens work in (request, query tile, key chunk) order into the three index arrays
 * (capacity entries each) and group_indptr [num_groups + 1], where a group is one
 * (request, query tile) and owns work items group_indptr[g] .. group_indptr[g+1]-1. For decode
 * (qo_len NULL) groups are requests. Returns the number of work items, or -1 if capacity or
 * group_capacity is too small. */
int64_t kva__flatten_work(const kva__split_problem *p, int32_t chunk, int32_t *request_indices,
                          int32_t *qo_tile_indices, int32_t *kv_tile_indices, int64_t capacity,
                          int32_t *group_indptr, int64_t group_capacity);

#endif /* KVA_PLANNER_H */
