/*
 * test_prefill_balance.c -- the persistent prefill launch's last wave (src/plan/prefill_balance.c),
 * without a GPU: the cuts it chooses on the README's full-attention rows (132 blocks, 8 KV heads,
 * 128-key tiles), the pieces' key ranges, and the shapes it must leave whole. With an independent
 * check of the simulated length: on equal items the whole plan takes ceil(pairs / blocks) items'
 * time, which the cost model must reproduce before its cuts mean anything. And the rewrite of the
 * plan's work lists for a cut. And for causal plans, the order of the items the launch runs last.
 * The cut chosen is checked against an argmin recomputed by hand on random problems, and the
 * boundaries a mutation audit found untested (pieces of non-power-of-two items, one pair per
 * block, the minimum length and gain, descending windows) are pinned.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/plan/planner.h"
#include "../src/plan/prefill_balance.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ITEM_OVERHEAD 1.5 /* as prefill_balance.c's cost model */

/* Stops the test when cond fails (what follows would only cascade). */
#define REQUIRE_TRUE(cond)                                                                     \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            kva_test_fail(__FILE__, __LINE__, "REQUIRE_TRUE(%s)", #cond);                      \
            return;                                                                            \
        }                                                                                      \
    } while (0)

static kva__balance_problem equal_items(int32_t n, int32_t keys, int32_t **keys_out) {
    int32_t *k = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n; ++i) k[i] = keys;
    *keys_out = k;
    kva__balance_problem p = {n, k, 8, 132, 128, 16, 0};
    return p;
}

/* 16384 tokens x 32 query heads in 128-row items: 512 items per KV head whatever the batch
 * shape, of 16384 / B keys each (B requests of 16384 / B tokens). */
KVA_TEST(prefill_balance_equal_rows) {
    const int32_t batches[] = {1, 2, 8, 32};
    for (int c = 0; c < 4; ++c) {
        const int32_t keys = 16384 / batches[c];
        int32_t *k;
        kva__balance_problem p = equal_items(512, keys, &k);
        const double item = keys / 128 + ITEM_OVERHEAD;
        /* 4096 pairs on 132 blocks: 32 rounds for 4 of them, the cost model's whole length */
        const double whole = kva__balance_makespan(&p, -1, 1);
        CHECK_MSG(fabs(whole - 32 * item) < 1e-9, "%d x %d: whole plan %.2f, expected 32 items = %.2f",
                  batches[c], keys, whole, 32 * item);
        int32_t which;
        const int32_t parts = kva__balance_last_wave(&p, &which);
        const double mean = 4096.0 * item / 132;
        if (keys >= 16384) {
            /* long items: a cut, and the last wave within a few percent of the mean */
            CHECK_MSG(parts >= 2 && which >= 0, "%d x %d: no cut", batches[c], keys);
            const double cut = kva__balance_makespan(&p, which, parts);
            CHECK_MSG(cut < whole * 0.985 && cut < mean * 1.01,
                      "%d x %d: cut into %d: %.1f (whole %.1f, mean %.1f)", batches[c], keys, parts, cut, whole, mean);
            printf("    %d x %d: whole %.1f, cut into %d %.1f, mean %.1f tile-times\n", batches[c], keys, whole, parts, cut,
                         mean);
        } else {
            /* 512- to 8192-token rows: 4- to 64-tile items, below prefill_balance.h's minimum
             * (measured slower or level cut) */
            CHECK_MSG(parts == 0, "%d x %d: cut into %d", batches[c], keys, parts);
        }
        free(k);
    }
}

/* Pieces: whole tiles, in order, covering the item's keys once; lengths not multiples of the
 * tile, parts up to the tile count. Tile counts that are not powers of two too (640 and 1408
 * keys: 5 and 11 tiles), where the pieces' tile bounds round: a bound rounded one way for a
 * piece's start and the other for the previous piece's end would leave a gap or an overlap. */
KVA_TEST(prefill_balance_pieces) {
    const int32_t lens[] = {1, 127, 128, 129, 640, 1000, 1408, 4096, 16383};
    for (int c = 0; c < 9; ++c) {
        const int32_t keys = lens[c], tiles = (keys + 127) / 128;
        for (int32_t parts = 1; parts <= 16 && parts <= tiles; parts *= 2) {
            int32_t at = 0;
            for (int32_t j = 0; j < parts; ++j) {
                int32_t b, e;
                kva__balance_piece(keys, parts, 128, j, &b, &e);
                CHECK_MSG(b == at && e > b && (e == keys || e % 128 == 0) && b % 128 == 0,
                          "keys %d parts %d piece %d: [%d, %d) after %d", keys, parts, j, b, e, at);
                at = e;
            }
            CHECK_MSG(at == keys, "keys %d parts %d: pieces end at %d", keys, parts, at);
        }
    }
    /* 5 tiles in 2: the first piece takes floor(5 / 2) = 2 tiles, the second the other 3 */
    int32_t b0, e0, b1, e1;
    kva__balance_piece(640, 2, 128, 0, &b0, &e0);
    kva__balance_piece(640, 2, 128, 1, &b1, &e1);
    CHECK_MSG(b0 == 0 && e0 == 256 && b1 == 256 && e1 == 640, "640 keys in 2: [%d, %d) [%d, %d)", b0, e0, b1, e1);
}

/* Left whole: fewer pairs than blocks, one block, a single-tile longest item, no slots. And the
 * longest item is the one cut when lengths differ. */
KVA_TEST(prefill_balance_leaves_whole) {
    int32_t *k;
    kva__balance_problem p = equal_items(16, 16384, &k); /* 128 pairs <= 132 blocks */
    int32_t which;
    CHECK(kva__balance_last_wave(&p, &which) == 0 && which == -1);
    free(k);
    p = equal_items(4096, 128, &k); /* one tile per item */
    CHECK(kva__balance_last_wave(&p, &which) == 0);
    free(k);
    p = equal_items(512, 16384, &k);
    p.blocks = 1;
    CHECK(kva__balance_last_wave(&p, &which) == 0);
    p.blocks = 132;
    p.max_parts = 1;
    CHECK(kva__balance_last_wave(&p, &which) == 0);
    p.max_parts = 16;
    k[300] = 16384 + 512; /* one longer request's item */
    const int32_t parts = kva__balance_last_wave(&p, &which);
    CHECK_MSG(parts >= 2 && which == 300, "cut %d into %d", which, parts);
    free(k);
    /* exactly one pair per block (132 items, 1 head, 132 blocks): every item runs alone from
     * the start, a cut could only spread the long one over blocks that are idle anyway -- the
     * split search's job, not this one's. The model alone would cut it (256 tiles over 16
     * pieces), so the count's bound is what leaves it whole. */
    p = equal_items(132, 512, &k);
    k[5] = 32768;
    p.num_kv_heads = 1;
    const int32_t one_each = kva__balance_last_wave(&p, &which);
    CHECK_MSG(one_each == 0 && which == -1, "132 pairs on 132 blocks: cut %d into %d", which, one_each);
    free(k);
}

/* The simulated length against an independent simulation written from the launch's order
 * (prefill_balance.h): heads outer; within a head the plan's last item first, the cut item's
 * pieces (at the plan's front) last; each pair to the block that frees first. Random lengths,
 * so an order or a cost the model got wrong changes the number. */
static double walk_by_hand(const kva__balance_problem *p, int32_t which, int32_t parts) {
    double fin[64] = {0};
    for (int32_t kh = 0; kh < p->num_kv_heads; ++kh)
        for (int32_t pos = p->num_items - 1; pos >= -1; --pos) {
            const int32_t n = pos >= 0 ? 1 : parts > 1 ? parts : 0;
            for (int32_t j = n - 1; j >= 0; --j) {
                if (pos >= 0 && parts > 1 && pos == which) break;
                int32_t b = 0, e = p->item_keys[pos >= 0 ? pos : which];
                if (pos < 0) kva__balance_piece(e, parts, p->tile_keys, j, &b, &e);
                const double c = (double)(((int64_t)(e - b) + p->tile_keys - 1) / p->tile_keys) + ITEM_OVERHEAD;
                int m = 0;
                for (int i = 1; i < p->blocks; ++i)
                    if (fin[i] < fin[m]) m = i;
                fin[m] += c;
            }
        }
    double mx = 0;
    for (int i = 0; i < p->blocks; ++i) mx = fin[i] > mx ? fin[i] : mx;
    return mx;
}

KVA_TEST(prefill_balance_model_matches_the_walk) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    for (int c = 0; c < 200; ++c) {
        const int32_t n = 1 + (int32_t)(kva_rng_u64(&rng) % 40);
        int32_t *k = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
        for (int32_t i = 0; i < n; ++i) k[i] = (int32_t)(kva_rng_u64(&rng) % 5000);
        kva__balance_problem p = {n, k, 1 + (int32_t)(kva_rng_u64(&rng) % 3), 2 + (int32_t)(kva_rng_u64(&rng) % 30),
                                  c % 2 ? 64 : 128, 16, 1};
        const int32_t which = (int32_t)(kva_rng_u64(&rng) % (uint64_t)n), parts = 1 << (kva_rng_u64(&rng) % 4);
        const double model = kva__balance_makespan(&p, which, parts), hand = walk_by_hand(&p, which, parts);
        CHECK_MSG(fabs(model - hand) < 1e-9, "case %d (%d items, %d heads, %d blocks, cut %d into %d): model %.2f, walk %.2f",
                  c, n, p.num_kv_heads, p.blocks, which, parts, model, hand);
        free(k);
    }
}

/* An item number past the items, like -1, walks the whole plan: nothing cut, no key read past
 * the list. The list here has a long entry just past its end, so a cut of it would show. */
KVA_TEST(prefill_balance_makespan_outside_the_items) {
    int32_t k[6] = {300, 1000, 129, 4096, 77, 1 << 20};
    const kva__balance_problem p = {5, k, 2, 4, 128, 16, 0};
    const double whole = kva__balance_makespan(&p, -1, 1), past = kva__balance_makespan(&p, 5, 4);
    CHECK_MSG(past == whole, "item 5 of 5 cut into 4: %.2f, the whole plan %.2f", past, whole);
}

/* The bounds the plan's capacity relies on, and the merge's price: pieces <= max_parts and <=
 * the item's tiles; 4-tile items whose best cut gains exactly the merge's cost stay whole. */
KVA_TEST(prefill_balance_bounds) {
    int32_t *k;
    kva__balance_problem p = equal_items(512, 16384, &k);
    int32_t which;
    p.max_parts = 4;
    int32_t parts = kva__balance_last_wave(&p, &which);
    CHECK_MSG(parts >= 2 && parts <= 4, "max_parts 4: cut into %d", parts);
    free(k);
    p = equal_items(512, 3 * 128, &k); /* 3 tiles: at most 2 pieces */
    p.blocks = 7;
    p.min_cut_tiles = 1;
    for (int32_t i = 0; i < 500; ++i) k[i] = 128;
    parts = kva__balance_last_wave(&p, &which);
    CHECK_MSG(parts <= 2, "a 3-tile item cut into %d", parts);
    free(k);
    /* 32 x 512 at d128: the model's best cut (16 pieces) ends 3 tile-times earlier, what the
     * merge costs: no cut */
    p = equal_items(512, 512, &k);
    p.min_cut_tiles = 1;
    CHECK_MSG(kva__balance_last_wave(&p, &which) == 0, "32 x 512: cut");
    free(k);
}

/* The choice written out from prefill_balance.h and the cost model, without the .c file's
 * shortcuts: nothing when the pairs fit the blocks (or exceed the simulation's bound) or the
 * longest item is below the minimum; else every power of two up to the slots and the item's
 * tiles, priced at its simulated length plus the merge, the cheapest (the fewest pieces on a
 * tie) if it beats the whole plan by the minimum gain. The longest item is unique here (the
 * header does not say which of equal items is cut). */
#define MERGE_COST 3.0 /* as prefill_balance.c's cost model */
#define MIN_GAIN 0.005
static int32_t last_wave_by_hand(const kva__balance_problem *p, int32_t *which) {
    *which = -1;
    const int64_t pairs = (int64_t)p->num_items * p->num_kv_heads;
    if (p->blocks < 2 || p->max_parts < 2 || pairs <= p->blocks || pairs > KVA__BALANCE_MAX_PAIRS) return 0;
    int32_t w = 0;
    for (int32_t i = 0; i < p->num_items; ++i) w = p->item_keys[i] > p->item_keys[w] ? i : w;
    const int32_t tiles = (p->item_keys[w] + p->tile_keys - 1) / p->tile_keys;
    if (tiles < (p->min_cut_tiles > 0 ? p->min_cut_tiles : KVA__BALANCE_MIN_CUT_TILES)) return 0;
    int32_t arg = 0;
    double cheapest = 0.0;
    for (int32_t parts = 2; parts <= p->max_parts && parts <= tiles; parts *= 2) {
        const double cost = kva__balance_makespan(p, w, parts) + MERGE_COST;
        if (arg == 0 || cost < cheapest) {
            arg = parts;
            cheapest = cost;
        }
    }
    if (arg == 0 || !(cheapest < kva__balance_makespan(p, -1, 1) * (1.0 - MIN_GAIN))) return 0;
    *which = w;
    return arg;
}

/* kva__balance_last_wave against the choice by hand, on random problems around the thresholds
 * (equal items with one longer, slots and minimum lengths of any size), and pinned where one
 * part of the rule decides:
 *   - the problem's minimum length, not the default: 4 x 4096 at d128 (32-tile items) with a
 *     minimum of 16 is cut into 16 (1042 + 3 tile-times against 1072 whole);
 *   - cuts compared with the merge on both sides: 114 x 1152, 8 heads, 113 blocks, 64-key tiles:
 *     8 pieces end at 160.5, 2 tile-times before 4 pieces (162.5), so 8 (with the merge on
 *     one side only, 4 would stay);
 *   - the minimum gain: 143 x 6656 and one of 7040, 5 heads, 6 blocks, 64-key tiles: the best
 *     cut (8 pieces) ends 12.5 tile-times before the whole plan's 12690, less than the merge
 *     plus 0.5% (66.45), so none. */
KVA_TEST(prefill_balance_last_wave_is_argmin) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    int cut = 0, whole = 0;
    for (int c = 0; c < 1500; ++c) {
        const int32_t n = 1 + (int32_t)(kva_rng_u64(&rng) % 300), tile = c % 2 ? 64 : 128;
        const int32_t len = 1 + (int32_t)(kva_rng_u64(&rng) % 8192);
        int32_t *k = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
        for (int32_t i = 0; i < n; ++i) k[i] = c % 3 ? len : 1 + (int32_t)(kva_rng_u64(&rng) % (uint64_t)len);
        const int32_t at = (int32_t)(kva_rng_u64(&rng) % (uint64_t)n);
        k[at] = len + 1 + (int32_t)(kva_rng_u64(&rng) % 2048); /* the unique longest */
        kva__balance_problem p = {n, k, 1 + (int32_t)(kva_rng_u64(&rng) % 8), 2 + (int32_t)(kva_rng_u64(&rng) % 200), tile,
                                  1 + (int32_t)(kva_rng_u64(&rng) % 64), (int32_t)(kva_rng_u64(&rng) % 40)};
        int32_t which, want_which;
        const int32_t parts = kva__balance_last_wave(&p, &which), want = last_wave_by_hand(&p, &want_which);
        CHECK_MSG(parts == want && which == want_which,
                  "case %d (%d items of %d, item %d %d keys, %d heads, %d blocks, tile %d, max %d, min %d): cut %d into %d, "
                  "expected %d into %d",
                  c, n, len, at, k[at], p.num_kv_heads, p.blocks, tile, p.max_parts, p.min_cut_tiles, which, parts, want_which,
                  want);
        cut += want > 0;
        whole += want == 0;
        free(k);
        if (kva_test_failures) return;
    }
    printf("    %d random problems cut, %d whole\n", cut, whole);
    CHECK_MSG(cut > 100 && whole > 100, "%d random problems cut, %d whole", cut, whole);
    static const struct {
        int32_t n, keys, at, at_keys, heads, blocks, tile, max_parts, min_tiles, parts;
    } pinned[] = {
        {512, 4096, 0, 4096, 8, 132, 128, 16, 16, 16},
        {114, 1152, 0, 1152, 8, 113, 64, 8, 9, 8},
        {144, 6656, 60, 7040, 5, 6, 64, 32, 14, 0},
    };
    for (int c = 0; c < 3; ++c) {
        int32_t *k = (int32_t *)malloc(sizeof(int32_t) * (size_t)pinned[c].n);
        for (int32_t i = 0; i < pinned[c].n; ++i) k[i] = pinned[c].keys;
        k[pinned[c].at] = pinned[c].at_keys;
        kva__balance_problem p = {pinned[c].n, k, pinned[c].heads, pinned[c].blocks, pinned[c].tile, pinned[c].max_parts,
                                  pinned[c].min_tiles};
        int32_t which;
        const int32_t parts = kva__balance_last_wave(&p, &which);
        CHECK_MSG(parts == pinned[c].parts && (parts == 0 ? which == -1 : k[which] == pinned[c].at_keys),
                  "pinned %d: cut %d into %d, expected %d", c, which, parts, pinned[c].parts);
        free(k);
    }
}

/* The plan's rewrite for a cut (kva__balance_apply_cut): the cut item's pieces first, as group
 * 0 with key pieces 0 .. parts - 1, then every other item in its order, one group each; nothing
 * written past the new work count. Checked against a list built here, on random plans. */
KVA_TEST(prefill_balance_apply_cut) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    enum { PAD = 4, SENTINEL = -77 };
    for (int round = 0; round < 300; ++round) {
        const int32_t w = 1 + (int32_t)(kva_rng_u64(&rng) % 50);
        const int32_t which = (int32_t)(kva_rng_u64(&rng) % (uint64_t)w);
        const int32_t parts = 2 + (int32_t)(kva_rng_u64(&rng) % 63);
        const int32_t n = w + parts - 1;
        int32_t *req = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n + PAD));
        int32_t *qt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n + PAD));
        int32_t *kt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n + PAD));
        int32_t *gi = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n + 1 + PAD));
        int32_t *ereq = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
        int32_t *eqt = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
        int32_t *ekt = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
        for (int32_t i = 0; i < n + PAD; ++i) req[i] = qt[i] = kt[i] = SENTINEL;
        for (int32_t i = 0; i < n + 1 + PAD; ++i) gi[i] = SENTINEL;
        /* whole items: three per request, each (request, query tile) pair distinct */
        for (int32_t i = 0; i < w; ++i) {
            req[i] = 1000 + i / 3;
            qt[i] = i % 3 + (int32_t)(kva_rng_u64(&rng) % 2) * 10;
            kt[i] = 0;
        }
        for (int32_t i = 0; i <= w; ++i) gi[i] = i;
        int32_t e = 0;
        for (int32_t j = 0; j < parts; ++j, ++e) {
            ereq[e] = req[which];
            eqt[e] = qt[which];
            ekt[e] = j;
        }
        for (int32_t i = 0; i < w; ++i)
            if (i != which) {
                ereq[e] = req[i];
                eqt[e] = qt[i];
                ekt[e] = 0;
                ++e;
            }
        const int64_t got = kva__balance_apply_cut(w, which, parts, req, qt, kt, gi);
        CHECK_MSG(got == n, "w %d, cut %d into %d: %lld items, expected %d", w, which, parts, (long long)got, n);
        int bad = 0;
        for (int32_t i = 0; i < n; ++i)
            bad += req[i] != ereq[i] || qt[i] != eqt[i] || kt[i] != ekt[i];
        /* groups: [0, parts) the pieces, then one item each */
        bad += gi[0] != 0;
        for (int32_t k = 1; k <= w; ++k) bad += gi[k] != parts + k - 1;
        bad += gi[w] != n;
        for (int32_t i = n; i < n + PAD; ++i) bad += req[i] != SENTINEL || qt[i] != SENTINEL || kt[i] != SENTINEL;
        for (int32_t i = w + 1; i < n + 1 + PAD; ++i) bad += gi[i] != SENTINEL;
        CHECK_MSG(bad == 0, "w %d, cut %d into %d: %d entries differ from the expected lists", w, which, parts, bad);
        free(req);
        free(qt);
        free(kt);
        free(gi);
        free(ereq);
        free(eqt);
        free(ekt);
        if (kva_test_failures) return;
    }
}

/* ---- causal plans: the last wave by order (kva__balance_causal_tail) ---------------------------- */

/* Keys a query tile sees under a bottom-right causal mask: its last query's, from nothing (more
 * queries than keys that far) to every key; tiles are aligned to the request's end, so the first
 * may be partial (kva__qo_tile_span). */
KVA_TEST(prefill_balance_causal_keys) {
    CHECK(kva__balance_causal_keys(512, 512, 32, 0) == 32);
    CHECK(kva__balance_causal_keys(512, 512, 32, 15) == 512);
    CHECK(kva__balance_causal_keys(500, 500, 32, 15) == 500);      /* a partial tile: the first */
    CHECK(kva__balance_causal_keys(500, 500, 32, 0) == 20);
    CHECK(kva__balance_causal_keys(512, 16896, 32, 0) == 16416);   /* chunked prefill */
    CHECK(kva__balance_causal_keys(300, 100, 64, 0) == 0);         /* queries outnumber keys */
    CHECK(kva__balance_causal_keys(300, 100, 64, 3) == 36);        /* tiles end at 300, 236, ... */
    CHECK(kva__balance_causal_keys(300, 100, 64, 4) == 100);
    CHECK(kva__balance_causal_keys(7, 0, 16, 0) == 0);             /* no keys */
}

/* The same keys, written out here so that the rewrite below is checked against a derivation of
 * its own: tiles are aligned to the end, so stepping back from the request's end a tile at a time
 * lists the tiles' ends, the last tile's first (q <= 300 here); tile t's last query sits at
 * position kv - q + (its end - 1). */
static int32_t visible_by_hand(int32_t q, int32_t kv, int32_t tile, int32_t t) {
    int64_t ends[1024], count = 0; /* tile ends, last tile first */
    for (int64_t end = q; end > 0 && count < 1024; end -= tile) ends[count++] = end;
    const int64_t last_query = ends[count - 1 - t] - 1;
    const int64_t pos = (int64_t)kv - q + last_query;
    return pos < 0 ? 0 : pos + 1 > kv ? kv : (int32_t)(pos + 1);
}

/* The rewrite on random plans from kva__flatten_work (split requests too, so groups of several
 * items), with random tile sizes, windows and cache budgets: when the groups starting inside the
 * window differ by a factor of two in tiles and their requests' K/V fits the budget, those groups
 * stably sorted by their tiles, fewest first, each with its items in order, every later item and
 * group offset as before; otherwise nothing changed. Nothing written outside the arrays or past
 * the scratch the header promises. Checked against lists built here. */
KVA_TEST(prefill_balance_causal_tail_rewrite) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    enum { PAD = 4, SENTINEL = -77 };
    int32_t qlen[24], klen[24];
    int moved_rounds = 0, kept_rounds = 0;
    for (int round = 0; round < 600; ++round) {
        kva__split_problem p;
        memset(&p, 0, sizeof p);
        p.batch_size = 1 + (int32_t)(kva_rng_u64(&rng) % 24);
        for (int32_t b = 0; b < p.batch_size; ++b) {
            qlen[b] = 1 + (int32_t)(kva_rng_u64(&rng) % 300);
            klen[b] = round % 5 == 0 ? (int32_t)(kva_rng_u64(&rng) % 200) : qlen[b] + (int32_t)(kva_rng_u64(&rng) % 700);
        }
        p.qo_len = qlen;
        p.kv_len = klen;
        p.qo_tile = 1 + (int32_t)(kva_rng_u64(&rng) % 64);
        const int32_t chunk = round % 3 == 0 ? 64 + (int32_t)(kva_rng_u64(&rng) % 400) : 100000;
        const int64_t w = kva__count_work(&p, chunk);
        int64_t g = 0;
        for (int32_t b = 0; b < p.batch_size; ++b) g += (qlen[b] + p.qo_tile - 1) / p.qo_tile;
        int32_t *req = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w + PAD));
        int32_t *qt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w + PAD));
        int32_t *kt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w + PAD));
        int32_t *gi = (int32_t *)malloc(sizeof(int32_t) * (size_t)(g + 1 + PAD));
        const int64_t scratch_ints = 4 * g + 3 * w + 1;
        int32_t *scratch = (int32_t *)malloc(sizeof(int32_t) * (size_t)(scratch_ints + PAD));
        for (int64_t i = 0; i < w + PAD; ++i) req[i] = qt[i] = kt[i] = SENTINEL;
        for (int64_t i = 0; i < g + 1 + PAD; ++i) gi[i] = SENTINEL;
        for (int64_t i = scratch_ints; i < scratch_ints + PAD; ++i) scratch[i] = SENTINEL;
        REQUIRE_TRUE(kva__flatten_work(&p, chunk, req, qt, kt, w, gi, g + 1) == w);
        const int32_t tile_keys = 1 + (int32_t)(kva_rng_u64(&rng) % 160);
        const kva__causal_tail t = {qlen, klen, p.qo_tile, tile_keys, (int64_t)(kva_rng_u64(&rng) % (uint64_t)(w + 3)),
                                    1 + (int64_t)(kva_rng_u64(&rng) % 4), (int64_t)(kva_rng_u64(&rng) % 30000)};
        /* expected: when the window's groups differ twofold and their K/V fits, the leading
         * groups (start < window) by tiles, ties in plan order (a stable selection sort: the first
         * of the smallest left), then the rest as they were; else the lists unchanged */
        int64_t n = 0;
        while (n < g && gi[n] < t.window) ++n;
        int32_t *tiles = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n + 1));
        int32_t lo = INT32_MAX, hi = 0;
        int64_t bytes = 0;
        unsigned char *counted = (unsigned char *)calloc((size_t)p.batch_size, 1);
        for (int64_t c = 0; c < n; ++c) {
            const int32_t b = req[gi[c]];
            tiles[c] = (visible_by_hand(qlen[b], klen[b], p.qo_tile, qt[gi[c]]) + tile_keys - 1) / tile_keys;
            lo = tiles[c] < lo ? tiles[c] : lo;
            hi = tiles[c] > hi ? tiles[c] : hi;
            if (!counted[b]) bytes += (int64_t)klen[b] * t.kv_bytes_per_key;
            counted[b] = 1;
        }
        const bool move = n >= 2 && hi >= 2 * (int64_t)lo && bytes <= t.cache_bytes;
        int32_t *ereq = (int32_t *)malloc(sizeof(int32_t) * (size_t)w), *eqt = (int32_t *)malloc(sizeof(int32_t) * (size_t)w);
        int32_t *ekt = (int32_t *)malloc(sizeof(int32_t) * (size_t)w), *egi = (int32_t *)malloc(sizeof(int32_t) * (size_t)(g + 1));
        unsigned char *taken = (unsigned char *)calloc((size_t)n + 1, 1);
        int64_t e = 0;
        for (int64_t j = 0; move && j < n; ++j) {
            int64_t best = -1;
            for (int64_t c = 0; c < n; ++c)
                if (!taken[c] && (best < 0 || tiles[c] < tiles[best])) best = c;
            taken[best] = 1;
            egi[j] = (int32_t)e;
            for (int32_t i = gi[best]; i < gi[best + 1]; ++i, ++e) {
                ereq[e] = req[i];
                eqt[e] = qt[i];
                ekt[e] = kt[i];
            }
        }
        for (int64_t i = e; i < w; ++i) {
            ereq[i] = req[i];
            eqt[i] = qt[i];
            ekt[i] = kt[i];
        }
        for (int64_t j = move ? n : 0; j <= g; ++j) egi[j] = gi[j];
        const int64_t moved = kva__balance_causal_tail(&t, w, g, req, qt, kt, gi, scratch);
        CHECK_MSG(moved == 0 || (move && moved == n), "round %d: %lld groups ordered, %lld in the window%s", round,
                  (long long)moved, (long long)n, move ? "" : ", none expected");
        moved_rounds += moved > 0;
        kept_rounds += !move;
        int bad = 0;
        for (int64_t i = 0; i < w; ++i) bad += req[i] != ereq[i] || qt[i] != eqt[i] || kt[i] != ekt[i];
        for (int64_t j = 0; j <= g; ++j) bad += gi[j] != egi[j];
        for (int64_t i = w; i < w + PAD; ++i) bad += req[i] != SENTINEL || qt[i] != SENTINEL || kt[i] != SENTINEL;
        for (int64_t i = g + 1; i < g + 1 + PAD; ++i) bad += gi[i] != SENTINEL;
        for (int64_t i = scratch_ints; i < scratch_ints + PAD; ++i) bad += scratch[i] != SENTINEL;
        CHECK_MSG(bad == 0,
                  "round %d (%d requests, tile %d, chunk %d, %lld items, window %lld, tiles %d..%d, %lld of %lld bytes): "
                  "%d entries differ",
                  round, p.batch_size, p.qo_tile, chunk, (long long)w, (long long)t.window, lo, hi, (long long)bytes,
                  (long long)t.cache_bytes, bad);
        free(req);
        free(qt);
        free(kt);
        free(gi);
        free(scratch);
        free(tiles);
        free(counted);
        free(ereq);
        free(eqt);
        free(ekt);
        free(egi);
        free(taken);
        if (kva_test_failures) return;
    }
    /* the random cases reach both sides of the conditions */
    CHECK_MSG(moved_rounds > 50 && kept_rounds > 50, "%d rounds reordered, %d kept", moved_rounds, kept_rounds);
}

/* Left as they are: the window's K/V beyond the budget; a chunked prefill over long contexts,
 * whose tiles all see about as many keys (64 requests of 128 queries over 16k keys: 127-128
 * tiles); a budget of 0. */
KVA_TEST(prefill_balance_causal_tail_keeps_order) {
    int32_t qlen[64], klen[64];
    for (int c = 0; c < 3; ++c) {
        const int32_t B = c == 1 ? 64 : 32;
        for (int32_t b = 0; b < B; ++b) {
            qlen[b] = c == 1 ? 128 : 512;
            klen[b] = c == 1 ? 16384 : 512;
        }
        kva__split_problem p = {.batch_size = B, .qo_len = qlen, .kv_len = klen, .qo_tile = 32};
        const int64_t w = kva__count_work(&p, 1 << 20);
        int32_t *req = (int32_t *)malloc(sizeof(int32_t) * (size_t)w), *qt = (int32_t *)malloc(sizeof(int32_t) * (size_t)w);
        int32_t *kt = (int32_t *)malloc(sizeof(int32_t) * (size_t)w), *gi = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w + 1));
        int32_t *scratch = (int32_t *)malloc(sizeof(int32_t) * (size_t)(7 * w + 1));
        REQUIRE_TRUE(kva__flatten_work(&p, 1 << 20, req, qt, kt, w, gi, w + 1) == w);
        /* 32 x 512 at d128 is 8 MB of K/V per head: over a 4 MB budget; the chunked batch within 1 GB */
        const int64_t budget = c == 0 ? 4 << 20 : c == 1 ? (int64_t)1 << 30 : 0;
        const kva__causal_tail t = {qlen, klen, 32, 128, 1 << 20, 512, budget};
        CHECK_MSG(kva__balance_causal_tail(&t, w, w, req, qt, kt, gi, scratch) == 0, "case %d reordered", c);
        for (int64_t i = 0; i < w; ++i) CHECK(req[i] == i / (w / B) && qt[i] == i % (w / B));
        free(req);
        free(qt);
        free(kt);
        free(gi);
        free(scratch);
    }
}

/* A window longest first throughout, which the walk meets shortest first: three one-tile
 * requests over 512, 256 and 128 keys (4, 2 and 1 tiles). Every neighbour descends and none
 * ascends, so a check for "ordered already" that looked the wrong way would leave it; all three
 * must move, fewest tiles first in the plan: requests 2, 1, 0. */
KVA_TEST(prefill_balance_causal_tail_reverses_a_descending_window) {
    const int32_t qlen[3] = {32, 32, 32}, klen[3] = {512, 256, 128};
    int32_t req[3] = {0, 1, 2}, qt[3] = {0, 0, 0}, kt[3] = {0, 0, 0}, gi[4] = {0, 1, 2, 3};
    int32_t scratch[4 * 3 + 3 * 3 + 1];
    const kva__causal_tail t = {qlen, klen, 32, 128, 1 << 20, 512, (int64_t)1 << 30};
    const int64_t moved = kva__balance_causal_tail(&t, 3, 3, req, qt, kt, gi, scratch);
    CHECK_MSG(moved == 3, "%lld groups ordered, expected 3", (long long)moved);
    CHECK_MSG(req[0] == 2 && req[1] == 1 && req[2] == 0, "order %d %d %d, expected 2 1 0", req[0], req[1], req[2]);
    for (int32_t i = 0; i < 3; ++i) CHECK(qt[i] == 0 && kt[i] == 0 && gi[i] == i);
    CHECK(gi[3] == 3);
}

/* What the order is for: the README's causal rows at d128 (32-token query tiles, 128-key tiles,
 * 8 KV heads, 132 persistent blocks, the window of 4 waves, half of the H200's L2) in the cost
 * model of the full-attention cut. In plan order the walk repeats each request's tiles long to
 * short, so its last wave mixes 1- to 16-tile items; ordered, it ends on the short ones: the
 * model's launch 1.5-2% shorter at 32 x 512 and 8 x 2048; one request (16k) is ordered already. */
KVA_TEST(prefill_balance_causal_tail_evens_the_last_wave) {
    const int32_t batches[] = {32, 8, 1};
    for (int c = 0; c < 3; ++c) {
        const int32_t B = batches[c], len = 16384 / B, tile = 32, tiles = len / tile;
        int32_t qlen[32], klen[32];
        for (int32_t b = 0; b < B; ++b) qlen[b] = klen[b] = len;
        kva__split_problem p = {.batch_size = B, .qo_len = qlen, .kv_len = klen, .qo_tile = tile};
        const int64_t w = (int64_t)B * tiles;
        int32_t *req = (int32_t *)malloc(sizeof(int32_t) * (size_t)w), *qt = (int32_t *)malloc(sizeof(int32_t) * (size_t)w);
        int32_t *kt = (int32_t *)malloc(sizeof(int32_t) * (size_t)w), *gi = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w + 1));
        int32_t *scratch = (int32_t *)malloc(sizeof(int32_t) * (size_t)(7 * w + 1));
        int32_t *keys = (int32_t *)malloc(sizeof(int32_t) * (size_t)w);
        REQUIRE_TRUE(kva__flatten_work(&p, len, req, qt, kt, w, gi, w + 1) == w);
        kva__balance_problem bp = {(int32_t)w, keys, 8, 132, 128, 1, 0};
        for (int64_t i = 0; i < w; ++i) keys[i] = visible_by_hand(len, len, tile, qt[i]);
        const double before = kva__balance_makespan(&bp, -1, 1);
        const kva__causal_tail t = {qlen, klen, tile, 128, KVA__BALANCE_TAIL_WAVES * 132, 128 * 2 * 2, 30 << 20};
        kva__balance_causal_tail(&t, w, w, req, qt, kt, gi, scratch);
        for (int64_t i = 0; i < w; ++i) keys[i] = visible_by_hand(len, len, tile, qt[i]);
        const double after = kva__balance_makespan(&bp, -1, 1);
        printf("    %d x %d causal: %.1f -> %.1f tile-times\n", B, len, before, after);
        if (B > 1)
            CHECK_MSG(after < before * 0.99, "%d x %d: %.1f -> %.1f tile-times", B, len, before, after);
        else
            CHECK_MSG(after == before, "16k: %.1f -> %.1f", before, after);
        free(req);
        free(qt);
        free(kt);
        free(gi);
        free(scratch);
        free(keys);
    }
}
