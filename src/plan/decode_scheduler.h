/*
 * decode_scheduler.h -- how a decode batch is cut into work items and in which order they are
 * listed, so that a persistent grid finishes all its blocks at about the same time (issue 8).
 * Pure host arithmetic, shared by the CPU and CUDA backends; plan.c calls it for decode plans.
 *
 * The grid it schedules for: G = max_blocks blocks (the split search's budget: the policy's
 * search_blocks where it sets one, plan.c), block i runs units i, i + G, i + 2G, ..., where unit
 * u is (work item u / H, KV head u % H) (src/cuda/decode_kernel.cuh). So the order of the work
 * list alone decides what each block gets. (Decode of GQA groups above 16 runs on the Hopper
 * prefill kernel's persistent grid, one block per SM, whose blocks draw their later units as they
 * finish: the longest-first order serves it as well -- unless plan.c keeps a plan for the
 * sub-group decode kernel, kva__split_policy.subgroup_blocks.)
 *
 * Cost model, in key-times (the time one block takes to stream one key of one KV head while the
 * whole grid streams):
 *   a unit of n keys costs KVA__SCHED_ITEM_COST_KEYS + n as a block's first unit and
 *   next_item_keys + n as a later one (kva__split_problem; 0: KVA__SCHED_NEXT_ITEM_COST_KEYS,
 *   which the balance simulator always uses), the n of a split request's unit counted at
 *   split_key_percent (0: 100; CUDA global rowmax 150 or 185: its pass 1 reads K again);
 *   a (request, KV head) split into c chunks costs KVA__SCHED_MERGE_COST_PER_STATE_KEYS * c more,
 *   on the one block that merges it (the last to arrive) -- with CUDA's merge tree the states its
 *   busiest merger reads, plus merge_level_keys for the tree's second level (makespan estimate),
 *   which a request does not pay where each of its chunk units is its block's last (all units
 *   of a one-round plan; in more rounds the first G, as non-graph plans' blocks walk last to
 *   first, or the last G, as graph plans' walk forward: kva__split_problem.forward_walk): CUDA
 *   merges it on all its chunk blocks at once (kva__merge_shared, decode_merge.cuh; H200: 32/8
 *   1 x 8192 in 32 chunks 16.6-16.8 us against 17.4 in 16, 32/4 d64 2 x 8192 12.7 against 14.5);
 *   a plan with any split request pays split_keys once more (the prefill kernel's merge launch);
 *   sm_blocks blocks share an SM's bandwidth (kva__split_problem), so a grid of at most
 *   G / sm_blocks units, one block per SM, streams its keys lone_block_percent% (default
 *   KVA__SCHED_LONE_BLOCK_PERCENT) of sm_blocks times faster; its fixed costs are latency and
 *   stay as they are.
 *
 * Order: requests longest item first, each request's chunks contiguous (its merge range stays
 * one interval of work items). With units sorted by cost, in every round of G units block i
 * gets a unit at least as costly as block i + 1's, so block 0 is the slowest block and
 *   max block cost <= total / G + largest unit cost (+ the merges it runs).
 * Chunks: a request of L keys is cut into n = ceil(L / chunk) equal parts (so no tiny tail item
 * carries a full fixed cost). The chunk is the candidate with the smallest estimated makespan
 * among: no split, chunk = mean block cost x sm_blocks (one block per SM), the shortest chunk
 * whose units fit one round of the grid (one unit per block), and chunk = mean
 * block cost / R for R = 1, 2, 4, 8 (R units per block slot;
 * R = 8 bounds the slowest block at ~1 + 1/8 of the mean); a finer one must be 2% better, and
 * the search stops at a plan within 3% of the mean. Every candidate is at least
 * KVA__SCHED_MIN_SPLIT_CHUNK keys (and the policy's min_chunk), and no request has more chunks
 * than min(KVA__SCHED_MAX_CHUNKS_PER_REQUEST, G / H, sqrt(Lmax / merge cost per state)) for the
 * longest request's Lmax: past the square root, one more chunk of it adds more merge time than
 * it saves streaming time.
 */
#ifndef KVA_DECODE_SCHEDULER_H
#define KVA_DECODE_SCHEDULER_H

#include "planner.h"

/* Cost-model constants (H200, bf16, D = 128, 264 blocks; bench/NOTES.md): a key of one KV head
 * is 512 bytes, ~28 ns at a block's share (4.8 TB/s / 264) of the bandwidth.
 * - item cost 64 keys (~1.8 us): the trace of v8 measured 1.5-2 us from one unit's loop end to
 *   the next unit's start (epilogue, partial-state write, record/page-id round trips).
 * - merge 6 keys (~170 ns) per partial state: the 1 x 32k, 1 KV head plan (263 chunks
 *   of ~125 keys) took ~50 us, almost all of it one block merging 263 states; the trace of
 *   1 x 8192 (32 chunks) shows a ~4.5 us merge tail, ~140 ns per state.
 * Recalibrate both from the GPU bench; they only steer the choice among a few candidates. */
#define KVA__SCHED_ITEM_COST_KEYS 64
/* Each later unit of a block costs this much instead (estimate and simulator): a plan that gives
 * each block more, shorter units pays more than the 1.5-2 us per boundary of the trace. Ragged
 * batch (a) on the H200 (2026-11-23 22:50 UTC): 5.5 units per block (chunk 2176) 275.6 us
 * against 9 (chunk 1088) 287.2 us, ~3.3 us (~118 key-times) per extra unit; with one cost of 128
 * for every unit, single-wave plans chose worse (32/4 d64 1 x 32k: 32 lone blocks of 1024 keys,
 * 23.8 us, instead of 64 x 512, 19.9 us), so a block's first unit keeps the cost above. */
#ifndef KVA__SCHED_NEXT_ITEM_COST_KEYS /* (-D for experiments) */
#define KVA__SCHED_NEXT_ITEM_COST_KEYS 128
#endif
#define KVA__SCHED_MERGE_COST_PER_STATE_KEYS 6
/* Split chunks are never shorter than this (a request shorter than it is not split). 512 cost
 * 1 x 1024 (8 KV heads) half its speed on an H200 (15.8 vs 10.6 us with 64-key chunks): a batch
 * too small to fill the GPU wants short chunks, and the cost model already charges each item.
 * The backend's policy min_chunk applies on top: the CPU's is 256 keys (cpu_policy.c), as it was
 * under the binary-search planner. */
#define KVA__SCHED_MIN_SPLIT_CHUNK 128
/* A block alone on its SM streams this percentage of sm_blocks times a paired block's rate:
 * H200, 32/8 d128, 16 x 8192 unsplit (128 lone blocks) took 138.5 us, split in two (256 paired
 * blocks, 2 per SM) 128.0 us, i.e. 1.85x per block with 4 SMs idle; 2x made the planner keep
 * that batch unsplit. The default; the CUDA policy gives smaller head dims less (a block of
 * the decode kernel holds fewer bytes in flight there: cuda_context.cu). */
#define KVA__SCHED_LONE_BLOCK_PERCENT 90
/* Chunks are multiples of this (4 warps x one 16-key tile), so no warp idles in a chunk. */
#define KVA__SCHED_CHUNK_GRANULE 64
/* No request is ever split into more chunks than this (on CUDA partial rowmax they merge as a
 * tree of runs of KVA__MERGE_RUN, so one block reads at most 16 + 8 states, or shared by all
 * the chunk blocks; elsewhere one block merges them all, and the sqrt bound above applies
 * first). */
#define KVA__SCHED_MAX_CHUNKS_PER_REQUEST 128
/* The finest candidate aims at this many units per block (see above). */
#define KVA__SCHED_MAX_ROUNDS 8

/* Work items of a request of kv_len keys for a chunk size: ceil(kv_len / chunk), and 1 for an
 * empty request (it still writes its zero output). */
int32_t kva__sched_chunks_of(int32_t kv_len, int32_t chunk);

/* Keys [*beg, *end) of chunk c of a request of kv_len keys. Searched plans cut the request into
 * equal parts (equal = 1: sizes differ by at most one key, none longer than chunk); fixed chunk
 * sizes cut at multiples of chunk (equal = 0). */
void kva__sched_chunk_range(int32_t kv_len, int32_t chunk, int equal, int32_t c, int32_t *beg,
                            int32_t *end);

/* The decode chunk size: fixed_chunk if set, the longest request if no_split, else the
 * candidate of the smallest estimated makespan (see above). Uses p->kv_len, batch_size,
 * num_kv_heads, max_blocks, sm_blocks, lone_block_percent, merge_run, merge_level_keys,
 * next_item_keys, split_keys, split_key_percent, min_chunk. Always >= 1. On return order[batch] holds
 * the work order for that chunk (kva__sched_decode_order with equal = no fixed_chunk); keys
 * [batch] is scratch. */
int32_t kva__sched_decode_chunk(const kva__split_problem *p, int64_t *keys, int32_t *order);

/* Writes order[batch]: the requests, longest work item first (ties: lower request first).
 * keys[batch] is scratch. */
void kva__sched_decode_order(const kva__split_problem *p, int32_t chunk, int equal, int64_t *keys,
                             int32_t *order);

/* Flattens decode work in `order`: request order[j]'s chunks are work items
 * group_indptr[j] .. group_indptr[j+1]-1 (a CSR over requests in work order, not by request
 * index). kv_tile_indices are chunk indices within the request. Returns the number of work
 * items, or -1 if capacity or group_capacity (>= batch + 1) is too small. */
int64_t kva__sched_decode_flatten(const kva__split_problem *p, int32_t chunk, const int32_t *order,
                                  int32_t *request_indices, int32_t *kv_tile_indices,
                                  int64_t capacity, int32_t *group_indptr, int64_t group_capacity);

/* The cost model applied to a flattened decode plan run by a persistent grid of `grid` blocks
 * (launched as min(grid, units)): item_keys[w] keys per work item (a block's first unit costs
 * KVA__SCHED_ITEM_COST_KEYS more, each later one KVA__SCHED_NEXT_ITEM_COST_KEYS), groups (merge ranges) in
 * group_indptr[num_groups + 1]; a group of several items adds its merge cost to the block that
 * runs its last unit of each KV head. Writes block_cost[grid] and returns the largest. */
double kva__sched_simulate(int64_t num_work, const int32_t *item_keys, const int32_t *group_indptr,
                           int64_t num_groups, int32_t num_kv_heads, int64_t grid,
                           double *block_cost);

#endif /* KVA_DECODE_SCHEDULER_H */
