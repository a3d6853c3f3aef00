/*
 * bench_cpu.h -- `kvattn bench` on the CPU: the machine's own ceilings (streaming read
 * bandwidth, fp32 FMA rate), then decode and prefill kernels reported as fractions of them.
 */
#ifndef KVA_BENCH_CPU_H
#define KVA_BENCH_CPU_H

#include "kvattn.h"

typedef struct bench_cpu_options {
    int quick;      /* smaller pools and fewer repetitions (a smoke run, noisier numbers) */
} bench_cpu_options;

/* Runs every CPU benchmark on ctx (a CPU context; its thread count is used throughout) and
 * prints results and a closing markdown table to stdout. Returns the exit status. */
int bench_cpu_main(kva_context *ctx, const bench_cpu_options *options);

#endif
