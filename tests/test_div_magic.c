/*
 * test_div_magic.c -- kva__div_by (src/common/div_magic.h), the decode kernel's division of a key
 * position by the page size, against the integer division: every divisor 1 .. 65536 (the page
 * sizes a pool may have) at numerators around its multiples, at the top of the range (2^31 - 1)
 * and at random ones, and larger divisors up to 2^31 - 1 at random numerators.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/common/div_magic.h"

static int check_one(int32_t n, int32_t d, kva__div_magic dm) {
    const int32_t got = kva__div_by(n, dm), want = n / d;
    CHECK_MSG(got == want, "%d / %d: %d, want %d (mul %u, shift %d)", n, d, got, want, dm.mul, dm.shift);
    return got == want;
}

KVA_TEST(div_magic_matches_division) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t top = 0x7fffffff;
    for (int32_t d = 1; d <= 65536 && kva_test_failures < 20; ++d) {
        const kva__div_magic dm = kva__div_magic_for(d);
        check_one(0, d, dm);
        check_one(top, d, dm);
        check_one(top - 1, d, dm);
        /* the multiples of d nearest 2^31 and a few small ones, each with its neighbours */
        const int32_t last = top / d * d;
        const int32_t ks[4] = {last, last - d, d, 7 * d};
        for (int i = 0; i < 4; ++i) {
            if (ks[i] < 0 || (int64_t)ks[i] > top) continue;
            check_one(ks[i], d, dm);
            if (ks[i] > 0) check_one(ks[i] - 1, d, dm);
            if (ks[i] < top) check_one(ks[i] + 1, d, dm);
        }
        for (int i = 0; i < 8; ++i) check_one((int32_t)((uint32_t)kva_rng_u64(&rng) & 0x7fffffffu), d, dm);
    }
    for (int i = 0; i < 200000 && kva_test_failures < 20; ++i) {
        const int32_t d = (int32_t)((uint32_t)kva_rng_u64(&rng) & 0x7fffffffu) | 1;
        check_one((int32_t)((uint32_t)kva_rng_u64(&rng) & 0x7fffffffu), d, kva__div_magic_for(d));
    }
}
