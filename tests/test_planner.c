/*
 * test_planner.c -- the split-KV planner (src/plan/planner.c, decode_scheduler.c) and the plan
 * functions, pure host arithmetic, no run (balance: test_decode_scheduler.c): the chunk-size search returns the smallest chunk within the budget, the
 * flattened work items cover every (request, query tile, key position) exactly once, no-split
 * gives one item per request, KVA_PLAN_GRAPH keeps the launch size fixed across re-plans,
 * query tiles are aligned to the request's end (the partial one first), and workspaces that are
 * too small are refused.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/plan/planner.h"
#include "../src/plan/prefill_balance.h"
#include "../src/plan/workspace_layout.h"

#include <stdlib.h>
#include <string.h>

static int32_t max_len_of(const int32_t *lens, int32_t n) {
    int32_t m = 1;
    for (int32_t i = 0; i < n; ++i)
        if (lens[i] > m) m = lens[i];
    return m;
}

KVA_TEST(planner_chunk_search_is_minimal) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    int32_t lens[64], qlens[64];
    for (int it = 0; it < 3000; ++it) {
        kva__split_problem p;
        memset(&p, 0, sizeof p);
        p.batch_size = kva_rng_int(&rng, 1, 64);
        for (int32_t b = 0; b < p.batch_size; ++b) {
            lens[b] = kva_rng_int(&rng, 0, 3) == 0 ? kva_rng_int(&rng, 0, 3) : kva_rng_int(&rng, 0, 20000);
            qlens[b] = kva_rng_int(&rng, 1, 300);
        }
        p.kv_len = lens;
        p.qo_len = it % 2 ? qlens : NULL;
        p.qo_tile = it % 2 ? kva_rng_int(&rng, 1, 128) : 1;
        p.num_kv_heads = kva_rng_int(&rng, 1, 16);
        p.max_blocks = kva_rng_int(&rng, 1, 2048);
        p.min_chunk = kva_rng_int(&rng, 0, 512);
        int32_t maxkv = max_len_of(lens, p.batch_size);
        int32_t c = kva__search_chunk_size(&p);
        CHECK(c >= 1);
        int64_t heads = p.num_kv_heads;
        int64_t need = kva__count_work(&p, c) * heads;
        int32_t low = p.min_chunk > 0 ? p.min_chunk : 1;
        if (low >= maxkv || kva__count_work(&p, maxkv) * heads > p.max_blocks) {
            /* nothing to gain from splitting (or the budget cannot be met): one chunk each */
            CHECK_MSG(c == maxkv, "iteration %d: chunk %d, expected the longest request %d", it, c, maxkv);
        } else {
            CHECK_MSG(need <= p.max_blocks, "iteration %d: chunk %d needs %lld blocks > %lld", it,
                      c, (long long)need, (long long)p.max_blocks);
            CHECK_MSG(c >= low, "iteration %d: chunk %d below min_chunk %d", it, c, low);
            /* minimal: one key less would exceed the budget, or we are at the floor */
            CHECK_MSG(c == low || kva__count_work(&p, c - 1) * heads > p.max_blocks,
                      "iteration %d: chunk %d is not minimal", it, c);
        }
        /* fixed and no-split override the search */
        p.fixed_chunk = kva_rng_int(&rng, 1, 999);
        CHECK(kva__search_chunk_size(&p) == p.fixed_chunk);
        p.fixed_chunk = 0;
        p.no_split = 1;
        CHECK(kva__search_chunk_size(&p) == maxkv);
    }
}

/* Every (request, query tile, key position) in exactly one work item; a group's items are one
 * (request, query tile) in key order; groups in flattening order (request, then query tile) from
 * group `ordered_from` on. */
static void check_coverage(const kva__split_problem *p, int32_t chunk, const int32_t *req,
                           const int32_t *qt, const int32_t *kt, int64_t n, const int32_t *gi,
                           int64_t ordered_from) {
    int64_t total = 0;
    for (int32_t b = 0; b < p->batch_size; ++b) {
        int32_t ql = p->qo_len ? p->qo_len[b] : 1;
        total += (int64_t)((ql + p->qo_tile - 1) / p->qo_tile) * (p->kv_len[b] > 0 ? p->kv_len[b] : 1);
    }
    unsigned char *seen = calloc((size_t)total + 1, 1);
    int64_t *base = malloc(sizeof(int64_t) * (size_t)(p->batch_size + 1));
    int64_t acc = 0;
    for (int32_t b = 0; b < p->batch_size; ++b) {
        base[b] = acc;
        int32_t ql = p->qo_len ? p->qo_len[b] : 1;
        acc += (int64_t)((ql + p->qo_tile - 1) / p->qo_tile) * (p->kv_len[b] > 0 ? p->kv_len[b] : 1);
    }
    int64_t g = 0;
    for (int64_t w = 0; w < n; ++w) {
        int32_t b = req[w], len = p->kv_len[b];
        while (gi[g + 1] <= w) ++g;
        CHECK_MSG(gi[g] <= w && w < gi[g + 1], "work item %lld outside its group", (long long)w);
        CHECK_MSG(w == gi[g] || (req[w] == req[w - 1] && qt[w] == qt[w - 1] && kt[w] == kt[w - 1] + 1),
                  "work item %lld: not the next key chunk of its group", (long long)w);
        CHECK_MSG(w == 0 || g <= ordered_from || req[w] > req[w - 1] || (req[w] == req[w - 1] && qt[w] >= qt[w - 1]),
                  "work items out of order at %lld", (long long)w);
        int64_t k0 = (int64_t)kt[w] * chunk, k1 = k0 + chunk < len ? k0 + chunk : len;
        int64_t row = base[b] + (int64_t)qt[w] * (len > 0 ? len : 1);
        if (len == 0) { /* the empty request's single item */
            CHECK_MSG(kt[w] == 0, "empty request %d has chunk %d", b, kt[w]);
            seen[row]++;
            continue;
        }
        CHECK_MSG(k0 < len, "work item %lld starts at key %lld of %d", (long long)w, (long long)k0, len);
        for (int64_t k = k0; k < k1; ++k) seen[row + k]++;
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < total; ++i) bad += seen[i] != 1;
    CHECK_MSG(bad == 0, "%lld (request, tile, key) positions not covered exactly once", (long long)bad);
    free(seen);
    free(base);
}

KVA_TEST(planner_work_covers_every_key_once) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    int32_t lens[40], qlens[40];
    for (int it = 0; it < 400; ++it) {
        kva__split_problem p;
        memset(&p, 0, sizeof p);
        p.batch_size = kva_rng_int(&rng, 0, 40);
        for (int32_t b = 0; b < p.batch_size; ++b) {
            lens[b] = kva_rng_int(&rng, 0, 4) == 0 ? 0 : kva_rng_int(&rng, 1, 3000);
            qlens[b] = kva_rng_int(&rng, 1, 200);
        }
        p.kv_len = lens;
        p.qo_len = it % 3 == 0 ? qlens : NULL;
        p.qo_tile = p.qo_len ? kva_rng_int(&rng, 1, 64) : 1;
        p.num_kv_heads = kva_rng_int(&rng, 1, 8);
        p.max_blocks = kva_rng_int(&rng, 1, 512);
        p.min_chunk = kva_rng_int(&rng, 1, 300);
        int32_t chunk = it % 4 == 0 ? kva_rng_int(&rng, 1, 500) : kva__search_chunk_size(&p);
        int64_t n = kva__count_work(&p, chunk);
        int32_t *req = malloc(sizeof(int32_t) * (size_t)(n + 1));
        int32_t *qt = malloc(sizeof(int32_t) * (size_t)(n + 1));
        int32_t *kt = malloc(sizeof(int32_t) * (size_t)(n + 1));
        int64_t groups = 0;
        for (int32_t b = 0; b < p.batch_size; ++b)
            groups += p.qo_len ? (qlens[b] + p.qo_tile - 1) / p.qo_tile : 1;
        int32_t *gi = malloc(sizeof(int32_t) * (size_t)(groups + 1));
        int64_t got = kva__flatten_work(&p, chunk, req, qt, kt, n, gi, groups + 1);
        CHECK_MSG(got == n, "flatten gave %lld items, count_work %lld", (long long)got, (long long)n);
        if (got == n) {
            CHECK(gi[0] == 0 && gi[groups] == n);
            check_coverage(&p, chunk, req, qt, kt, n, gi, 0);
        }
        /* one item short, or one group short: refused */
        if (n > 0) CHECK(kva__flatten_work(&p, chunk, req, qt, kt, n - 1, gi, groups + 1) == -1);
        if (groups > 0) CHECK(kva__flatten_work(&p, chunk, req, qt, kt, n, gi, groups) == -1);
        free(req);
        free(qt);
        free(kt);
        free(gi);
    }
}

/* group_indptr needs at least its leading 0: a capacity of 0 is refused before anything is
 * written, for an empty batch too (which would otherwise return 0 items). */
KVA_TEST(planner_flatten_refuses_zero_groups) {
    int32_t lens[2] = {10, 20}, req[4], qt[4], kt[4], gi[3] = {-7, -7, -7};
    kva__split_problem p;
    memset(&p, 0, sizeof p);
    p.batch_size = 2;
    p.kv_len = lens;
    p.qo_tile = 1;
    CHECK(kva__flatten_work(&p, 16, req, qt, kt, 4, gi, 0) == -1);
    CHECK_MSG(gi[0] == -7, "group_indptr[0] written with group capacity 0");
    p.batch_size = 0;
    CHECK(kva__flatten_work(&p, 16, req, qt, kt, 4, gi, 0) == -1);
    CHECK(gi[0] == -7);
    CHECK(kva__flatten_work(&p, 16, req, qt, kt, 4, gi, 1) == 0 && gi[0] == 0);
}

/* Query tiles are aligned to the request's end: in order they partition [0, qo_len), every one
 * holds `tile` tokens but the first, and under a bottom-right causal mask no tile ends later than
 * it would aligned to the start -- so the key tiles (of 128) the causal tiles walk in all never
 * grow, and for the GPU's d64 items (48 tokens) over 512 queries they shrink from 29 to 28. */
KVA_TEST(planner_query_tiles_align_to_the_end) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    for (int it = 0; it < 2000; ++it) {
        const int32_t qo_len = it < 1000 ? it / 10 + 1 : kva_rng_int(&rng, 1, 5000), tile = kva_rng_int(&rng, 1, 200);
        const int32_t tiles = (qo_len + tile - 1) / tile;
        int32_t next = 0;
        int64_t walked = 0, walked_top = 0;
        for (int32_t t = 0; t < tiles; ++t) {
            int32_t tok0 = -1, ntok = -1;
            kva__qo_tile_span(qo_len, tile, t, &tok0, &ntok);
            CHECK_MSG(tok0 == next && ntok >= 1 && ntok <= tile && (t == 0 || ntok == tile),
                      "qo_len %d tile %d: tile %d = [%d, +%d) after %d", qo_len, tile, t, tok0, ntok, next);
            next = tok0 + ntok;
            const int32_t top_end = (t + 1) * tile < qo_len ? (t + 1) * tile : qo_len;
            CHECK(next <= top_end);
            walked += (next + 127) / 128;
            walked_top += (top_end + 127) / 128;
        }
        CHECK_MSG(next == qo_len, "qo_len %d tile %d: tiles end at %d", qo_len, tile, next);
        CHECK(walked <= walked_top);
    }
    int64_t walked = 0;
    for (int32_t t = 0; t < 11; ++t) {
        int32_t tok0, ntok;
        kva__qo_tile_span(512, 48, t, &tok0, &ntok);
        walked += (tok0 + ntok + 127) / 128;
    }
    CHECK_MSG(walked == 28, "512 queries in tiles of 48 walk %lld key tiles", (long long)walked);
}

/* ---- kva_decode_plan / kva_prefill_plan ------------------------------------------------------- */

typedef struct table {
    int32_t indptr[65], indices[4096], last[64];
    kva_page_table pt;
} table;

static void random_table(kva_rng *rng, table *t, int32_t batch, int32_t page_size,
                         int32_t max_pages_each, int32_t num_pages) {
    t->indptr[0] = 0;
    for (int32_t b = 0; b < batch; ++b) {
        int32_t np = kva_rng_int(rng, 0, max_pages_each);
        t->indptr[b + 1] = t->indptr[b] + np;
        t->last[b] = np ? kva_rng_int(rng, 1, page_size) : 0;
    }
    for (int32_t i = 0; i < t->indptr[batch]; ++i) t->indices[i] = kva_rng_int(rng, 0, num_pages - 1);
    t->pt.batch_size = batch;
    t->pt.indptr = t->indptr;
    t->pt.indices = t->indices;
    t->pt.last_page_len = t->last;
}

static int32_t table_len(const table *t, int32_t b, int32_t page_size) {
    int32_t np = t->indptr[b + 1] - t->indptr[b];
    return np ? (np - 1) * page_size + t->last[b] : 0;
}

/* A decode plan, read back from the plan struct and its unit records: merge_indptr is a CSR
 * over the requests in work order, each request appears in exactly one group, its chunks
 * (records' key ranges, in chunk order, none longer than kv_chunk_size) cover its keys once,
 * records name their group's merge range, and groups come longest chunk first. */
static void check_decode_plan(const kva_plan *plan, const table *t, int32_t page_size) {
    int32_t B = t->pt.batch_size, split = 0, seen[64] = {0};
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    const int32_t *rec = kva__plan_ints(plan->workspace.host) + h->off_unit_records;
    const int32_t *gi = plan->merge_indptr;
    CHECK(gi[0] == 0 && gi[B] == plan->num_work);
    int32_t prev_keys = INT32_MAX;
    for (int32_t j = 0; j < B; ++j) {
        CHECK_MSG(gi[j + 1] > gi[j], "group %d has no work item", j);
        if (gi[j + 1] <= gi[j]) continue;
        int32_t b = plan->request_indices[gi[j]], len = table_len(t, b, page_size), at = 0;
        CHECK(b >= 0 && b < B);
        if (b < 0 || b >= B) continue;
        seen[b]++;
        split |= gi[j + 1] - gi[j] > 1;
        for (int32_t w = gi[j]; w < gi[j + 1]; ++w) {
            const int32_t *r = rec + (size_t)w * KVA__UNIT_RECORD_INTS;
            CHECK(plan->request_indices[w] == b && r[KVA__UR_REQUEST] == b);
            CHECK(plan->kv_tile_indices[w] == w - gi[j]);
            CHECK(r[KVA__UR_ITEM_BEG] == gi[j] && r[KVA__UR_ITEM_END] == gi[j + 1]);
            CHECK(r[KVA__UR_KV_LEN] == len);
            CHECK_MSG(r[KVA__UR_KEY_BEG] == at && r[KVA__UR_KEY_END] > at - (len == 0) &&
                          r[KVA__UR_KEY_END] - at <= plan->kv_chunk_size,
                      "request %d chunk %d: keys [%d, %d), expected from %d, chunk %d", b,
                      w - gi[j], r[KVA__UR_KEY_BEG], r[KVA__UR_KEY_END], at, plan->kv_chunk_size);
            at = r[KVA__UR_KEY_END];
        }
        CHECK_MSG(at == len, "request %d: chunks end at key %d of %d", b, at, len);
        const int32_t *r0 = rec + (size_t)gi[j] * KVA__UNIT_RECORD_INTS;
        int32_t first = r0[KVA__UR_KEY_END] - r0[KVA__UR_KEY_BEG];
        /* fixed chunks keep the same order key (chunk or the whole short request) */
        CHECK_MSG(first <= prev_keys, "group %d (%d keys) after a group of %d keys", j, first, prev_keys);
        prev_keys = first;
    }
    for (int32_t b = 0; b < B; ++b) CHECK_MSG(seen[b] == 1, "request %d in %d groups", b, seen[b]);
    CHECK(plan->split_kv == split);
}

KVA_TEST(planner_decode_plans) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const int32_t page_size = 16, num_pages = 500;
    kva_plan_limits lim = {64, 4096, 0, 0, 32, 8, 128, page_size, 0};
    size_t db, hb;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &db, &hb));
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    kva__workspace_layout layout;
    REQUIRE_OK(kva__compute_layout(ctx, &lim, KVA__PLAN_DECODE, &layout));
    table t;
    for (int it = 0; it < 200; ++it) {
        int32_t B = kva_rng_int(&rng, 0, 64);
        random_table(&rng, &t, B, page_size, 60, num_pages);
        kva_plan plan;
        uint32_t flags = it % 3 == 0 ? KVA_PLAN_NO_SPLIT : (it % 3 == 1 ? KVA_PLAN_GRAPH : 0);
        kva_plan_options opt = {flags, 0, (kva_decode_algo)(it % 2)};
        kva_status st = kva_decode_plan(ctx, &lim, &t.pt, num_pages, &opt, ws, &plan);
        CHECK_MSG(st == KVA_OK, "plan %d: %s (%s)", it, kva_status_str(st), kva_last_error());
        if (st != KVA_OK) continue;
        CHECK(plan.batch_size == B && plan.qo_tile_size == 1 && plan.kind == KVA__PLAN_DECODE);
        check_decode_plan(&plan, &t, page_size);
        int32_t maxkv = 1;
        for (int32_t b = 0; b < B; ++b) { int32_t len = table_len(&t, b, page_size); if (len > maxkv) maxkv = len; }
        if (flags & KVA_PLAN_NO_SPLIT) {
            CHECK(plan.num_work == B && !plan.split_kv && plan.kv_chunk_size >= maxkv);
            CHECK(plan.padded_work == plan.num_work);
        } else if (flags & KVA_PLAN_GRAPH) {
            /* the launch shape is the workspace's capacity, whatever the batch */
            CHECK_MSG(plan.padded_work == layout.cap_work && plan.num_work <= plan.padded_work,
                      "graph plan %d: padded_work %d, capacity %lld, num_work %d", it,
                      plan.padded_work, (long long)layout.cap_work, plan.num_work);
        } else {
            CHECK(plan.padded_work == plan.num_work);
        }
    }
    /* fixed chunks: exactly ceil(len / chunk) items per request */
    random_table(&rng, &t, 5, page_size, 10, num_pages);
    kva_plan_options fixed = {0, 37, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan;
    REQUIRE_OK(kva_decode_plan(ctx, &lim, &t.pt, num_pages, &fixed, ws, &plan));
    CHECK(plan.kv_chunk_size == 37);
    for (int32_t j = 0; j < 5; ++j) {
        int32_t b = plan.request_indices[plan.merge_indptr[j]];
        int32_t len = table_len(&t, b, page_size), n = len ? (len + 36) / 37 : 1;
        CHECK(plan.merge_indptr[j + 1] - plan.merge_indptr[j] == n);
    }
    check_decode_plan(&plan, &t, page_size);
    free(ws.device);
    free(ws.host);
    kva_context_destroy(ctx);
}

KVA_TEST(planner_workspace_too_small) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {8, 64, 0, 0, 8, 2, 64, 16, 0};
    size_t db, hb;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &db, &hb));
    CHECK(db > 0 && hb > 0);
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    table t;
    random_table(&rng, &t, 4, 16, 8, 100);
    kva_plan plan;
    kva_workspace small = ws;
    small.device_bytes = db - 1;
    CHECK_STATUS(kva_decode_plan(ctx, &lim, &t.pt, 100, NULL, small, &plan), KVA_ERR_WORKSPACE_TOO_SMALL);
    small = ws;
    small.host_bytes = hb - 1;
    CHECK_STATUS(kva_decode_plan(ctx, &lim, &t.pt, 100, NULL, small, &plan), KVA_ERR_WORKSPACE_TOO_SMALL);
    /* more pages than the limits allow (65 in the last request alone: with +64, a draw whose
     * first three requests were empty gave exactly the limit, and the plan was rightly made) */
    t.indptr[4] = t.indptr[3] + 65;
    for (int32_t i = t.indptr[3]; i < t.indptr[4]; ++i) t.indices[i] = 0;
    t.last[3] = 1;
    CHECK_STATUS(kva_decode_plan(ctx, &lim, &t.pt, 100, NULL, ws, &plan), KVA_ERR_WORKSPACE_TOO_SMALL);
    /* fixed chunks that need more work items than the workspace holds */
    random_table(&rng, &t, 8, 16, 8, 100);
    t.indptr[1] = 8; /* request 0: 8 full pages = 128 keys, at chunk 1 that is 128 items */
    for (int32_t b = 1; b <= 8; ++b) t.indptr[b] = 8 * b;
    for (int32_t b = 0; b < 8; ++b) t.last[b] = 16;
    for (int32_t i = 0; i < 64; ++i) t.indices[i] = i;
    kva_plan_options tiny = {0, 1, KVA_DECODE_PARTIAL_ROWMAX};
    CHECK_STATUS(kva_decode_plan(ctx, &lim, &t.pt, 100, &tiny, ws, &plan), KVA_ERR_WORKSPACE_TOO_SMALL);
    /* global rowmax needs its score scratch: more keys than max_total_kv */
    kva_plan_limits lim_kv = lim;
    lim_kv.max_total_kv = 100;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim_kv, &db, &hb));
    kva_workspace ws_kv = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    kva_plan_options alg2 = {0, 0, KVA_DECODE_GLOBAL_ROWMAX};
    CHECK_STATUS(kva_decode_plan(ctx, &lim_kv, &t.pt, 100, &alg2, ws_kv, &plan), KVA_ERR_WORKSPACE_TOO_SMALL);
    CHECK(kva_last_error()[0] != 0);
    free(ws_kv.device);
    free(ws_kv.host);
    free(ws.device);
    free(ws.host);
    kva_context_destroy(ctx);
}

/* Re-planning into one workspace: a new plan replaces the old one, and the old plan object is
 * refused (it would read the new plan's arrays) when its work count no longer matches. */
KVA_TEST(planner_replan_same_workspace) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {16, 512, 0, 0, 4, 2, 32, 8, 0};
    size_t db, hb;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &db, &hb));
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    table t1, t2;
    random_table(&rng, &t1, 3, 8, 20, 50);
    random_table(&rng, &t2, 11, 8, 20, 50);
    kva_plan_options graph = {KVA_PLAN_GRAPH, 0, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan p1, p2;
    REQUIRE_OK(kva_decode_plan(ctx, &lim, &t1.pt, 50, &graph, ws, &p1));
    int32_t padded = p1.padded_work;
    REQUIRE_OK(kva_decode_plan(ctx, &lim, &t2.pt, 50, &graph, ws, &p2));
    CHECK(p2.padded_work == padded);
    check_decode_plan(&p2, &t2, 8);
    if (p1.num_work != p2.num_work) {
        kva_attn_params prm = kva_attn_params_default(4, 2, 32);
        float q[3 * 4 * 32], o[3 * 4 * 32];
        static float pool[50 * 8 * 2 * 32];
        kva_kv_pages pages = kva_kv_pages_separate(pool, pool, KVA_F32, 50, 8, 2, 32, KVA_LAYOUT_NHD);
        CHECK_STATUS(kva_decode_run(ctx, &p1, &prm, kva_tensor_nhd(q, KVA_F32, 4, 32), &pages,
                                    kva_tensor_nhd(o, KVA_F32, 4, 32), NULL),
                     KVA_ERR_BAD_STATE);
    }
    free(ws.device);
    free(ws.host);
    kva_context_destroy(ctx);
}

/* 128-key tiles work item i's query tile sees under a causal mask (the CPU's planning tile). */
static int32_t causal_tiles(const kva_plan *plan, const int32_t *qlens, const int32_t *klens, int32_t i) {
    const int32_t b = plan->request_indices[i];
    return (kva__balance_causal_keys(qlens[b], klens[b], plan->qo_tile_size, plan->qo_tile_indices[i]) + 127) / 128;
}

KVA_TEST(planner_prefill_plans_cover_queries_and_keys) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim = {20, 2048, 40000, 8000, 8, 2, 64, 16, 0};
    size_t db, hb;
    REQUIRE_OK(kva_prefill_workspace_size(ctx, &lim, &db, &hb));
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    for (int it = 0; it < 60; ++it) {
        int32_t B = kva_rng_int(&rng, 1, 20);
        int32_t qo_indptr[21], kv_indptr[21], qlens[20], klens[20];
        qo_indptr[0] = kv_indptr[0] = 0;
        for (int32_t b = 0; b < B; ++b) {
            qlens[b] = kva_rng_int(&rng, 1, 300);
            klens[b] = qlens[b] + kva_rng_int(&rng, 0, 1500);
            qo_indptr[b + 1] = qo_indptr[b] + qlens[b];
            kv_indptr[b + 1] = kv_indptr[b] + klens[b];
        }
        kva_plan plan;
        kva_plan_options opt = {it % 2 ? KVA_PLAN_NO_SPLIT : 0, 0, KVA_DECODE_PARTIAL_ROWMAX};
        kva_status st = kva_prefill_plan(ctx, &lim, B, qo_indptr, kv_indptr, NULL, 0, &opt, ws, &plan);
        CHECK_MSG(st == KVA_OK, "prefill plan %d: %s (%s)", it, kva_status_str(st), kva_last_error());
        if (st != KVA_OK) continue;
        kva__split_problem p;
        memset(&p, 0, sizeof p);
        p.batch_size = B;
        p.kv_len = klens;
        p.qo_len = qlens;
        p.qo_tile = plan.qo_tile_size;
        CHECK(plan.qo_tile_size >= 1);
        /* the leading groups (the launch's last wave) may be ordered by the 128-key tiles a causal
         * mask leaves them, fewest first (prefill_balance.h); the rest in flattening order */
        const int32_t *gi = plan.merge_indptr;
        int64_t groups = 0, lead = 1;
        for (int32_t b = 0; b < B; ++b) groups += (qlens[b] + plan.qo_tile_size - 1) / plan.qo_tile_size;
        CHECK(gi[0] == 0 && gi[groups] == plan.num_work);
        while (lead < groups && causal_tiles(&plan, qlens, klens, gi[lead]) >= causal_tiles(&plan, qlens, klens, gi[lead - 1]))
            ++lead;
        check_coverage(&p, plan.kv_chunk_size, plan.request_indices, plan.qo_tile_indices,
                       plan.kv_tile_indices, plan.num_work, plan.merge_indptr, lead);
        if (opt.flags & KVA_PLAN_NO_SPLIT) CHECK(!plan.split_kv);
    }
    /* Four requests of four 64-token tiles (1, 1, 2 and 2 tiles of 128 keys under a causal mask):
     * the launch walks the plan from its last item, so the plan lists them fewest tiles first --
     * every request's first two tiles, then every request's last two, each in plan order -- and
     * the walk meets the long ones first; with KVA_PLAN_FULL_ATTENTION they stay in request order. */
    const int32_t qo4[5] = {0, 256, 512, 768, 1024};
    for (int full = 0; full < 2; ++full) {
        kva_plan plan;
        kva_plan_options opt = {full ? KVA_PLAN_FULL_ATTENTION | KVA_PLAN_NO_SPLIT : KVA_PLAN_NO_SPLIT, 0,
                                KVA_DECODE_PARTIAL_ROWMAX};
        CHECK_OK(kva_prefill_plan(ctx, &lim, 4, qo4, qo4, NULL, 0, &opt, ws, &plan));
        CHECK(plan.qo_tile_size == 64 && plan.num_work == 16);
        if (plan.qo_tile_size != 64 || plan.num_work != 16) break;
        for (int32_t i = 0; i < 16; ++i) {
            const int32_t b = full ? i / 4 : (i % 8) / 2, t = full ? i % 4 : (i / 8) * 2 + i % 2;
            CHECK_MSG(plan.request_indices[i] == b && plan.qo_tile_indices[i] == t && plan.merge_indptr[i] == i,
                      "%s plan, item %d: request %d tile %d, expected request %d tile %d", full ? "full" : "causal", i,
                      plan.request_indices[i], plan.qo_tile_indices[i], b, t);
        }
    }
    free(ws.device);
    free(ws.host);
    kva_context_destroy(ctx);
}

/* The rule that keeps a large GQA group's decode plan on the sub-group kernel (plan.c, CUDA on
 * Hopper): one round of its grid (work items x KV heads within the budget), some request split,
 * and every split request in at least the shared merge's minimum of chunks. */
KVA_TEST(planner_subgroup_plans_need_one_round_and_shared_merges) {
    kva__split_policy pol = {0};
    pol.subgroup_blocks = 52;
    pol.subgroup_min_chunks = 16;
    const int32_t lone[2] = {0, 43};               /* one request in 43 chunks */
    const int32_t mixed[4] = {0, 20, 21, 22};       /* 20 chunks beside two unsplit requests */
    const int32_t few[3] = {0, 16, 31};             /* 16 and 15 chunks */
    const int32_t unsplit[4] = {0, 1, 2, 3};
    CHECK(kva__subgroup_plan_merges_shared(43, lone, 1, 1, &pol));
    CHECK(kva__subgroup_plan_merges_shared(22, mixed, 3, 1, &pol));
    CHECK(kva__subgroup_plan_merges_shared(22, mixed, 3, 2, &pol));      /* 44 units of 52 */
    CHECK(!kva__subgroup_plan_merges_shared(22, mixed, 3, 3, &pol));     /* 66 units: two rounds */
    CHECK(!kva__subgroup_plan_merges_shared(31, few, 2, 1, &pol));       /* a request of 15 chunks */
    CHECK(!kva__subgroup_plan_merges_shared(3, unsplit, 3, 1, &pol));    /* nothing to merge */
    CHECK(!kva__subgroup_plan_merges_shared(-1, lone, 1, 1, &pol));      /* did not fit */
    pol.subgroup_blocks = 43; /* (boundaries: exactly one round, exactly the minimum) */
    CHECK(kva__subgroup_plan_merges_shared(43, lone, 1, 1, &pol));
    pol.subgroup_blocks = 42;
    CHECK(!kva__subgroup_plan_merges_shared(43, lone, 1, 1, &pol));
    pol.subgroup_blocks = 52;
    pol.subgroup_min_chunks = 43;
    CHECK(kva__subgroup_plan_merges_shared(43, lone, 1, 1, &pol));
    pol.subgroup_min_chunks = 44;
    CHECK(!kva__subgroup_plan_merges_shared(43, lone, 1, 1, &pol));
}

/* ... and only batches of few keys are searched for it: keys x KV heads up to the policy's bound,
 * or up to its long-request bound where the requests average its long length or more, and on a
 * line between the two bounds where they average between half the long length and the whole */
KVA_TEST(planner_subgroup_plans_need_a_small_batch) {
    kva__split_policy pol = {0};
    pol.subgroup_max_keys = 19660; /* 6 M / (5 sub-groups x d64) */
    const int32_t one[1] = {19660}, over[1] = {19661}, two[2] = {9830, 9830}, two_over[2] = {9830, 9831};
    const int32_t empty[2] = {0, 0};
    CHECK(kva__subgroup_batch_fits(one, 1, 1, &pol));
    CHECK(!kva__subgroup_batch_fits(over, 1, 1, &pol));
    CHECK(kva__subgroup_batch_fits(two, 2, 1, &pol));
    CHECK(!kva__subgroup_batch_fits(two_over, 2, 1, &pol));
    CHECK(!kva__subgroup_batch_fits(one, 1, 2, &pol)); /* two KV heads: twice the keys */
    CHECK(kva__subgroup_batch_fits(empty, 2, 8, &pol));
    /* long requests: up to 45875 keys (14 M / (5 x d64)) at a mean of 16384 keys or more */
    pol.subgroup_long_max_keys = 45875;
    pol.subgroup_long_request = 16384;
    const int32_t long_one[1] = {45875}, long_over[1] = {45876}, long_two[2] = {16384, 16384};
    const int32_t short_two[2] = {16384, 16383}, mixed[2] = {32768, 100}, heads2[1] = {22937};
    const int32_t heads2_over[1] = {22938};
    CHECK(kva__subgroup_batch_fits(long_one, 1, 1, &pol));
    CHECK(!kva__subgroup_batch_fits(long_over, 1, 1, &pol));
    CHECK(kva__subgroup_batch_fits(long_two, 2, 1, &pol));  /* a mean of exactly 16384 */
    CHECK(kva__subgroup_batch_fits(short_two, 2, 1, &pol)); /* 32767 keys at a mean of 16383: the
                                                             * line's bound there is 45871 */
    CHECK(kva__subgroup_batch_fits(mixed, 2, 1, &pol));     /* (the mean, not every request) */
    CHECK(kva__subgroup_batch_fits(heads2, 1, 2, &pol));    /* 45874 keys x heads */
    CHECK(!kva__subgroup_batch_fits(heads2_over, 1, 2, &pol));
    CHECK(kva__subgroup_batch_fits(two, 2, 1, &pol)); /* the short bound still holds alone */
    /* the line from 19660 keys at a mean of 8192 to 45875 at 16384: 26213 at 10240, 32767 at
     * 12288, 45871 at 16383 */
    const int32_t half3[3] = {8192, 8192, 8192}; /* 24576 keys at a mean of half the long length */
    const int32_t mid2[2] = {12288, 12288}, mid3[3] = {12288, 12288, 12288};
    const int32_t low2[2] = {10240, 10240}, low3[3] = {10240, 10240, 10240};
    CHECK(!kva__subgroup_batch_fits(half3, 3, 1, &pol)); /* (there: the short bound) */
    CHECK(kva__subgroup_batch_fits(mid2, 2, 1, &pol));   /* 24576 keys */
    CHECK(!kva__subgroup_batch_fits(mid3, 3, 1, &pol));  /* 36864 */
    CHECK(kva__subgroup_batch_fits(low2, 2, 1, &pol));   /* 20480 */
    CHECK(!kva__subgroup_batch_fits(low3, 3, 1, &pol));  /* 30720 */
    const int32_t heads2_mid[1] = {12288}; /* 24576 keys x heads at a mean of 12288 */
    CHECK(kva__subgroup_batch_fits(heads2_mid, 1, 2, &pol));
    const int32_t heads2_half[1] = {8192}; /* 16384 keys x heads: within the short bound */
    CHECK(kva__subgroup_batch_fits(heads2_half, 1, 2, &pol));
    const int32_t heads3_mid[1] = {12288}; /* 36864 keys x heads at a mean of 12288: over the line */
    CHECK(!kva__subgroup_batch_fits(heads3_mid, 1, 3, &pol));
    /* the line exactly, on a steep policy where one request meets it: from 100 keys at a mean of
     * 500 to 10000 at 1000, i.e. 100 + 19.8 (mean - 500), 515 at 521 keys and 535 at 522 */
    kva__split_policy line = {0};
    line.subgroup_max_keys = 100;
    line.subgroup_long_max_keys = 10000;
    line.subgroup_long_request = 1000;
    const int32_t at_half[1] = {500}, under[1] = {521}, on[1] = {522}, two_on[2] = {522, 522};
    CHECK(!kva__subgroup_batch_fits(at_half, 1, 1, &line));
    CHECK(!kva__subgroup_batch_fits(under, 1, 1, &line));
    CHECK(kva__subgroup_batch_fits(on, 1, 1, &line));
    CHECK(!kva__subgroup_batch_fits(two_on, 2, 1, &line)); /* 1044 keys at a mean of 522 */
    pol.subgroup_long_request = 0; /* no long rule */
    CHECK(!kva__subgroup_batch_fits(long_two, 2, 1, &pol));
    CHECK(kva__subgroup_batch_fits(one, 1, 1, &pol));
    pol.subgroup_long_request = 16384; /* a long bound below the short one: the short one holds */
    pol.subgroup_long_max_keys = 100;
    CHECK(kva__subgroup_batch_fits(one, 1, 1, &pol));
    CHECK(!kva__subgroup_batch_fits(over, 1, 1, &pol));
    CHECK(!kva__subgroup_batch_fits(long_two, 2, 1, &pol));
}

