/*
 * test_cpu_dispatch.c -- the choice of CPU kernel variant (src/cpu/cpu_dispatch.c): the default
 * is the best variant this CPU runs, KVA_CPU_ISA selects any built variant the CPU runs and
 * refuses the rest without creating a context (a built variant exactly when the CPU cannot run
 * it; an unknown name with the list of built ones), an empty KVA_CPU_ISA is auto, and
 * kva_cpu_variant reports what was chosen.
 * (That every variant computes the right thing is checked by the CPU sweeps, which run under
 * each variant: KVA_TEST_CPU_VARIANTS in test_cpu_decode.c, test_cpu_prefill.c and
 * test_cpu_attention.c.)
 */
#include "harness.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Creates a CPU context under KVA_CPU_ISA=isa (NULL: unset); returns its status and variant. */
static kva_status create_under(const char *isa, char *variant, size_t n) {
    const char *env = getenv("KVA_CPU_ISA");
    char saved[64] = "";
    if (env) snprintf(saved, sizeof saved, "%s", env);
    if (isa)
        setenv("KVA_CPU_ISA", isa, 1);
    else
        unsetenv("KVA_CPU_ISA");
    kva_context *ctx = (kva_context *)(uintptr_t)1; /* must be reset to NULL on failure */
    kva_status st = kva_context_create(KVA_DEVICE_CPU, 0, &ctx);
    snprintf(variant, n, "%s", st == KVA_OK ? kva_cpu_variant(ctx) : (ctx ? "not-null" : ""));
    kva_context_destroy(st == KVA_OK ? ctx : NULL);
    if (env)
        setenv("KVA_CPU_ISA", saved, 1);
    else
        unsetenv("KVA_CPU_ISA");
    return st;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
/* F16C is CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c"). */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

/* What this CPU should get by default, from the compiler's own cpuid reading. */
static const char *expected_default(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
        return "avx512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
        return "avx2";
    return "generic";
#elif defined(__aarch64__)
    return "neon";
#else
    return "generic";
#endif
}

KVA_TEST(cpu_dispatch_default_is_best_supported) {
    char got[64];
    CHECK_OK(create_under(NULL, got, sizeof got));
    CHECK_MSG(strcmp(got, expected_default()) == 0, "default variant %s, expected %s", got,
              expected_default());
    char with_auto[64];
    CHECK_OK(create_under("auto", with_auto, sizeof with_auto));
    CHECK_MSG(strcmp(with_auto, got) == 0, "KVA_CPU_ISA=auto gave %s, default %s", with_auto, got);
    printf("    default variant: %s\n", got);
}

KVA_TEST(cpu_dispatch_override_selects_or_refuses) {
    static const char *const names[] = {"avx512", "avx2", "neon", "generic"};
    int supported = 0;
    for (int i = 0; i < 4; ++i) {
        char got[64];
        kva_status st = create_under(names[i], got, sizeof got);
        if (st == KVA_OK) {
            CHECK_MSG(strcmp(got, names[i]) == 0, "KVA_CPU_ISA=%s gave %s", names[i], got);
            ++supported;
        } else {
            CHECK_MSG(st == KVA_ERR_UNSUPPORTED, "KVA_CPU_ISA=%s: %s", names[i],
                      kva_status_str(st));
            CHECK_MSG(got[0] == 0, "KVA_CPU_ISA=%s failed but left a context", names[i]);
            CHECK(strstr(kva_last_error(), names[i]) != NULL);
        }
    }
    CHECK_MSG(supported >= 1, "not even the generic variant runs");
    char got[64];
    CHECK_OK(create_under("generic", got, sizeof got)); /* the portable fallback always runs */
    CHECK_STATUS(create_under("sse9", got, sizeof got), KVA_ERR_UNSUPPORTED);
    CHECK(strstr(kva_last_error(), "sse9") != NULL);
    /* the message names the public call and the variable */
    CHECK_MSG(strncmp(kva_last_error(), "kva_context_create: KVA_CPU_ISA=sse9", 36) == 0, "\"%s\"", kva_last_error());
#if defined(__x86_64__)
    CHECK_STATUS(create_under("neon", got, sizeof got), KVA_ERR_UNSUPPORTED);
#endif
#if defined(__aarch64__)
    CHECK_STATUS(create_under("avx2", got, sizeof got), KVA_ERR_UNSUPPORTED);
#endif
    CHECK(kva_cpu_variant(NULL) == NULL);
}

/* Whether this CPU runs a variant, from the compiler's own cpuid reading (-1: not known here). */
static int cpu_runs(const char *name) {
    if (strcmp(name, "generic") == 0) return 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    if (strcmp(name, "avx2") == 0) return avx2;
    if (strcmp(name, "avx512") == 0)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return 0; /* neon */
#elif defined(__aarch64__)
    return strcmp(name, "neon") == 0 ? 1 : 0;
#else
    return -1;
#endif
}

/* A built variant is selected exactly when this CPU runs it ("cannot run" otherwise); the
 * refusal of an unknown name lists the built variants, best first, as "built: a, b; or auto";
 * an empty KVA_CPU_ISA is the default, like auto. */
KVA_TEST(cpu_dispatch_selects_exactly_what_the_cpu_runs) {
    static const char *const names[] = {"avx512", "avx2", "neon", "generic"};
    char built[128] = "";
    for (int i = 0; i < 4; ++i) {
        char got[64];
        kva_status st = create_under(names[i], got, sizeof got);
        const int runs = cpu_runs(names[i]);
        const bool not_built = st == KVA_ERR_UNSUPPORTED && strstr(kva_last_error(), "no such CPU kernel variant");
        if (!not_built) {
            if (built[0]) strcat(built, ", ");
            strcat(built, names[i]);
        }
        if (not_built || runs < 0) continue;
        if (runs)
            CHECK_MSG(st == KVA_OK && strcmp(got, names[i]) == 0, "KVA_CPU_ISA=%s on a CPU that runs it: %s (%s)",
                      names[i], kva_status_str(st), st == KVA_OK ? got : kva_last_error());
        else
            CHECK_MSG(st == KVA_ERR_UNSUPPORTED && strstr(kva_last_error(), "cannot run") != NULL,
                      "KVA_CPU_ISA=%s on a CPU without it: %s (%s)", names[i], kva_status_str(st),
                      st == KVA_OK ? got : kva_last_error());
    }
    char got[64];
    CHECK_STATUS(create_under("avx", got, sizeof got), KVA_ERR_UNSUPPORTED);
    char want[200];
    snprintf(want, sizeof want, "(built: %s; or auto)", built);
    CHECK_MSG(strstr(kva_last_error(), want) != NULL, "\"%s\" does not list %s", kva_last_error(), want);
    char dflt[64], empty[64];
    CHECK_OK(create_under(NULL, dflt, sizeof dflt));
    CHECK_OK(create_under("", empty, sizeof empty));
    CHECK_MSG(strcmp(empty, dflt) == 0, "KVA_CPU_ISA= (empty) gave %s, default %s", empty, dflt);
}
