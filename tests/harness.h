/*
 * harness.h -- the test runner: KVA_TEST(name) { ... } registers a test; CHECK* macros record
 * failures with file:line and keep going; the runner prints one line per test and ends with
 * "N passed, N failed, N skipped". `kvattn_tests [substring ...]` runs matching tests only.
 */
#ifndef KVA_TEST_HARNESS_H
#define KVA_TEST_HARNESS_H

#include "kvattn.h"

#include <stdio.h>

typedef void (*kva_test_fn)(void);
void kva_test_register(const char *name, kva_test_fn fn);

/* Failure bookkeeping of the current test. */
extern int kva_test_failures;
extern int kva_test_skipped;
void kva_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Marks the current test skipped (e.g. no GPU), with a reason. */
void kva_test_skip(const char *reason);

#define KVA_TEST(name)                                                                         \
    static void name(void);                                                                    \
    __attribute__((constructor)) static void name##_register(void) {                           \
        kva_test_register(#name, name);                                                        \
    }                                                                                          \
    static void name(void)

/* Runs body once per CPU kernel variant that this build has and this CPU runs (avx512, avx2,
 * neon, generic), with KVA_CPU_ISA set so that every CPU context the body creates uses it; the
 * caller's KVA_CPU_ISA is restored afterwards. Failures name the variant. */
void kva_test_each_cpu_variant(void (*body)(void));

/* A test whose body runs under every CPU kernel variant (kva_test_each_cpu_variant). */
#define KVA_TEST_CPU_VARIANTS(name)                                                            \
    static void name##_body(void);                                                             \
    KVA_TEST(name) { kva_test_each_cpu_variant(name##_body); }                                 \
    static void name##_body(void)

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) kva_test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);                    \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                   \
    do {                                                                                       \
        if (!(cond)) kva_test_fail(__FILE__, __LINE__, __VA_ARGS__);                           \
    } while (0)

/* Expects a kva_status; prints the library's message on mismatch. */
#define CHECK_STATUS(expr, expected)                                                           \
    do {                                                                                       \
        kva_status st__ = (expr);                                                              \
        if (st__ != (expected))                                                                \
            kva_test_fail(__FILE__, __LINE__, "%s returned %s, expected %s (%s)", #expr,       \
                          kva_status_str(st__), kva_status_str(expected), kva_last_error());   \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, KVA_OK)

/* Returns from the test if it already failed (to avoid cascades). */
#define REQUIRE_OK(expr)                                                                       \
    do {                                                                                       \
        kva_status st__ = (expr);                                                              \
        if (st__ != KVA_OK) {                                                                  \
            kva_test_fail(__FILE__, __LINE__, "%s returned %s (%s)", #expr,                    \
                          kva_status_str(st__), kva_last_error());                             \
            return;                                                                            \
        }                                                                                      \
    } while (0)

#endif
