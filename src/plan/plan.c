/*
 * plan.c -- kva_decode_plan / kva_prefill_plan: validate the batch's host arrays, choose the
 * split (decode: decode_scheduler.c; prefill: planner.c), and write header + index arrays into
 * the workspace's host part; on CUDA, upload them to the device part with one async copy.
 */
#include "planner.h"
#include "prefill_balance.h"
#include "decode_scheduler.h"
#include "workspace_layout.h"
#include "../common/internal.h"
#include "../cuda/cuda_backend.h"

#include <string.h>

kva_status kva_decode_workspace_size(const kva_context *ctx, const kva_plan_limits *limits,
                                     size_t *device_bytes, size_t *host_bytes) {
    KVA_API("kva_decode_workspace_size");
    KVA_CHECK_NULL(device_bytes);
    KVA_CHECK_NULL(host_bytes);
    kva__workspace_layout L;
    KVA_TRY(kva__compute_layout(ctx, limits, KVA__PLAN_DECODE, &L));
    *device_bytes = L.device_bytes;
    *host_bytes = L.host_bytes;
    return KVA_OK;
}

kva_status kva_prefill_workspace_size(const kva_context *ctx, const kva_plan_limits *limits,
                                      size_t *device_bytes, size_t *host_bytes) {
    KVA_API("kva_prefill_workspace_size");
    KVA_CHECK_NULL(device_bytes);
    KVA_CHECK_NULL(host_bytes);
    KVA_CHECK_NULL(limits);
    kva__workspace_layout R;
    KVA_TRY(kva__compute_layout(ctx, limits, KVA__PLAN_PREFILL_RAGGED, &R));
    size_t dev = R.device_bytes, host = R.host_bytes;
    /* page_size 0 means "ragged plans only"; otherwise size for paged plans too. Outputs are
     * written only once both layouts are known to be valid. */
    if (limits->page_size != 0) {
        kva__workspace_layout L;
        KVA_TRY(kva__compute_layout(ctx, limits, KVA__PLAN_PREFILL_PAGED, &L));
        if (L.device_bytes > dev) dev = L.device_bytes;
        if (L.host_bytes > host) host = L.host_bytes;
    }
    *device_bytes = dev;
    *host_bytes = host;
    return KVA_OK;
}

static kva_status check_workspace(const kva__workspace_layout *L, kva_workspace ws) {
    if (!ws.host || !ws.device)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: workspace.host and workspace.device are required",
                         kva__api());
    if (ws.host_bytes < L->host_bytes || ws.device_bytes < L->device_bytes)
        return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "%s: workspace has %zu host / %zu device bytes, these limits need %zu / %zu",
                         kva__api(), ws.host_bytes, ws.device_bytes, L->host_bytes, L->device_bytes);
    if (((uintptr_t)ws.host | (uintptr_t)ws.device) % 64 != 0)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: workspace.host / workspace.device must be 64-byte aligned",
                         kva__api());
    return KVA_OK;
}

/* Checks a CSR indptr: indptr[0] == 0, non-decreasing, total <= cap. */
static kva_status check_indptr(const char *what, const int32_t *indptr, int32_t batch,
                               int64_t cap) {
    const char *api = kva__api();
    if (!indptr) return kva__fail(KVA_ERR_INVALID_ARG, "%s: %s is NULL", api, what);
    if (indptr[0] != 0)
        return kva__fail(KVA_ERR_BAD_SHAPE, "%s: %s[0] = %d, must be 0", api, what, indptr[0]);
    for (int32_t b = 0; b < batch; ++b)
        if (indptr[b + 1] < indptr[b])
            return kva__fail(KVA_ERR_BAD_SHAPE, "%s: %s decreases at request %d (%d -> %d)", api,
                             what, b, indptr[b], indptr[b + 1]);
    if (indptr[batch] > cap)
        return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "%s: %s[%d] = %d exceeds the limit %lld the workspace was sized for", api,
                         what, batch, indptr[batch], (long long)cap);
    return KVA_OK;
}

/* Validates a page table against the pool; writes kv_len per request. */
static kva_status check_page_table(const kva_page_table *pt, int32_t num_pages, int32_t page_size,
                                   int64_t cap_pages, int32_t *kv_len) {
    KVA_TRY(check_indptr("page_table.indptr", pt->indptr, pt->batch_size, cap_pages));
    int32_t total = pt->indptr[pt->batch_size];
    if (total > 0 && !pt->indices)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: page_table.indices is NULL", kva__api());
    if (pt->batch_size > 0 && !pt->last_page_len)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: page_table.last_page_len is NULL", kva__api());
    for (int32_t i = 0; i < total; ++i)
        if (pt->indices[i] < 0 || pt->indices[i] >= num_pages)
            return kva__fail(KVA_ERR_OUT_OF_RANGE,
                             "%s: page_table.indices[%d] = %d is outside the pool (0..%d)",
                             kva__api(), i, pt->indices[i], num_pages - 1);
    for (int32_t b = 0; b < pt->batch_size; ++b) {
        int32_t np = pt->indptr[b + 1] - pt->indptr[b];
        int32_t last = pt->last_page_len[b];
        if (np == 0) {
            kv_len[b] = 0;
            continue;
        }
        if (last < 1 || last > page_size)
            return kva__fail(KVA_ERR_OUT_OF_RANGE,
                             "%s: page_table.last_page_len[%d] = %d must be in 1..page_size (%d)",
                             kva__api(), b, last, page_size);
        int64_t len = (int64_t)(np - 1) * page_size + last;
        if (len > INT32_MAX)
            return kva__fail(KVA_ERR_OUT_OF_RANGE, "%s: page_table request %d has %lld keys (> 2^31)",
                             kva__api(), b, (long long)len);
        kv_len[b] = (int32_t)len;
    }
    return KVA_OK;
}

int kva__subgroup_batch_fits(const int32_t *kv_len, int32_t B, int32_t num_kv_heads, const kva__split_policy *pol) {
    const int64_t bound = pol->subgroup_long_max_keys > pol->subgroup_max_keys ? pol->subgroup_long_max_keys
                                                                                : pol->subgroup_max_keys;
    int64_t head_keys = 0;
    for (int32_t b = 0; b < B; ++b) {
        head_keys += (int64_t)kv_len[b] * num_kv_heads;
        if (head_keys > bound) return 0;
    }
    if (head_keys <= pol->subgroup_max_keys) return 1;
    if (pol->subgroup_long_request <= 0 || num_kv_heads <= 0 || B <= 0) return 0;
    /* the requests' mean length (head_keys is a multiple of num_kv_heads): the bound rises from
     * the short one at half the long length to the long one at the long length, in a line */
    const int64_t mean = head_keys / num_kv_heads / B, full = pol->subgroup_long_request, half = full / 2;
    const int64_t span = pol->subgroup_long_max_keys - pol->subgroup_max_keys;
    if (mean <= half || span <= 0) return 0;
    if (mean >= full) return 1; /* (head_keys is within the long bound: the loop above) */
    return head_keys <= pol->subgroup_max_keys + (int64_t)((double)span * (double)(mean - half) / (double)(full - half));
}

int kva__subgroup_plan_merges_shared(int64_t w, const int32_t *gi, int32_t B, int32_t num_kv_heads,
                                     const kva__split_policy *pol) {
    if (w < 0 || w * num_kv_heads > pol->subgroup_blocks) return 0;
    int split = 0;
    for (int32_t j = 0; j < B; ++j) {
        const int32_t n = gi[j + 1] - gi[j];
        if (n > 1 && n < pol->subgroup_min_chunks) return 0;
        split = split || n > 1;
    }
    return split;
}

/* The query tile of a prefill plan: the policy's largest, unless it offers a smaller one and
 * no request has more queries than that (decode-like chunked-prefill steps would leave most rows
 * of a large tile empty). Graph plans keep the largest: a captured launch bakes in its kernel. */
static int32_t choose_qo_tile(const kva__split_policy *pol, int kind, int32_t batch,
                              const int32_t *qo_len, uint32_t flags) {
    if (kind == KVA__PLAN_DECODE || pol->qo_tile_min >= pol->qo_tile || (flags & KVA_PLAN_GRAPH))
        return pol->qo_tile;
    for (int32_t b = 0; b < batch; ++b)
        if (qo_len[b] > pol->qo_tile_min) return pol->qo_tile;
    return pol->qo_tile_min;
}

/* The persistent kernel's keys per tile (pieces are whole tiles). */
static int32_t balance_tile_keys(const kva__workspace_layout *L) {
    return L->policy.balance_tile_keys > 0 ? L->policy.balance_tile_keys : 128;
}

/* KVA_PLAN_FULL_ATTENTION on a persistent launch (policy.balance_blocks): cuts the longest item
 * into key pieces, moved so that the launch runs them last, when that evens out its last wave
 * (prefill_balance.h).
 * Only for a plan the search left whole (one item per group). The pieces become work items
 * 0 .. parts - 1 and group 0 (run last in every head; their partial states take slots 0 .. parts
 * - 1), the other items follow in their order. scratch: >= w ints (the unit records' region,
 * written later). Returns the work count; *parts_out = the pieces (0: nothing cut). */
static int64_t balance_last_wave(const kva__workspace_layout *L, int32_t num_kv_heads, const int32_t *kv_len,
                                 int32_t chunk, int32_t *scratch, int32_t *req, int32_t *qt, int32_t *kt,
                                 int32_t *gi, int64_t w, int32_t *parts_out) {
    *parts_out = 0;
    if (L->policy.balance_blocks < 2 || w > INT32_MAX) return w;
    for (int64_t i = 0; i < w; ++i) {
        if (kt[i] != 0) return w; /* the search split some request: its merge balances already */
        scratch[i] = kv_len[req[i]] < chunk ? kv_len[req[i]] : chunk;
    }
    int64_t max_parts = L->cap_split_work;
    if (max_parts > L->cap_work - w + 1) max_parts = L->cap_work - w + 1;
    if (max_parts > 64) max_parts = 64;
    kva__balance_problem bp = {(int32_t)w, scratch, num_kv_heads, L->policy.balance_blocks, balance_tile_keys(L),
                               (int32_t)max_parts, L->policy.balance_min_tiles};
    int32_t which;
    const int32_t parts = kva__balance_last_wave(&bp, &which);
    if (parts < 2) return w;
    *parts_out = parts;
    return kva__balance_apply_cut(w, which, parts, req, qt, kt, gi);
}

/* A plan that may run causal: the items every head's walk runs last (the plan's first, within
 * KVA__BALANCE_TAIL_WAVES waves of the launch's blocks) ordered so that the walk meets them
 * longest first, where that gains and the cache keeps their K/V (prefill_balance.h). scratch:
 * the unit records' region (8 ints per item of the capacity), written later. */
static void order_causal_tail(const kva__workspace_layout *L, const kva__split_problem *p, int32_t head_dim,
                              int64_t w, int32_t *scratch, int32_t *req, int32_t *qt, int32_t *kt, int32_t *gi) {
    int64_t g = 0;
    for (int32_t b = 0; b < p->batch_size; ++b) g += ((int64_t)p->qo_len[b] + p->qo_tile - 1) / p->qo_tile;
    int64_t blocks = L->policy.balance_blocks > L->policy.max_blocks ? L->policy.balance_blocks : L->policy.max_blocks;
    if (blocks < 1) blocks = 1;
    const kva__causal_tail t = {p->qo_len, p->kv_len, p->qo_tile, balance_tile_keys(L), KVA__BALANCE_TAIL_WAVES * blocks,
                                (int64_t)head_dim * 2 * 2, L->policy.order_cache_bytes};
    (void)kva__balance_causal_tail(&t, w, g, req, qt, kt, gi, scratch);
}

typedef struct plan_inputs {
    int kind;
    int32_t batch;
    const int32_t *qo_indptr;        /* prefill */
    const int32_t *kv_indptr;        /* ragged prefill */
    const kva_page_table *page_table; /* paged kinds */
    int32_t num_pages;
} plan_inputs;

static kva_status make_plan(kva_context *ctx, const kva_plan_limits *limits, const plan_inputs *in,
                            const kva_plan_options *options, kva_workspace ws, kva_plan *plan) {
    kva__workspace_layout L;
    KVA_TRY(kva__compute_layout(ctx, limits, in->kind, &L));
    KVA_TRY(check_workspace(&L, ws));
    kva_plan_options opt = {0, 0, KVA_DECODE_PARTIAL_ROWMAX};
    if (options) opt = *options;
    if (opt.algo != KVA_DECODE_PARTIAL_ROWMAX && opt.algo != KVA_DECODE_GLOBAL_ROWMAX)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: options.algo %d is unknown", kva__api(), (int)opt.algo);
    if (opt.flags & ~(uint32_t)(KVA_PLAN_NO_SPLIT | KVA_PLAN_GRAPH | KVA_PLAN_FULL_ATTENTION))
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: options.flags 0x%x has unknown bits", kva__api(),
                         opt.flags);
    if (opt.algo == KVA_DECODE_GLOBAL_ROWMAX && in->kind != KVA__PLAN_DECODE)
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "%s: options.algo: the global-rowmax algorithm exists for decode only",
                         kva__api());
    if (opt.fixed_chunk_size < 0)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: options.fixed_chunk_size %d < 0", kva__api(),
                         opt.fixed_chunk_size);
    /* The workspace holds the work items of chunks >= limits.min_fixed_chunk (sizing saw it). */
    if (opt.fixed_chunk_size > 0 && opt.fixed_chunk_size < limits->min_fixed_chunk)
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "%s: options.fixed_chunk_size %d is below limits.min_fixed_chunk %d",
                         kva__api(), opt.fixed_chunk_size, limits->min_fixed_chunk);
    if (in->batch < 0 || in->batch > limits->max_batch)
        return kva__fail(KVA_ERR_BAD_SHAPE, "%s: batch %d outside 0..limits.max_batch (%d)",
                         kva__api(), in->batch, limits->max_batch);

    if (ctx->device == KVA_DEVICE_CUDA) KVA_TRY(kva__cuda_plan_begin(ctx, ws.host));

    /* Everything is written into the host part. A failure below leaves it without a valid plan
     * (the header is cleared first), so a stale plan can never run against half-written arrays;
     * nothing outside the workspace changes. */
    kva__plan_header *h = kva__plan_header_of(ws.host);
    int32_t *ints = kva__plan_ints(ws.host);
    const uint32_t generation = h->generation; /* set by plan_into */
    memset(h, 0, sizeof *h);
    h->generation = generation;
    int64_t off = 0;
    h->off_request = off; off += L.cap_work;
    h->off_qo_tile = off; off += L.cap_work;
    h->off_kv_tile = off; off += L.cap_work;
    h->off_group_indptr = off; off += L.cap_groups + 1;
    h->off_kv_indptr = off; off += L.cap_batch + 1;
    h->off_page_indices = off; off += L.cap_pages;
    h->off_last_page_len = off; off += L.cap_batch;
    h->off_qo_indptr = off; off += L.cap_batch + 1;
    h->off_kv_len = off; off += L.cap_batch;
    h->off_qo_len = off; off += L.cap_batch;
    off = (off + 7) / 8 * 8; /* the int section starts 64-byte aligned: records are 32-byte aligned */
    h->off_unit_records = off; off += KVA__UNIT_RECORD_INTS * L.cap_work;

    int32_t *kv_len = ints + h->off_kv_len;
    int32_t *qo_indptr = ints + h->off_qo_indptr;
    int32_t *kv_indptr = ints + h->off_kv_indptr;
    int32_t B = in->batch;

    /* qo rows */
    if (in->kind == KVA__PLAN_DECODE) {
        for (int32_t b = 0; b <= B; ++b) qo_indptr[b] = b;
    } else {
        KVA_TRY(check_indptr("qo_indptr", in->qo_indptr, B, limits->max_total_qo));
        memcpy(qo_indptr, in->qo_indptr, sizeof(int32_t) * (size_t)(B + 1));
    }
    /* keys */
    int32_t page_size = 0;
    if (in->kind == KVA__PLAN_PREFILL_RAGGED) {
        int64_t cap = limits->max_total_kv > 0 ? limits->max_total_kv : INT32_MAX;
        KVA_TRY(check_indptr("kv_indptr", in->kv_indptr, B, cap));
        memcpy(kv_indptr, in->kv_indptr, sizeof(int32_t) * (size_t)(B + 1));
        for (int32_t b = 0; b < B; ++b) kv_len[b] = kv_indptr[b + 1] - kv_indptr[b];
    } else {
        const kva_page_table *pt = in->page_table;
        if (pt->batch_size != B)
            return kva__fail(KVA_ERR_BAD_SHAPE, "%s: page_table.batch_size %d != batch_size %d",
                             kva__api(), pt->batch_size, B);
        if (in->num_pages < 1)
            return kva__fail(KVA_ERR_INVALID_ARG, "%s: num_pages %d must be >= 1", kva__api(),
                             in->num_pages);
        page_size = limits->page_size;
        KVA_TRY(check_page_table(pt, in->num_pages, page_size, L.cap_pages, kv_len));
        memcpy(kv_indptr, pt->indptr, sizeof(int32_t) * (size_t)(B + 1));
        int32_t total = pt->indptr[B];
        if (total > 0)
            memcpy(ints + h->off_page_indices, pt->indices, sizeof(int32_t) * (size_t)total);
        for (int32_t b = 0; b < B; ++b)
            ints[h->off_last_page_len + b] = pt->indptr[b + 1] > pt->indptr[b] ? pt->last_page_len[b] : 0;
        if (limits->max_total_kv > 0 && in->kind == KVA__PLAN_DECODE &&
            opt.algo == KVA_DECODE_GLOBAL_ROWMAX) {
            int64_t sum = 0;
            for (int32_t b = 0; b < B; ++b) sum += kv_len[b];
            if (sum > limits->max_total_kv)
                return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                                 "%s: %lld keys exceed limits.max_total_kv %lld", kva__api(), (long long)sum,
                                 (long long)limits->max_total_kv);
        }
    }

    int32_t *qo_len = ints + h->off_qo_len;
    for (int32_t b = 0; b < B; ++b) qo_len[b] = qo_indptr[b + 1] - qo_indptr[b];
    kva__split_problem p = {0};
    p.batch_size = B;
    p.qo_len = in->kind == KVA__PLAN_DECODE ? NULL : qo_len;
    p.kv_len = kv_len;
    p.qo_tile = choose_qo_tile(&L.policy, in->kind, B, qo_len, opt.flags);
    p.num_kv_heads = limits->num_kv_heads;
    p.max_blocks = L.policy.search_blocks > 0 && L.policy.search_blocks < L.policy.max_blocks
                       ? L.policy.search_blocks : L.policy.max_blocks;
    p.min_chunk = L.policy.min_chunk;
    p.fixed_chunk = opt.fixed_chunk_size;
    p.no_split = (opt.flags & KVA_PLAN_NO_SPLIT) != 0;

    int32_t *req = ints + h->off_request, *qt = ints + h->off_qo_tile, *kt = ints + h->off_kv_tile;
    int32_t *gi = ints + h->off_group_indptr;
    int32_t chunk;
    int64_t w;
    int32_t cut_parts = 0; /* prefill: the first cut_parts work items are one item's key pieces */
    /* decode: searched plans cut each request into equal parts (decode_scheduler.h) */
    const int equal_chunks = opt.fixed_chunk_size == 0;
    if (in->kind == KVA__PLAN_DECODE) {
        /* blocks of one SM share its bandwidth; the CUDA policy's search budget (max_blocks, or
         * search_blocks where it sets one) is SMs x blocks */
        p.sm_blocks = ctx->device == KVA_DEVICE_CUDA && ctx->num_sms > 0
                          ? (int32_t)(p.max_blocks / ctx->num_sms) : 1;
        p.lone_block_percent = L.policy.lone_block_percent;
        p.merge_level_keys = L.policy.merge_level_keys;
        p.next_item_keys = L.policy.next_item_keys;
        p.split_keys = L.policy.split_keys;
        p.split_key_percent = opt.algo == KVA_DECODE_GLOBAL_ROWMAX ? L.policy.global_split_key_percent : 0;
        if (opt.algo == KVA_DECODE_GLOBAL_ROWMAX && L.policy.global_search_blocks > 0) {
            /* global rowmax runs on another kernel here (workspace_layout.h): its budget and costs */
            p.max_blocks = L.policy.global_search_blocks < L.policy.max_blocks ? L.policy.global_search_blocks
                                                                                : L.policy.max_blocks;
            /* (its budget is at most one block per SM: a lone block's faster streaming is not
             * modelled, as for the sub-group kernel's own plans) */
            p.sm_blocks = 1;
            p.next_item_keys = 0;
            p.split_keys = 0;
        }
        /* CUDA partial-rowmax decode merges long requests as a tree (workspace_layout.h) */
        p.merge_run = L.policy.merge_tree && opt.algo == KVA_DECODE_PARTIAL_ROWMAX ? KVA__MERGE_RUN : 0;
        /* graph plans' blocks walk their units forward (the kernel reads their count on the
         * device), others' backward (decode_kernel.cuh, KVA__DECODE_REVERSE) */
        p.forward_walk = (opt.flags & KVA_PLAN_GRAPH) != 0;
        /* scratch for the longest-first order: the unit records, written after flattening
         * (8 ints per work item >= 3 per request) */
        int64_t *sort_keys = (int64_t *)(void *)(ints + h->off_unit_records);
        int32_t *order = ints + h->off_unit_records + 2 * (int64_t)B;
        w = -1;
        if (L.policy.subgroup_blocks > 0 && opt.algo == KVA_DECODE_PARTIAL_ROWMAX && opt.fixed_chunk_size == 0 &&
            !(opt.flags & (KVA_PLAN_GRAPH | KVA_PLAN_NO_SPLIT)) &&
            kva__subgroup_batch_fits(kv_len, B, limits->num_kv_heads, &L.policy)) {
            /* first the sub-group kernel (kva__split_policy.subgroup_blocks), kept if its plan
             * fits one round and merges shared; a graph plan keeps the one path its capture has */
            kva__split_problem s = p;
            s.max_blocks = L.policy.subgroup_blocks;
            s.sm_blocks = ctx->num_sms > 0 ? (int32_t)(s.max_blocks / ctx->num_sms) : 1;
            s.min_chunk = L.policy.subgroup_min_chunk;
            s.lone_block_percent = L.policy.subgroup_lone_block_percent;
            s.merge_level_keys = L.policy.subgroup_merge_level_keys;
            s.next_item_keys = 0;
            s.split_keys = 0;
            s.merge_run = KVA__MERGE_RUN;
            chunk = kva__sched_decode_chunk(&s, sort_keys, order);
            w = kva__sched_decode_flatten(&s, chunk, order, req, kt, L.cap_work, gi, L.cap_groups + 1);
            if (!kva__subgroup_plan_merges_shared(w, gi, B, limits->num_kv_heads, &L.policy))
                w = -1;
            else
                p = s;
        }
        h->decode_subgroups = w >= 0;
        if (w < 0) {
            chunk = kva__sched_decode_chunk(&p, sort_keys, order); /* and the order */
            w = kva__sched_decode_flatten(&p, chunk, order, req, kt, L.cap_work, gi, L.cap_groups + 1);
        }
        for (int64_t i = 0; i < w; ++i) qt[i] = 0;
    } else {
        chunk = kva__search_chunk_size(&p);
        w = kva__flatten_work(&p, chunk, req, qt, kt, L.cap_work, gi, L.cap_groups + 1);
        /* (not with the small query tile: its plans run on the non-persistent 64-row kernel) */
        if (w > 0 && (opt.flags & KVA_PLAN_FULL_ATTENTION) && opt.fixed_chunk_size == 0 &&
            !(opt.flags & (KVA_PLAN_GRAPH | KVA_PLAN_NO_SPLIT)) && p.qo_tile == L.policy.qo_tile)
            w = balance_last_wave(&L, limits->num_kv_heads, kv_len, chunk, ints + h->off_unit_records, req, qt,
                                  kt, gi, w, &cut_parts);
        else if (w > 0 && !(opt.flags & KVA_PLAN_FULL_ATTENTION))
            order_causal_tail(&L, &p, limits->head_dim, w, ints + h->off_unit_records, req, qt, kt, gi);
    }
    if (w < 0 && opt.fixed_chunk_size > 0 && limits->min_fixed_chunk == 0)
        return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "%s: options.fixed_chunk_size %d makes %lld work items, more than the %lld "
                         "a workspace sized without limits.min_fixed_chunk holds; size it (and "
                         "plan) with limits.min_fixed_chunk = %d",
                         kva__api(), chunk, (long long)kva__count_work(&p, chunk),
                         (long long)L.cap_work, chunk);
    if (w < 0)
        return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "%s: %lld work items (chunk %d) exceed the %lld the workspace was sized for",
                         kva__api(), (long long)kva__count_work(&p, chunk), chunk, (long long)L.cap_work);
    int64_t g = 0;
    for (int32_t b = 0; b < B; ++b) g += ((int64_t)qo_len[b] + p.qo_tile - 1) / p.qo_tile;
    bool split = w > g;
    if (split && w > L.cap_split_work && opt.fixed_chunk_size > 0 && limits->min_fixed_chunk == 0)
        return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "%s: options.fixed_chunk_size %d splits into %lld work items, more than "
                         "the %lld partial states a workspace sized without "
                         "limits.min_fixed_chunk holds; size it (and plan) with "
                         "limits.min_fixed_chunk = %d",
                         kva__api(), chunk, (long long)w, (long long)L.cap_split_work, chunk);
    /* (a cut item's pieces are the only split items: slots 0 .. cut_parts - 1, checked there) */
    if (split && !cut_parts && w > L.cap_split_work)
        return kva__fail(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "%s: %lld split work items exceed the %lld partial states the workspace "
                         "was sized for",
                         kva__api(), (long long)w, (long long)L.cap_split_work);

    h->magic = KVA__PLAN_MAGIC;
    h->kind = in->kind;
    h->batch_size = B;
    h->num_work = (int32_t)w;
    h->padded_work = (opt.flags & KVA_PLAN_GRAPH) ? (int32_t)L.cap_work : (int32_t)w;
    h->num_groups = (int32_t)g;
    h->kv_chunk_size = chunk;
    h->qo_tile_size = p.qo_tile;
    h->split_kv = split;
    h->merge_groups = !split ? 0 : cut_parts ? 1 : (int32_t)g;
    h->page_size = page_size;
    h->num_pages = in->num_pages;
    h->num_qo_heads = limits->num_qo_heads;
    h->num_kv_heads = limits->num_kv_heads;
    h->head_dim = limits->head_dim;
    h->algo = opt.algo;
    h->off_partial_o = (int64_t)L.off_partial_o;
    h->off_partial_lse = (int64_t)L.off_partial_lse;
    h->off_counters = (int64_t)L.off_counters;
    h->off_run_counters = (int64_t)L.off_run_counters;
    h->off_run_lse = (int64_t)L.off_run_lse;
    h->off_sched = (int64_t)L.off_sched;
    h->off_scores = (int64_t)L.off_scores;
    h->rows_per_work = L.rows_per_work;
    h->cap_work = L.cap_work;
    if (in->kind == KVA__PLAN_DECODE) {
        /* one record per work item: what a GPU block needs before streaming, in one load;
         * group j (request req[gi[j]]) owns work items gi[j] .. gi[j+1]-1 */
        int32_t *rec = ints + h->off_unit_records;
        for (int64_t j = 0; j < g; ++j) {
            for (int64_t i = gi[j]; i < gi[j + 1]; ++i, rec += KVA__UNIT_RECORD_INTS) {
                const int32_t b = req[i], len = kv_len[b];
                int32_t beg, end;
                kva__sched_chunk_range(len, chunk, equal_chunks, kt[i], &beg, &end);
                rec[KVA__UR_REQUEST] = b;
                rec[KVA__UR_KEY_BEG] = beg;
                rec[KVA__UR_KEY_END] = end;
                rec[KVA__UR_KV_LEN] = len;
                rec[KVA__UR_PAGE_BEG] = kv_indptr[b];
                rec[KVA__UR_ITEM_BEG] = gi[j];
                rec[KVA__UR_ITEM_END] = gi[j + 1];
                rec[KVA__UR_PAD] = 0;
            }
        }
    } else {
        int32_t *rec = ints + h->off_unit_records;
        for (int64_t i = 0; i < w; ++i, rec += KVA__UNIT_RECORD_INTS) {
            const int32_t b = req[i], len = kv_len[b];
            const int64_t beg = (int64_t)kt[i] * chunk;
            int32_t tok0, ntok;
            kva__qo_tile_span(qo_len[b], p.qo_tile, qt[i], &tok0, &ntok);
            rec[KVA__UR_REQUEST] = b;
            rec[KVA__UR_KEY_BEG] = (int32_t)(beg < len ? beg : len);
            rec[KVA__UR_KEY_END] = (int32_t)(beg + chunk < len ? beg + chunk : len);
            if (i < cut_parts) /* a piece of the cut item (balance_last_wave) */
                kva__balance_piece(len, cut_parts, balance_tile_keys(&L), kt[i], &rec[KVA__UR_KEY_BEG],
                                   &rec[KVA__UR_KEY_END]);
            rec[KVA__UR_KV_LEN] = len;
            rec[KVA__UR_PAGE_BEG] = kv_indptr[b];
            rec[KVA__PR_Q_ROW0] = qo_indptr[b] + tok0;
            rec[KVA__PR_Q_TOKENS] = ntok;
            rec[KVA__PR_Q_POS0] = len - qo_len[b] + tok0;
        }
    }

    if (ctx->device == KVA_DEVICE_CUDA) {
        KVA_TRY(kva__cuda_plan_upload(ctx, ws.device, ws.host, L.host_bytes));
    }

    memset(plan, 0, sizeof *plan);
    plan->magic = KVA__PLAN_MAGIC;
    plan->kind = in->kind;
    plan->batch_size = B;
    plan->num_qo_heads = limits->num_qo_heads;
    plan->num_kv_heads = limits->num_kv_heads;
    plan->head_dim = limits->head_dim;
    plan->page_size = page_size;
    plan->kv_chunk_size = chunk;
    plan->qo_tile_size = p.qo_tile;
    plan->num_work = (int32_t)w;
    plan->padded_work = h->padded_work;
    plan->split_kv = split;
    plan->flags = opt.flags;
    plan->algo = opt.algo;
    plan->request_indices = req;
    plan->qo_tile_indices = qt;
    plan->kv_tile_indices = kt;
    plan->merge_indptr = gi;
    plan->workspace = ws;
    plan->generation = generation;
    return KVA_OK;
}

/* Every plan call starts by retiring whatever plan the workspace holds: a new generation, no
 * magic. So an older kva_plan of this workspace is stale whether this call succeeds or fails
 * (kva__check_plan compares generations). Skipped when the host part cannot hold a header. */
static kva_status plan_into(kva_context *ctx, const kva_plan_limits *limits, const plan_inputs *in,
                            const kva_plan_options *options, kva_workspace ws, kva_plan *plan) {
    if (ctx && ws.host && ws.host_bytes >= sizeof(kva__plan_header) && (uintptr_t)ws.host % 64 == 0) {
        /* on CUDA, the host part may still be read by the previous plan's upload */
        if (ctx->device == KVA_DEVICE_CUDA) KVA_TRY(kva__cuda_plan_begin(ctx, ws.host));
        kva__plan_header *h = kva__plan_header_of(ws.host);
        h->magic = 0;
        h->generation += 1;
    }
    KVA_CHECK_NULL(ctx);
    KVA_CHECK_NULL(limits);
    KVA_CHECK_NULL(plan);
    return make_plan(ctx, limits, in, options, ws, plan);
}

kva_status kva_decode_plan(kva_context *ctx, const kva_plan_limits *limits,
                           const kva_page_table *page_table, int32_t num_pages,
                           const kva_plan_options *options, kva_workspace workspace,
                           kva_plan *plan) {
    KVA_API("kva_decode_plan");
    plan_inputs in = {KVA__PLAN_DECODE, page_table ? page_table->batch_size : 0, NULL, NULL,
                      page_table, num_pages};
    if (!page_table) {
        (void)plan_into(ctx, NULL, &in, options, workspace, plan); /* retire the old plan */
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_decode_plan: page_table is NULL");
    }
    return plan_into(ctx, limits, &in, options, workspace, plan);
}

kva_status kva_prefill_plan(kva_context *ctx, const kva_plan_limits *limits, int32_t batch_size,
                            const int32_t *qo_indptr, const int32_t *kv_indptr,
                            const kva_page_table *page_table, int32_t num_pages,
                            const kva_plan_options *options, kva_workspace workspace,
                            kva_plan *plan) {
    KVA_API("kva_prefill_plan");
    plan_inputs in = {kv_indptr ? KVA__PLAN_PREFILL_RAGGED : KVA__PLAN_PREFILL_PAGED, batch_size,
                      qo_indptr, kv_indptr, page_table, num_pages};
    if (!qo_indptr || (kv_indptr == NULL) == (page_table == NULL)) {
        (void)plan_into(ctx, NULL, &in, options, workspace, plan); /* retire the old plan */
        if (!qo_indptr) return kva__fail(KVA_ERR_INVALID_ARG, "kva_prefill_plan: qo_indptr is NULL");
        return kva__fail(KVA_ERR_INVALID_ARG,
                         "kva_prefill_plan: give exactly one of kv_indptr and page_table");
    }
    return plan_into(ctx, limits, &in, options, workspace, plan);
}
