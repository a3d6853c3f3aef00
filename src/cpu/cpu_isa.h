/*
 * cpu_isa.h -- the CPU backend's ISA variants: one table of kernel entry points per variant,
 * and the choice among them.
 *
 * src/cpu/kernels/ is compiled once per variant (CMakeLists.txt, kva_add_cpu_variant), each time
 * with that ISA's target flags and -DKVA_ISA=<name> -DKVA_ISA_<NAME>=1, so the library is built
 * once without -march=native and still runs at the native vector width of whatever CPU it meets.
 * Every variant exports kva__<name>_kernels; KVA_HAVE_ISA_<NAME> tells the dispatcher which were
 * built (x86-64: avx512, avx2, generic; aarch64: neon, generic; elsewhere: generic).
 */
#ifndef KVA_CPU_ISA_H
#define KVA_CPU_ISA_H

#include "kvattn.h"
#include "prefill_engine.h"

/* kva__<variant>_<name>: the per-variant symbol of a kernel source. */
#define KVA__ISA_CAT2(isa, name) kva__##isa##_##name
#define KVA__ISA_CAT(isa, name) KVA__ISA_CAT2(isa, name)
#define KVA__ISA_FN(name) KVA__ISA_CAT(KVA_ISA, name)

typedef struct kva__cpu_kernels {
    const char *name; /* "avx512", "avx2", "neon", "generic": what kva_cpu_variant returns */
    kva_status (*decode_run)(kva_context *ctx, const kva_plan *plan,
                             const kva_attn_params *params, kva_tensor q,
                             const kva_kv_pages *pages, kva_tensor o, float *lse);
    size_t (*prefill_scratch_bytes)(int32_t head_dim);
    void (*prefill_task_run)(const kva__prefill_config *cfg, const kva__prefill_task *task,
                             void *scratch);
} kva__cpu_kernels;

#ifdef KVA_ISA
/* The entry points of the variant this translation unit is compiled as (src/cpu/kernels/). */
kva_status KVA__ISA_FN(decode_run)(kva_context *ctx, const kva_plan *plan,
                                   const kva_attn_params *params, kva_tensor q,
                                   const kva_kv_pages *pages, kva_tensor o, float *lse);
size_t KVA__ISA_FN(prefill_scratch_bytes)(int32_t head_dim);
void KVA__ISA_FN(prefill_task_run)(const kva__prefill_config *cfg, const kva__prefill_task *task,
                                   void *scratch);
extern const kva__cpu_kernels KVA__ISA_FN(kernels);
#endif

/* The variant a new context uses: the best one this CPU supports (cpuid / hwcaps), or the one
 * the environment variable KVA_CPU_ISA names (avx512 | avx2 | neon | generic | auto; for tests
 * and comparisons). A named variant that was not built or that this CPU cannot run fails with
 * KVA_ERR_UNSUPPORTED rather than running something else. */
kva_status kva__cpu_kernels_select(const kva__cpu_kernels **out);

#endif /* KVA_CPU_ISA_H */
