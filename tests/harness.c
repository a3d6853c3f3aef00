/* harness.c -- registration and the main() of kvattn_tests; see harness.h. */
#include "harness.h"
#include "test_util.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_TESTS 1024

static struct { const char *name; kva_test_fn fn; } tests[MAX_TESTS];
static int num_tests;
int kva_test_failures;
int kva_test_skipped;

/* The first failure of each failed test, repeated above the summary line: a CI log shown only
 * by its tail still names what failed, where, and the seed that reproduces it. */
#define MAX_RECAP 16
static char recap[MAX_RECAP][256];
static int num_recap;
static char first_failure[200];

void kva_test_register(const char *name, kva_test_fn fn) {
    if (num_tests < MAX_TESTS) {
        tests[num_tests].name = name;
        tests[num_tests].fn = fn;
        ++num_tests;
    }
}

void kva_test_fail(const char *file, int line, const char *fmt, ...) {
    if (kva_test_failures == 0) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(first_failure, sizeof first_failure, "%s:%d: ", file, line);
        if (n > 0 && (size_t)n < sizeof first_failure)
            vsnprintf(first_failure + n, sizeof first_failure - (size_t)n, fmt, ap);
        va_end(ap);
    }
    if (kva_test_failures < 20) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stdout, "    %s:%d: ", file, line);
        vfprintf(stdout, fmt, ap);
        fprintf(stdout, "\n");
        va_end(ap);
    } else if (kva_test_failures == 20) {
        fprintf(stdout, "    (further failures of this test not shown)\n");
    }
    ++kva_test_failures;
}

void kva_test_skip(const char *reason) {
    if (!kva_test_skipped) fprintf(stdout, "    skipped: %s\n", reason);
    kva_test_skipped = 1;
}

void kva_test_each_cpu_variant(void (*body)(void)) {
    static const char *const names[] = {"avx512", "avx2", "neon", "generic"};
    const char *env = getenv("KVA_CPU_ISA");
    char saved[64] = "";
    if (env) snprintf(saved, sizeof saved, "%s", env);
    int ran = 0;
    for (int i = 0; i < 4; ++i) {
        setenv("KVA_CPU_ISA", names[i], 1);
        kva_context *ctx = NULL;
        if (kva_context_create(KVA_DEVICE_CPU, 0, &ctx) != KVA_OK) continue; /* not here */
        kva_context_destroy(ctx);
        int before = kva_test_failures;
        body();
        ++ran;
        printf("    variant %s: %s\n", names[i], kva_test_failures > before ? "FAILED" : "ok");
    }
    if (env)
        setenv("KVA_CPU_ISA", saved, 1);
    else
        unsetenv("KVA_CPU_ISA");
    if (ran == 0) kva_test_fail(__FILE__, __LINE__, "no CPU kernel variant could be selected");
}

static int cmp_tests(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int main(int argc, char **argv) {
    /* line-buffered even into a file: a test killed by a time limit (the GPU script's) still
     * shows how far it got and what it had found */
    setvbuf(stdout, NULL, _IOLBF, 0);
    qsort(tests, (size_t)num_tests, sizeof tests[0], cmp_tests);
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < num_tests; ++i) {
        /* arguments select tests whose names contain them; "-x" leaves out those containing x */
        if (argc > 1) {
            int match = 0, selecting = 0, excluded = 0;
            for (int a = 1; a < argc; ++a) {
                if (argv[a][0] == '-') {
                    excluded |= strstr(tests[i].name, argv[a] + 1) != NULL;
                } else {
                    selecting = 1;
                    match |= strstr(tests[i].name, argv[a]) != NULL;
                }
            }
            if (excluded || (selecting && !match)) continue;
        }
        kva_test_failures = 0;
        kva_test_skipped = 0;
        printf("[ RUN  ] %s\n", tests[i].name);
        fflush(stdout);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
        if (kva_test_failures) {
            printf("[ FAIL ] %s (%d failures, %.0f ms)\n", tests[i].name, kva_test_failures, ms);
            if (num_recap < MAX_RECAP)
                snprintf(recap[num_recap++], sizeof recap[0], "%s -- %s", tests[i].name, first_failure);
            ++failed;
        } else if (kva_test_skipped) {
            printf("[ SKIP ] %s\n", tests[i].name);
            ++skipped;
        } else {
            printf("[  OK  ] %s (%.0f ms)\n", tests[i].name, ms);
            ++passed;
        }
        fflush(stdout);
    }
    if (failed) {
        printf("failed (first failure of each; %s):\n", kva_test_seed_note());
        for (int i = 0; i < num_recap; ++i) printf("    %s\n", recap[i]);
        if (failed > num_recap) printf("    ... and %d more\n", failed - num_recap);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
