/*
 * test_util.h -- what every test needs: a seeded RNG, random tensors of any dtype, poisoning,
 * and comparison against the float64 reference with dtype-scaled tolerances.
 */
#ifndef KVA_TEST_UTIL_H
#define KVA_TEST_UTIL_H

#include "kvattn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* xorshift64*-based generator; every test seeds from kva_test_seed() so runs differ (fresh
 * random inputs) but a failure prints the seed to reproduce it (KVA_TEST_SEED=...). */
typedef struct { uint64_t s; } kva_rng;
uint64_t kva_test_seed(void);
/* "KVA_TEST_SEED=<the run's first seed>" (the whole run, unfiltered, replays with it). */
const char *kva_test_seed_note(void);
void kva_rng_seed(kva_rng *r, uint64_t seed);
uint64_t kva_rng_u64(kva_rng *r);
int32_t kva_rng_int(kva_rng *r, int32_t lo, int32_t hi); /* inclusive */
float kva_rng_uniform(kva_rng *r, float lo, float hi);
void kva_rng_shuffle_i32(kva_rng *r, int32_t *a, int32_t n);

/* Fills n elements of dtype with uniform values in [lo, hi) (never all zero). */
void kva_fill_random(kva_rng *r, void *data, kva_dtype dtype, size_t n, float lo, float hi);
/* Fills bytes with a NaN pattern (0xFF.. is NaN in f32, f16 and bf16). */
void kva_poison(void *data, size_t bytes);

/* Tolerances: |got - ref| <= atol + rtol * |ref|. */
typedef struct { double atol, rtol; } kva_tol;
kva_tol kva_tol_for(kva_dtype dtype);

/* Compares n values of dtype at got (strided rows allowed via the tensor helper below) against
 * doubles; returns the number of mismatches (NaN always mismatches), reports the worst. */
int64_t kva_compare(const char *what, const void *got, kva_dtype dtype, const double *ref,
                    size_t n, kva_tol tol, double *max_err);
/* Same for a tensor view of ntok x heads x D. */
int64_t kva_compare_tensor(const char *what, kva_tensor t, int64_t ntok, int32_t heads,
                           int32_t head_dim, const double *ref, kva_tol tol, double *max_err);
/* LSE comparison: -inf must match exactly; finite values within atol 1e-3 + 1e-4 rel (f32 inputs
 * 1e-5). */
int64_t kva_compare_lse(const char *what, const float *got, const double *ref, size_t n,
                        kva_dtype dtype, double *max_err);

/* Host buffer helpers that fail the test on allocation failure. */
void *kva_test_alloc(size_t bytes);

/* An environment variable set (value NULL: unset) for a stretch of a test and then put back as it
 * was (set to its old value, or unset): knobs such as KVA_PREFILL_PERSISTENT that the library
 * reads per call. */
typedef struct {
    const char *name;
    bool had;
    char saved[256];
} kva_test_env;
void kva_test_env_set(kva_test_env *e, const char *name, const char *value);
void kva_test_env_restore(const kva_test_env *e);

#endif
