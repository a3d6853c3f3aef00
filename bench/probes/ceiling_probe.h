/*
 * ceiling_probe.h -- the loops `kvattn bench` measures its ceilings with, compiled once per CPU
 * kernel variant (bench/probes/ceiling_probe.c, same flags and the same simd.h as the kernels),
 * so a ceiling is measured at the vector width the kernels of that variant run at.
 */
#ifndef KVA_CEILING_PROBE_H
#define KVA_CEILING_PROBE_H

#include <stddef.h>

typedef struct kva_ceiling_probe {
    const char *name; /* the variant, as kva_cpu_variant() names it */
    int lanes;        /* f32 lanes per vector */
    int max_chains;   /* FMA chains that still fit in the register file */
    /* Sum of n floats (n a multiple of 16 * lanes) with 8 independent vector accumulators. */
    float (*read)(const float *p, size_t n);
    /* iters steps of `chains` (8, 12 or 16) independent register-resident FMA chains, i.e.
     * 2 * lanes * chains * iters FLOPs; returns a value that depends on all of them. */
    float (*fma)(long iters, float seed, int chains);
} kva_ceiling_probe;

/* The probes of every built variant, best first, NULL-terminated. */
extern const kva_ceiling_probe *const kva_ceiling_probes[];

#endif
