/*
 * cpu_policy.c -- how the CPU backend wants work split and how much scratch a worker needs.
 *
 * max_blocks: 4 work items per core keeps both cores busy under dynamic scheduling while
 * bounding merge work; it depends on the context's core count only (fixed at its creation; not
 * on kva_context_set_threads) so a workspace sized once stays valid. min_chunk 256 keys: below that the merge costs more than
 * the parallelism gains. Prefill tiles hold the query tokens the prefill engine wants per task
 * (kva__prefill_tile_tokens: tokens x GQA group heads fill a 256-row pass, at least 64
 * tokens), so each key block it converts serves as many rows as possible.
 */
#include "cpu_backend.h"
#include "prefill_engine.h"
#include "../common/internal.h"

size_t kva__cpu_scratch_bytes_per_thread(void) { return (size_t)4 << 20; }

int32_t kva__prefill_tile_tokens(int32_t group) {
    int32_t tile = 64;
    while ((int64_t)tile * 2 * group <= KVA__PREFILL_MAX_ROWS) tile *= 2;
    return tile;
}

kva_status kva__cpu_split_policy(const kva_context *ctx, const kva_plan_limits *limits, int kind,
                                 kva__split_policy *policy) {
    policy->max_blocks = 4 * (int64_t)ctx->num_cores;
    if (policy->max_blocks < 16) policy->max_blocks = 16;
    policy->min_chunk = 256;
    /* a causal plan's last tasks may be reordered while their K/V stays within a typical L3 share */
    policy->order_cache_bytes = (int64_t)8 << 20;
    policy->qo_tile = kind == KVA__PLAN_DECODE
                          ? 1
                          : kva__prefill_tile_tokens(limits->num_qo_heads / limits->num_kv_heads);
    return KVA_OK;
}
