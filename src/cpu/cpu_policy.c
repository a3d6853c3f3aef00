/*
 * cpu_policy.c -- how the CPU backend wants work split and how much scratch a worker needs.
 *
 * max_blocks: 4 work items per core keeps both cores busy under dynamic scheduling while
 * bounding merge work; it depends on the core count only (not on kva_context_set_threads) so
 * a workspace sized once stays valid. min_chunk 256 keys: below that the merge costs more than
 * the parallelism gains. Prefill tiles 64 query tokens (x the GQA group's heads).
 */
#include "cpu_backend.h"
#include "../common/internal.h"

size_t kva__cpu_scratch_bytes_per_thread(void) { return (size_t)4 << 20; }

kva_status kva__cpu_split_policy(const kva_context *ctx, const kva_plan_limits *limits, int kind,
                                 kva__split_policy *policy) {
    (void)ctx;
    (void)limits;
    policy->max_blocks = 4 * (int64_t)kva__cpu_count();
    if (policy->max_blocks < 16) policy->max_blocks = 16;
    policy->min_chunk = 256;
    policy->qo_tile = kind == KVA__PLAN_DECODE ? 1 : 64;
    return KVA_OK;
}
