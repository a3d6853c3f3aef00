/*
 * cpu_dispatch.c -- which ISA variant of the CPU kernels a context runs (cpu_isa.h), and the
 * backend entry points that go through it.
 *
 * The choice is made once, at context creation, and stored in the context: the CPU cannot
 * change under a process, and a per-call check would be one more branch on every run. Order of
 * preference: avx512 > avx2 > neon > generic. x86 features come from cpuid through GCC's
 * __builtin_cpu_supports (F16C from cpuid directly), which also checks that the OS saves the
 * AVX / AVX-512 register state (XGETBV); aarch64 asks the kernel's hwcaps (Advanced SIMD is
 * architectural there, but a kernel can in principle hide it).
 */
#include "cpu_backend.h"
#include "cpu_isa.h"
#include "../common/internal.h"

#include <stdlib.h>
#include <string.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#if KVA_HAVE_ISA_AVX512
extern const kva__cpu_kernels kva__avx512_kernels;
#endif
#if KVA_HAVE_ISA_AVX2
extern const kva__cpu_kernels kva__avx2_kernels;
#endif
#if KVA_HAVE_ISA_NEON
extern const kva__cpu_kernels kva__neon_kernels;
#endif
extern const kva__cpu_kernels kva__generic_kernels;

/* Built variants, best first, each with whether this CPU runs it. */
typedef struct variant {
    const kva__cpu_kernels *k;
    int (*runs)(void);
} variant;

#if KVA_HAVE_ISA_AVX512 || KVA_HAVE_ISA_AVX2
#include <cpuid.h>
/* F16C (CPUID.1:ECX bit 29) from cpuid itself: clang 14's __builtin_cpu_supports has no "f16c".
 * Its register state is AVX's, which the "avx2" check below already covers. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif
#if KVA_HAVE_ISA_AVX512
static int runs_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           has_f16c();
}
#endif
#if KVA_HAVE_ISA_AVX2
static int runs_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           has_f16c();
}
#endif
#if KVA_HAVE_ISA_NEON
static int runs_neon(void) {
#if defined(__linux__) && defined(HWCAP_ASIMD)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
    return 1;
#endif
}
#endif
static int runs_generic(void) { return 1; }

static const variant variants[] = {
#if KVA_HAVE_ISA_AVX512
    {&kva__avx512_kernels, runs_avx512},
#endif
#if KVA_HAVE_ISA_AVX2
    {&kva__avx2_kernels, runs_avx2},
#endif
#if KVA_HAVE_ISA_NEON
    {&kva__neon_kernels, runs_neon},
#endif
    {&kva__generic_kernels, runs_generic},
};
enum { NUM_VARIANTS = (int)(sizeof variants / sizeof variants[0]) };

kva_status kva__cpu_kernels_select(const kva__cpu_kernels **out) {
    const char *want = getenv("KVA_CPU_ISA");
    if (want && *want && strcmp(want, "auto") != 0) {
        for (int i = 0; i < NUM_VARIANTS; ++i) {
            if (strcmp(want, variants[i].k->name) != 0) continue;
            if (!variants[i].runs())
                return kva__fail(KVA_ERR_UNSUPPORTED, "kva_context_create: KVA_CPU_ISA=%s: this CPU "
                                 "cannot run the %s kernels", want, want);
            *out = variants[i].k;
            return KVA_OK;
        }
        char built[64] = "";
        for (int i = 0; i < NUM_VARIANTS; ++i) {
            strncat(built, variants[i].k->name, sizeof built - strlen(built) - 1);
            if (i + 1 < NUM_VARIANTS) strncat(built, ", ", sizeof built - strlen(built) - 1);
        }
        return kva__fail(KVA_ERR_UNSUPPORTED, "kva_context_create: KVA_CPU_ISA=%s: no such CPU kernel "
                         "variant in this build (built: %s; or auto)", want, built);
    }
    for (int i = 0; i < NUM_VARIANTS; ++i) {
        if (variants[i].runs()) {
            *out = variants[i].k;
            return KVA_OK;
        }
    }
    *out = &kva__generic_kernels; /* unreachable: generic always runs */
    return KVA_OK;
}

kva_status kva__cpu_decode_run(kva_context *ctx, const kva_plan *plan,
                               const kva_attn_params *params, kva_tensor q,
                               const kva_kv_pages *pages, kva_tensor o, float *lse) {
    return ctx->cpu_kernels->decode_run(ctx, plan, params, q, pages, o, lse);
}
