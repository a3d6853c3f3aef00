/*
 * prefill_engine.h -- the CPU prefill tile engine: FlashAttention-style attention of one
 * "task" = (query tile of one request, range of its keys, one KV head) with online softmax in
 * f32, writing either final rows (output dtype + LSE) or f32 partial states for a later merge.
 *
 * All query heads of the KV head's GQA group are processed together, so every key block is
 * converted to f32 once per task and shared by tokens x group-heads packed rows. Callers
 * (cpu_prefill.c) split a batch into tasks and run them in parallel, one scratch area per thread.
 */
#ifndef KVA_PREFILL_ENGINE_H
#define KVA_PREFILL_ENGINE_H

#include "kvattn.h"

#include <stddef.h>
#include <stdint.h>

/* Where a request's keys and values live. Key j (0-based in the request), head h:
 *   contiguous rows: k + ((first_row + j) * stride_token + h * stride_head) elements, and
 *                    v + ((first_row + j) * v_stride_token + h * v_stride_head) elements
 *                    (ragged K and V tensors may have different layouts)
 *   paged:           k + (pages[j / page_size] * stride_page + (j % page_size) * stride_token
 *                         + h * stride_head) elements, the same offsets from v. */
typedef struct kva__kv_source {
    const void *k, *v;
    int64_t stride_token, stride_head; /* elements */
    int64_t v_stride_token, v_stride_head; /* contiguous rows only */
    int64_t first_row;                 /* contiguous rows only */
    const int32_t *pages;              /* NULL: contiguous rows */
    int32_t page_size;
    int64_t stride_page;
} kva__kv_source;

/* What is shared by every task of one call. */
typedef struct kva__prefill_config {
    int32_t group;         /* query heads per KV head */
    int32_t head_dim;      /* a multiple of 16, <= 256 */
    kva_dtype dtype;       /* of q, k, v (and of o for final rows) */
    float sm_scale;        /* resolved: > 0 */
    int32_t causal;
    int32_t window_left;   /* < 0: none */
    float logits_soft_cap; /* <= 0: none */
    kva_score_mod_fn score_mod;
    void *score_mod_user;
} kva__prefill_config;

/* One task. Pointers address the tile's first query token (q, out, lse). */
typedef struct kva__prefill_task {
    const void *q;
    int64_t q_stride_token, q_stride_head; /* elements */
    int32_t num_tokens;                    /* query tokens in the tile, >= 1 */
    int32_t first_q_pos;      /* position of the tile's first query (kv_len - qo_len + token) */
    int32_t kv_begin, kv_end; /* keys of this task, within 0 .. kv_len */
    int32_t kv_head;
    kva__kv_source kv;
    /* results: query token t, query head h -> out + t * out_stride_token + h * out_stride_head
     * elements of out_dtype (f32 for partial states), lse[t * lse_stride_token + h] (natural
     * log; lse may be NULL) */
    void *out;
    kva_dtype out_dtype;
    int64_t out_stride_token, out_stride_head;
    float *lse;
    int64_t lse_stride_token;
} kva__prefill_task;

/* Rows (query tokens x group heads) the engine packs into one pass, in every ISA variant. */
#define KVA__PREFILL_MAX_ROWS 256

/* Query tokens per tile the engine prefers for a GQA group size: enough that a tile's tokens x
 * group heads fill a whole pass (256 rows), so each converted key block serves as many rows as
 * possible; at least 64. */
int32_t kva__prefill_tile_tokens(int32_t group);

/* The engine itself is compiled once per ISA variant (src/cpu/kernels/prefill_engine.c) and
 * reached through the context's kernel table (cpu_isa.h):
 *   prefill_scratch_bytes(head_dim <= 256): scratch bytes one thread needs;
 *   prefill_task_run(cfg, task, scratch): runs one task; scratch is 64-byte aligned and
 *   prefill_scratch_bytes() long. */

#endif /* KVA_PREFILL_ENGINE_H */
