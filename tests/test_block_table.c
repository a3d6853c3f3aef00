/*
 * test_block_table.c -- kva_block_table_to_csr: random dense block tables (padding entries
 * filled with garbage that must be ignored) against a CSR built here, and every error, each of
 * which must leave the caller's output arrays untouched.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"

#include <stdlib.h>
#include <string.h>

#define BT_MAX_BATCH 12
#define BT_MAX_BLOCKS 8
#define BT_SLACK 4 /* output entries past the expected end, which must stay untouched */
#define BT_UNTOUCHED (-77)

typedef struct {
    int32_t indptr[BT_MAX_BATCH + 1 + BT_SLACK];
    int32_t indices[BT_MAX_BATCH * BT_MAX_BLOCKS + BT_SLACK];
    int32_t last[BT_MAX_BATCH + BT_SLACK];
} csr_out;

static void csr_poison(csr_out *o) {
    for (size_t i = 0; i < sizeof o->indptr / sizeof(int32_t); ++i) o->indptr[i] = BT_UNTOUCHED;
    for (size_t i = 0; i < sizeof o->indices / sizeof(int32_t); ++i) o->indices[i] = BT_UNTOUCHED;
    for (size_t i = 0; i < sizeof o->last / sizeof(int32_t); ++i) o->last[i] = BT_UNTOUCHED;
}

static bool csr_untouched(const csr_out *o) {
    csr_out p;
    csr_poison(&p);
    return memcmp(o, &p, sizeof p) == 0;
}

static bool quick_mode(void) {
    const char *e = getenv("KVA_TEST_QUICK");
    return e && *e && *e != '0';
}

/* Calls the conversion expecting a failure that writes nothing. */
static void expect_fail(const int32_t *table, int32_t batch, int32_t max_blocks,
                        const int32_t *lens, int32_t ps, int32_t capacity, kva_status expected,
                        const char *what) {
    csr_out o;
    csr_poison(&o);
    kva_status st = kva_block_table_to_csr(table, batch, max_blocks, lens, ps, o.indptr, o.indices,
                                           capacity, o.last);
    CHECK_MSG(st == expected, "%s: %s, expected %s (%s)", what, kva_status_str(st),
              kva_status_str(expected), kva_last_error());
    CHECK_MSG(csr_untouched(&o), "%s: failing call wrote its outputs", what);
}

KVA_TEST(block_table_to_csr_random) {
    kva_rng r;
    kva_rng_seed(&r, kva_test_seed());
    const int32_t page_sizes[5] = {1, 3, 7, 16, 65536};
    int32_t iters = quick_mode() ? 200 : 1000, errors_tried = 0;
    for (int32_t it = 0; it < iters && !kva_test_failures; ++it) {
        int32_t batch = kva_rng_int(&r, 0, BT_MAX_BATCH),
                max_blocks = kva_rng_int(&r, 0, BT_MAX_BLOCKS);
        int32_t ps = page_sizes[kva_rng_int(&r, 0, 4)];
        int32_t table[BT_MAX_BATCH * BT_MAX_BLOCKS], lens[BT_MAX_BATCH], blocks[BT_MAX_BATCH];
        int32_t want_indptr[BT_MAX_BATCH + 1], want_indices[BT_MAX_BATCH * BT_MAX_BLOCKS],
            want_last[BT_MAX_BATCH];
        want_indptr[0] = 0;
        for (int32_t b = 0; b < batch; ++b) {
            int64_t most = (int64_t)max_blocks * ps;
            if (most > INT32_MAX) most = INT32_MAX;
            lens[b] =
                kva_rng_int(&r, 0, 4) == 0 ? 0 : (int32_t)(kva_rng_u64(&r) % (uint64_t)(most + 1));
            blocks[b] = (int32_t)(((int64_t)lens[b] + ps - 1) / ps);
            for (int32_t j = 0; j < max_blocks; ++j)
                table[b * max_blocks + j] = j < blocks[b] ? kva_rng_int(&r, 0, 100000)
                                                          : -kva_rng_int(&r, 1, 1000); /* ignored */
            for (int32_t j = 0; j < blocks[b]; ++j)
                want_indices[want_indptr[b] + j] = table[b * max_blocks + j];
            want_indptr[b + 1] = want_indptr[b] + blocks[b];
            want_last[b] = blocks[b] == 0 ? 0 : lens[b] - (blocks[b] - 1) * ps;
        }
        int32_t total = want_indptr[batch];

        csr_out o;
        csr_poison(&o);
        int32_t capacity = total + kva_rng_int(&r, 0, 2);
        kva_status st = kva_block_table_to_csr(table, batch, max_blocks, lens, ps, o.indptr,
                                               o.indices, capacity, o.last);
        CHECK_MSG(st == KVA_OK, "batch %d, %d blocks of %d: %s (%s)", batch, max_blocks, ps,
                  kva_status_str(st), kva_last_error());
        if (st != KVA_OK) continue;
        CHECK(memcmp(o.indptr, want_indptr, (size_t)(batch + 1) * sizeof(int32_t)) == 0);
        CHECK(memcmp(o.indices, want_indices, (size_t)total * sizeof(int32_t)) == 0);
        CHECK(memcmp(o.last, want_last, (size_t)batch * sizeof(int32_t)) == 0);
        CHECK(o.indptr[batch + 1] == BT_UNTOUCHED && o.indices[total] == BT_UNTOUCHED &&
              o.last[batch] == BT_UNTOUCHED);
        kva_page_table pt = {batch, o.indptr, o.indices, o.last};
        for (int32_t b = 0; b < batch; ++b)
            CHECK_MSG(kva_ref_paged_len(&pt, ps, b) == lens[b],
                      "request %d: CSR length %d, context %d", b, kva_ref_paged_len(&pt, ps, b),
                      lens[b]);

        /* Errors: each leaves the outputs untouched. */
        if (total > 0)
            expect_fail(table, batch, max_blocks, lens, ps, total - 1, KVA_ERR_WORKSPACE_TOO_SMALL,
                        "capacity one short");
        if (batch == 0) continue;
        int32_t b = kva_rng_int(&r, 0, batch - 1), saved = lens[b];
        lens[b] = -kva_rng_int(&r, 1, 5);
        expect_fail(table, batch, max_blocks, lens, ps, capacity, KVA_ERR_INVALID_ARG,
                    "negative length");
        lens[b] = saved;
        if ((int64_t)max_blocks * ps < INT32_MAX) {
            lens[b] = max_blocks * ps + kva_rng_int(&r, 1, ps);
            expect_fail(table, batch, max_blocks, lens, ps, INT32_MAX, KVA_ERR_OUT_OF_RANGE,
                        "more blocks than a row holds");
            lens[b] = saved;
            ++errors_tried;
        }
        if (blocks[b] > 0) {
            int32_t j = kva_rng_int(&r, 0, blocks[b] - 1), keep = table[b * max_blocks + j];
            table[b * max_blocks + j] = -kva_rng_int(&r, 1, 3);
            expect_fail(table, batch, max_blocks, lens, ps, capacity, KVA_ERR_OUT_OF_RANGE,
                        "negative page id");
            table[b * max_blocks + j] = keep;
        }
    }
    CHECK(errors_tried > 0);
}

KVA_TEST(block_table_to_csr_bad_args) {
    int32_t table[6] = {4, 5, 6, 7, 8, 9}, lens[2] = {4, 5}, zeros[2] = {0, 0};
    csr_out o;
    /* batch 2, rows of 3 blocks, pages of 2: request 0 = pages 4,5; request 1 = pages 7,8,9 */
    csr_poison(&o);
    CHECK_OK(kva_block_table_to_csr(table, 2, 3, lens, 2, o.indptr, o.indices, 5, o.last));
    CHECK(o.indptr[0] == 0 && o.indptr[1] == 2 && o.indptr[2] == 5 && o.indices[0] == 4 &&
          o.indices[1] == 5 && o.indices[2] == 7 && o.indices[4] == 9 && o.last[0] == 2 &&
          o.last[1] == 1);

    csr_poison(&o);
    CHECK_STATUS(kva_block_table_to_csr(table, 2, 3, lens, 2, NULL, o.indices, 5, o.last),
                 KVA_ERR_INVALID_ARG);
    CHECK(csr_untouched(&o));
    expect_fail(table, 2, 3, NULL, 2, 5, KVA_ERR_INVALID_ARG, "NULL context_lens");
    expect_fail(NULL, 2, 3, lens, 2, 5, KVA_ERR_INVALID_ARG, "NULL block_table");
    expect_fail(table, -1, 3, lens, 2, 5, KVA_ERR_INVALID_ARG, "batch -1");
    expect_fail(table, 2, -1, lens, 2, 5, KVA_ERR_INVALID_ARG, "max_blocks -1");
    expect_fail(table, 2, 3, lens, 0, 5, KVA_ERR_INVALID_ARG, "page_size 0");
    expect_fail(table, 2, 3, lens, 65537, 5, KVA_ERR_INVALID_ARG, "page_size 65537");
    expect_fail(table, 2, 3, lens, 2, -1, KVA_ERR_INVALID_ARG, "capacity -1");
    expect_fail(table, 2, 3, lens, 2, 4, KVA_ERR_WORKSPACE_TOO_SMALL, "capacity 4 of 5");
    expect_fail(table, 2, 2, lens, 2, 5, KVA_ERR_OUT_OF_RANGE, "5 tokens in 2 blocks of 2");

    csr_poison(&o);
    CHECK_STATUS(kva_block_table_to_csr(table, 2, 3, lens, 2, o.indptr, NULL, 5, o.last),
                 KVA_ERR_INVALID_ARG);
    CHECK(csr_untouched(&o));
    csr_poison(&o);
    CHECK_STATUS(kva_block_table_to_csr(table, 2, 3, lens, 2, o.indptr, o.indices, 5, NULL),
                 KVA_ERR_INVALID_ARG);
    CHECK(csr_untouched(&o));

    /* Empty contexts need no table and no indices; an empty batch only writes indptr[0]. */
    csr_poison(&o);
    CHECK_OK(kva_block_table_to_csr(NULL, 2, 0, zeros, 16, o.indptr, NULL, 0, o.last));
    CHECK(o.indptr[0] == 0 && o.indptr[1] == 0 && o.indptr[2] == 0 && o.last[0] == 0 &&
          o.last[1] == 0);
    csr_poison(&o);
    CHECK_OK(kva_block_table_to_csr(NULL, 0, 0, NULL, 1, o.indptr, NULL, 0, NULL));
    CHECK(o.indptr[0] == 0 && o.indptr[1] == BT_UNTOUCHED);
}
