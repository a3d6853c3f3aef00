/* test_util.c -- see test_util.h. */
#include "test_util.h"
#include "harness.h"
#include "../src/common/dtype_convert.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t first_seed;
static int seeded;

const char *kva_test_seed_note(void) {
    static char note[64];
    if (seeded)
        snprintf(note, sizeof note, "KVA_TEST_SEED=%llu", (unsigned long long)first_seed);
    else
        snprintf(note, sizeof note, "no random seed drawn");
    return note;
}

uint64_t kva_test_seed(void) {
    static uint64_t seed;
    static int init;
    if (!init) {
        const char *e = getenv("KVA_TEST_SEED");
        seed = e ? strtoull(e, NULL, 0) : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)clock();
        printf("    (KVA_TEST_SEED=%llu)\n", (unsigned long long)seed);
        first_seed = seed;
        seeded = init = 1;
    }
    return seed++;
}

void kva_rng_seed(kva_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 1; }

uint64_t kva_rng_u64(kva_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

int32_t kva_rng_int(kva_rng *r, int32_t lo, int32_t hi) {
    return lo + (int32_t)(kva_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

float kva_rng_uniform(kva_rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((kva_rng_u64(r) >> 40) * (1.0 / 16777216.0));
}

void kva_rng_shuffle_i32(kva_rng *r, int32_t *a, int32_t n) {
    for (int32_t i = n - 1; i > 0; --i) {
        int32_t j = (int32_t)(kva_rng_u64(r) % (uint64_t)(i + 1));
        int32_t t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

void kva_fill_random(kva_rng *r, void *data, kva_dtype dtype, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; ++i) kva__store_f32(data, dtype, (int64_t)i, kva_rng_uniform(r, lo, hi));
}

void kva_poison(void *data, size_t bytes) { memset(data, 0xFF, bytes); }

kva_tol kva_tol_for(kva_dtype dtype) {
    kva_tol t;
    switch (dtype) {
    case KVA_F32: t.atol = 1e-5; t.rtol = 1e-5; break;
    case KVA_F16: t.atol = 2e-3; t.rtol = 1e-2; break;
    default: t.atol = 1e-2; t.rtol = 2e-2; break;
    }
    return t;
}

static int64_t compare_one(double g, double ref, kva_tol tol, double *worst, double *worst_ref,
                           double *worst_got) {
    double err = fabs(g - ref);
    if (g != g) err = INFINITY;
    double excess = err - (tol.atol + tol.rtol * fabs(ref));
    if (err > *worst || (err == INFINITY && *worst != INFINITY)) {
        *worst = err;
        *worst_ref = ref;
        *worst_got = g;
    }
    return excess > 0 ? 1 : 0;
}

int64_t kva_compare(const char *what, const void *got, kva_dtype dtype, const double *ref,
                    size_t n, kva_tol tol, double *max_err) {
    int64_t bad = 0;
    double worst = 0, wr = 0, wg = 0;
    for (size_t i = 0; i < n; ++i)
        bad += compare_one(kva__load_f32(got, dtype, (int64_t)i), ref[i], tol, &worst, &wr, &wg);
    if (max_err && worst > *max_err) *max_err = worst;
    if (bad)
        kva_test_fail(__FILE__, __LINE__, "%s: %lld of %zu values off; worst |err| %.3g (got %.6g, ref %.6g)",
                      what, (long long)bad, n, worst, wg, wr);
    return bad;
}

int64_t kva_compare_tensor(const char *what, kva_tensor t, int64_t ntok, int32_t heads,
                           int32_t head_dim, const double *ref, kva_tol tol, double *max_err) {
    int64_t bad = 0;
    double worst = 0, wr = 0, wg = 0;
    size_t es = kva_dtype_size(t.dtype);
    for (int64_t i = 0; i < ntok; ++i)
        for (int32_t h = 0; h < heads; ++h) {
            const unsigned char *row =
                (const unsigned char *)t.data + (size_t)(i * t.stride_token + h * t.stride_head) * es;
            for (int32_t d = 0; d < head_dim; ++d)
                bad += compare_one(kva__load_f32(row, t.dtype, d),
                                   ref[((size_t)i * heads + h) * head_dim + d], tol, &worst, &wr, &wg);
        }
    if (max_err && worst > *max_err) *max_err = worst;
    if (bad)
        kva_test_fail(__FILE__, __LINE__,
                      "%s: %lld of %lld values off; worst |err| %.3g (got %.6g, ref %.6g)", what,
                      (long long)bad, (long long)(ntok * heads * head_dim), worst, wg, wr);
    return bad;
}

int64_t kva_compare_lse(const char *what, const float *got, const double *ref, size_t n,
                        kva_dtype dtype, double *max_err) {
    int64_t bad = 0;
    double worst = 0;
    double atol = dtype == KVA_F32 ? 1e-5 : 1e-3, rtol = dtype == KVA_F32 ? 1e-5 : 1e-3;
    for (size_t i = 0; i < n; ++i) {
        double g = got[i], r = ref[i];
        if (r == -INFINITY || g == -INFINITY) {
            if (g != r) ++bad;
            continue;
        }
        double err = fabs(g - r);
        if (g != g) err = INFINITY;
        if (err > worst) worst = err;
        if (err > atol + rtol * fabs(r)) ++bad;
    }
    if (max_err && worst > *max_err) *max_err = worst;
    if (bad) kva_test_fail(__FILE__, __LINE__, "%s: %lld of %zu LSE values off (worst %.3g)", what,
                           (long long)bad, n, worst);
    return bad;
}

void *kva_test_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) != 0) {
        fprintf(stderr, "test allocation of %zu bytes failed\n", bytes);
        exit(2);
    }
    return p;
}

void kva_test_env_set(kva_test_env *e, const char *name, const char *value) {
    const char *old = getenv(name);
    e->name = name;
    e->had = old != NULL;
    snprintf(e->saved, sizeof e->saved, "%s", old ? old : "");
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

void kva_test_env_restore(const kva_test_env *e) {
    if (e->had) setenv(e->name, e->saved, 1);
    else unsetenv(e->name);
}
