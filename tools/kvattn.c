/*
 * kvattn.c -- the `kvattn` command: dispatch to a subcommand, top-level help and version.
 *
 *   kvattn run    serving simulation over the paged KV cache (the main job)
 *   kvattn bench  kernel benchmarks against the machine's measured ceilings
 *   kvattn check  one shape of decode and prefill against the float64 reference
 */
#include "commands.h"

#include "kvattn.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: kvattn <command> [options]\n"
            "\n"
            "Attention over a paged KV cache, on the CPU and on NVIDIA GPUs.\n"
            "\n"
            "commands:\n"
            "  run      serving simulation: continuous batching, chunked prefill, decode and\n"
            "           preemption over the paged cache, verified against a float64 reference\n"
            "           (device auto: CUDA when a GPU is present, else CPU)\n"
            "  bench    measured read bandwidth and FMA rate, then decode / prefill kernels as a\n"
            "           fraction of them (CPU; --device cuda points to the GPU benchmark)\n"
            "  check    one shape of decode and prefill against the float64 reference: PASS/FAIL\n"
            "  version  print the library version, whether CUDA is built and visible, and the CPU\n"
            "           kernel variant in use (KVA_CPU_ISA=avx512|avx2|neon|generic overrides)\n"
            "\n"
            "`kvattn <command> --help` lists a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0) return kvattn_cmd_run(argc, argv);
    if (strcmp(cmd, "bench") == 0) return kvattn_cmd_bench(argc, argv);
    if (strcmp(cmd, "check") == 0) return kvattn_cmd_check(argc, argv);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        /* The CPU kernel variant is chosen per context: make one to ask. */
        kva_context *ctx = NULL;
        kva_status st = kva_context_create(KVA_DEVICE_CPU, 0, &ctx);
        printf("kvattn %d.%d.%d (CUDA %s; CPU kernels %s)\n", KVA_VERSION_MAJOR,
               KVA_VERSION_MINOR, KVA_VERSION_PATCH,
               kva_cuda_available() ? "available" : "not available",
               st == KVA_OK ? kva_cpu_variant(ctx) : kva_last_error());
        kva_context_destroy(ctx);
        return st == KVA_OK ? 0 : 1;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kvattn: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
