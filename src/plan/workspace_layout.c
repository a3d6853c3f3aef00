/* workspace_layout.c -- capacities and offsets of a workspace for given limits (see header). */
#include "workspace_layout.h"
#include "decode_scheduler.h"
#include "../common/internal.h"
#include "../api/validate.h"

static kva_status check_limits(const kva_context *ctx, const kva_plan_limits *l, int kind) {
    const char *api = kva__api();
    if (l->max_batch < 1)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: limits.max_batch (%d) must be >= 1", api,
                         l->max_batch);
    if (l->num_qo_heads < 1 || l->num_kv_heads < 1 || l->num_qo_heads % l->num_kv_heads != 0)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "%s: limits.num_kv_heads (%d) must divide limits.num_qo_heads (%d), both >= 1",
                         api, l->num_kv_heads, l->num_qo_heads);
    /* The same rule as the runs, so a plan never succeeds for a shape its run must refuse. */
    KVA_TRY(kva__check_head_dim(ctx, "limits.head_dim", l->head_dim));
    bool paged = kind == KVA__PLAN_DECODE || kind == KVA__PLAN_PREFILL_PAGED;
    if (paged && (l->page_size < 1 || l->max_total_pages < 0))
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "%s: limits.page_size (%d) must be >= 1 and limits.max_total_pages (%lld) >= 0",
                         api, l->page_size, (long long)l->max_total_pages);
    if (l->page_size < 0 || l->page_size > KVA__MAX_PAGE_SIZE)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: limits.page_size %d outside 1..%d", api,
                         l->page_size, KVA__MAX_PAGE_SIZE);
    if (kind != KVA__PLAN_DECODE && l->max_total_qo < 0)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: limits.max_total_qo < 0", api);
    if (l->max_total_kv < 0)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: limits.max_total_kv < 0", api);
    if (l->min_fixed_chunk < 0)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: limits.min_fixed_chunk %d < 0", api,
                         l->min_fixed_chunk);
    if (l->min_fixed_chunk > 0 && kind == KVA__PLAN_PREFILL_RAGGED && l->max_total_kv == 0)
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "%s: limits.min_fixed_chunk needs limits.max_total_kv to bound ragged "
                         "prefill work",
                         api);
    /* The CSR totals are int32, so larger limits can never be used; refusing them also keeps
     * the int-section arithmetic below far from overflow. */
    if (l->max_total_pages > INT32_MAX || l->max_total_kv > INT32_MAX || l->max_total_qo > INT32_MAX)
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "%s: limits.max_total_pages / kv / qo (%lld / %lld / %lld) exceed 2^31 - 1",
                         api, (long long)l->max_total_pages, (long long)l->max_total_kv,
                         (long long)l->max_total_qo);
    return KVA_OK;
}

/* Work items a plan with a fixed chunk of at least min_chunk keys can make (see planner.h):
 * sum_b tiles_b * ceil(kv_b / c) <= sum_b tiles_b + max_b tiles_b * total_kv / c. */
static int64_t fixed_chunk_work_bound(const kva_plan_limits *l, int kind, int64_t cap_groups,
                                      int32_t tile) {
    int64_t total_kv = kind == KVA__PLAN_PREFILL_RAGGED
                           ? l->max_total_kv
                           : l->max_total_pages * (int64_t)l->page_size;
    int64_t max_tiles = kind == KVA__PLAN_DECODE ? 1 : l->max_total_qo / tile + 1;
    double bound = (double)cap_groups + (double)max_tiles * (double)(total_kv / l->min_fixed_chunk + 1);
    return bound > (double)INT32_MAX ? -1 : (int64_t)bound;
}

/* Appends a region of a * b * c 4-byte elements (f32 or u32; rounded to 256 bytes) at *off;
 * false if its size or the running offset would overflow. */
static bool add_f32_region(size_t *off, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t bytes;
    if (__builtin_mul_overflow(a, b, &bytes) || __builtin_mul_overflow(bytes, c, &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)4, &bytes) || bytes > (uint64_t)PTRDIFF_MAX)
        return false;
    bytes = kva__align_up(bytes, 256);
    return !__builtin_add_overflow(*off, (size_t)bytes, off) && *off <= (size_t)PTRDIFF_MAX;
}

kva_status kva__compute_layout(const kva_context *ctx, const kva_plan_limits *limits, int kind,
                               kva__workspace_layout *out) {
    KVA_CHECK_NULL(ctx);
    KVA_CHECK_NULL(limits);
    KVA_TRY(check_limits(ctx, limits, kind));
    kva__workspace_layout L = {0};
    if (ctx->device == KVA_DEVICE_CUDA)
        KVA_TRY(kva__cuda_split_policy(ctx, limits, kind, &L.policy));
    else
        KVA_TRY(kva__cpu_split_policy(ctx, limits, kind, &L.policy));

    int64_t budget_items = L.policy.max_blocks / limits->num_kv_heads;
    if (budget_items < 1) budget_items = 1;
    int64_t B = limits->max_batch;
    L.cap_batch = B;
    bool paged = kind == KVA__PLAN_DECODE || kind == KVA__PLAN_PREFILL_PAGED;
    L.cap_pages = paged ? limits->max_total_pages : 0;
    if (kind == KVA__PLAN_DECODE) {
        L.policy.qo_tile = 1;
        L.rows_per_work = limits->num_qo_heads;
        L.cap_groups = B;
        /* One item per request, plus the chunks the scheduler adds (decode_scheduler.h): split
         * chunks are >= KVA__SCHED_MIN_SPLIT_CHUNK keys and either >= the mean block cost (>=
         * kv_heads x total keys / the search's blocks, which are at most max_blocks) /
         * KVA__SCHED_MAX_ROUNDS, or (the one-round candidate) few enough that all units fit in
         * the search's blocks, so the extra items are at most total keys / min split chunk and
         * at most MAX_ROUNDS x max_blocks / kv_heads. */
        const int64_t H = limits->num_kv_heads;
        const int64_t by_rounds = (KVA__SCHED_MAX_ROUNDS * L.policy.max_blocks + H - 1) / H;
        const int64_t by_keys = limits->max_total_pages * (int64_t)limits->page_size /
                                KVA__SCHED_MIN_SPLIT_CHUNK;
        L.cap_work = B + (by_rounds < by_keys ? by_rounds : by_keys);
        /* never below the block budget the binary-search planner sized for: fixed chunk sizes
         * planned without limits.min_fixed_chunk keep fitting where they did */
        if (L.cap_work < budget_items) L.cap_work = budget_items;
        L.cap_split_work = L.cap_work; /* partial states are indexed by work item */
    } else {
        int32_t tile = L.policy.qo_tile > 0 ? L.policy.qo_tile : 1;
        int32_t tile_min = L.policy.qo_tile_min > 0 && L.policy.qo_tile_min < tile
                               ? L.policy.qo_tile_min : tile;
        L.policy.qo_tile = tile;
        L.policy.qo_tile_min = tile_min;
        /* partial states are laid out for the largest tile, groups counted for the smallest */
        L.rows_per_work = (int64_t)tile * limits->num_qo_heads;
        L.cap_groups = limits->max_total_qo / tile_min + B;
        L.cap_work = L.cap_groups > budget_items ? L.cap_groups : budget_items;
        /* A searched prefill plan splits keys only when the unsplit count is under budget; a
         * few more slots let a fixed (forced) chunk size split small batches too. */
        L.cap_split_work = budget_items > 8 ? budget_items : 8;
    }
    if (limits->min_fixed_chunk > 0) {
        int64_t fixed = fixed_chunk_work_bound(limits, kind, L.cap_groups, L.policy.qo_tile);
        if (fixed < 0)
            return kva__fail(KVA_ERR_INVALID_ARG,
                             "%s: limits.min_fixed_chunk %d allows more than 2^31 work items for "
                             "these limits",
                             kva__api(), limits->min_fixed_chunk);
        if (fixed > L.cap_work) L.cap_work = fixed;
        if (fixed > L.cap_split_work) L.cap_split_work = fixed;
    }

    L.header_bytes = kva__align_up(sizeof(kva__plan_header), 64);
    int64_t ints = 3 * L.cap_work + (L.cap_groups + 1) + (B + 1) + L.cap_pages + B + (B + 1) + B + B;
    ints += 8 + (int64_t)KVA__UNIT_RECORD_INTS * L.cap_work; /* unit records, 32-byte aligned */
    L.int_section_bytes = kva__align_up((size_t)ints * sizeof(int32_t), 256);
    L.host_bytes = L.header_bytes + L.int_section_bytes;

    size_t off = L.host_bytes;
    uint64_t D = (uint64_t)limits->head_dim;
    bool fits = true;
    L.off_partial_o = off;
    fits = fits && add_f32_region(&off, (uint64_t)L.cap_split_work, (uint64_t)L.rows_per_work, D);
    L.off_partial_lse = off;
    fits = fits && add_f32_region(&off, (uint64_t)L.cap_split_work, (uint64_t)L.rows_per_work, 1);
    L.off_counters = off;
    /* decode: one counter per (request, KV head, sub-group of <= 16 query heads), and
     * num_qo_heads bounds num_kv_heads x sub-groups; prefill keeps one per (group, KV head) --
     * sizing it by query heads as well cost CPU prefill 4-5% (Zen 5, same kernels: the larger
     * workspace alone) */
    const uint64_t counter_heads = (uint64_t)(kind == KVA__PLAN_DECODE ? limits->num_qo_heads
                                                                       : limits->num_kv_heads);
    fits = fits && add_f32_region(&off, (uint64_t)L.cap_groups, counter_heads, 1);
    L.off_run_counters = off;
    const bool tree = kind == KVA__PLAN_DECODE && ctx->device == KVA_DEVICE_CUDA; /* merge tree */
    if (tree) fits = fits && add_f32_region(&off, (uint64_t)L.cap_split_work, (uint64_t)limits->num_qo_heads, 1);
    L.off_run_lse = off;
    if (tree) fits = fits && add_f32_region(&off, (uint64_t)L.cap_split_work, (uint64_t)limits->num_qo_heads, 1);
    L.off_sched = off;
    if (ctx->device == KVA_DEVICE_CUDA)
        fits = fits && add_f32_region(&off, 1, 1, KVA__SCHED_HEAD + KVA__SCHED_MAX_BLOCKS * KVA__SCHED_RING);
    L.off_scores = off;
    if (kind == KVA__PLAN_DECODE && ctx->device == KVA_DEVICE_CPU) {
        int64_t total_kv = limits->max_total_kv > 0
                               ? limits->max_total_kv
                               : limits->max_total_pages * (int64_t)limits->page_size;
        fits = fits && add_f32_region(&off, (uint64_t)limits->num_qo_heads, (uint64_t)total_kv, 1);
    }
    if (!fits)
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "%s: limits give a workspace for batch %d, %d query heads x head_dim %d "
                         "too large to address",
                         kva__api(), limits->max_batch, limits->num_qo_heads, limits->head_dim);
    L.device_bytes = off;
    *out = L;
    return KVA_OK;
}
