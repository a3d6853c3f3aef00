/*
 * fuzz_block_table.c -- kva_block_table_to_csr against its definition in kvattn.h: on success
 * the CSR arrays say exactly what the block table and context lengths say; on failure the status
 * is the documented one and no output array changed.
 */
#include "fuzz_input.h"
#include "kvattn.h"

#include <string.h>

enum { MAX_B = 9, MAX_BLOCKS = 9 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    int32_t B = fz_range(&in, 0, MAX_B), M = fz_range(&in, 0, MAX_BLOCKS);
    int32_t ps = fz_bool(&in) ? fz_range(&in, 1, 8) : fz_range(&in, -2, 70000);
    int32_t cap = fz_range(&in, -1, MAX_B * MAX_BLOCKS);
    int32_t table[MAX_B * MAX_BLOCKS], lens[MAX_B];
    for (int i = 0; i < B * M; ++i) table[i] = fz_range(&in, -1, 200);
    for (int b = 0; b < B; ++b) lens[b] = fz_bool(&in) ? fz_range(&in, 0, 40) : fz_range(&in, -1, 3);

    /* the expected outcome, straight from the header's contract */
    kva_status want = KVA_OK;
    int64_t total = 0;
    if (cap < 0 || ps < 1 || ps > 65536) want = KVA_ERR_INVALID_ARG;
    for (int b = 0; b < B && want == KVA_OK; ++b) {
        if (lens[b] < 0) {
            want = KVA_ERR_INVALID_ARG;
            break;
        }
        int64_t blocks = ((int64_t)lens[b] + ps - 1) / ps;
        if (blocks > M) {
            want = KVA_ERR_OUT_OF_RANGE;
            break;
        }
        for (int64_t j = 0; j < blocks; ++j)
            if (table[b * M + j] < 0) want = KVA_ERR_OUT_OF_RANGE;
        total += blocks;
    }
    if (want == KVA_OK && total > cap) want = KVA_ERR_WORKSPACE_TOO_SMALL;

    int32_t indptr[MAX_B + 1], indices[MAX_B * MAX_BLOCKS + 1], last[MAX_B];
    memset(indptr, 0x5a, sizeof indptr);
    memset(indices, 0x5a, sizeof indices);
    memset(last, 0x5a, sizeof last);
    kva_status st = kva_block_table_to_csr(table, B, M, lens, ps, indptr, indices, cap, last);
    FZ_ASSERT(st == want, "status %s, expected %s (%s)", kva_status_str(st), kva_status_str(want),
              kva_last_error());
    if (st != KVA_OK) {
        FZ_ASSERT(strncmp(kva_last_error(), "kva_block_table_to_csr:", 23) == 0, "%s",
                  kva_last_error());
        for (size_t i = 0; i < sizeof indptr; ++i) FZ_ASSERT(((uint8_t *)indptr)[i] == 0x5a, "indptr");
        for (size_t i = 0; i < sizeof indices; ++i)
            FZ_ASSERT(((uint8_t *)indices)[i] == 0x5a, "indices");
        for (size_t i = 0; i < sizeof last; ++i) FZ_ASSERT(((uint8_t *)last)[i] == 0x5a, "last");
        return 0;
    }
    FZ_ASSERT(indptr[0] == 0, "indptr[0]");
    kva_page_table t = {B, indptr, indices, last};
    for (int b = 0; b < B; ++b) {
        int32_t np = indptr[b + 1] - indptr[b];
        FZ_ASSERT(np == (lens[b] + ps - 1) / ps, "request %d pages", b);
        int32_t len = np == 0 ? 0 : (np - 1) * ps + last[b];
        FZ_ASSERT(len == lens[b], "request %d length %d, expected %d", b, len, lens[b]);
        if (np) FZ_ASSERT(last[b] >= 1 && last[b] <= ps, "last_page_len");
        for (int j = 0; j < np; ++j)
            FZ_ASSERT(t.indices[indptr[b] + j] == table[b * M + j], "page %d of request %d", j, b);
    }
    FZ_ASSERT(indptr[B] == total, "total");
    return 0;
}
