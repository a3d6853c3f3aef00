/*
 * test_prefill_balance.c -- the persistent prefill launch's last wave (src/plan/prefill_balance.c),
 * without a GPU: the cuts it chooses on the README's full-attention rows (132 blocks, 8 KV heads,
 * 128-key tiles), the pieces' key ranges, and the shapes it must leave whole. With an independent
 * check of the simulated length: on equal items the whole plan takes ceil(pairs / blocks) items'
 * time, which the cost model must reproduce before its cuts mean anything.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/plan/prefill_balance.h"

#include <math.h>
#include <stdlib.h>

#define ITEM_OVERHEAD 1.5 /* as prefill_balance.c's cost model */

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
 * tile, parts up to the tile count. */
KVA_TEST(prefill_balance_pieces) {
    const int32_t lens[] = {1, 127, 128, 129, 1000, 4096, 16383};
    for (int c = 0; c < 7; ++c) {
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
}
