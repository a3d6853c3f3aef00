/*
 * cmd_bench.c -- `kvattn bench`: the CPU benchmarks (bench/bench_cpu.c), or on --device cuda the
 * GPU benchmark entry point kva_bench_cuda_main when the build has one.
 *
 * kva_bench_cuda_main is declared weak: a build whose CUDA helper provides it (bench/bench_cuda.h)
 * links it in, any other build links fine and points to the GPU script instead.
 */
#include "commands.h"

#include "cli.h"
#include "../bench/bench_cpu.h"

#include <stdio.h>
#include <string.h>

#if defined(__has_include)
#if __has_include("../bench/bench_cuda.h")
#include "../bench/bench_cuda.h"
#endif
#endif

int kva_bench_cuda_main(int argc, char **argv) __attribute__((weak));

static int asks_for_cuda(int argc, char **argv) {
    for (int a = 2; a < argc; ++a) {
        if (strcmp(argv[a], "--device=cuda") == 0) return 1;
        if (strcmp(argv[a], "--device") == 0 && a + 1 < argc && strcmp(argv[a + 1], "cuda") == 0)
            return 1;
    }
    return 0;
}

int kvattn_cmd_bench(int argc, char **argv) {
    cli_device device = CLI_DEVICE_CPU;
    int quick = 0;
    int32_t threads = 0;
    const cli_option options[] = {
        {"device", CLI_DEVICE, &device, "cpu: the benchmarks below; cuda (or auto with a GPU): "
                                        "the GPU benchmark", NULL, 0},
        {"quick", CLI_FLAG, &quick, "smaller pools, fewer repetitions (smoke run)", NULL, 0},
        {"threads", CLI_INT, &threads, "CPU threads (0 = all cores)", NULL, 0},
    };
    const char *summary =
        "CPU: measures this machine's read bandwidth (>= 1 GB streamed by all threads) and fp32\n"
        "FMA rate, then decode (bf16/f16, 32 q / 8 kv heads, d 128, page 16, 1x4096 and 8x4096,\n"
        "K/V rotated over >= 4x the last-level cache) as GB/s and fraction of read bandwidth,\n"
        "causal prefill (512 and 2048 tokens) as GFLOP/s and fraction of the FMA rate, and the\n"
        "two split-KV decode algorithms side by side; ends with a markdown table.";
    int n = (int)(sizeof options / sizeof options[0]);
    /* With --device cuda the options belong to the GPU benchmark: pass them through untouched. */
    if (asks_for_cuda(argc, argv)) device = CLI_DEVICE_CUDA;
    if (device != CLI_DEVICE_CUDA) {
        cli_parse_result pr = cli_parse("bench", summary, options, n, argc, argv, 2);
        if (pr == CLI_HELP_SHOWN) return 0;
        if (pr == CLI_BAD_ARGS) return 2;
        if (device == CLI_DEVICE_AUTO && kva_cuda_available()) device = CLI_DEVICE_CUDA;
    }
    if (device == CLI_DEVICE_CUDA) {
        if (kva_bench_cuda_main) return kva_bench_cuda_main(argc, argv);
        printf("kvattn bench --device cuda: the GPU benchmarks are run by scripts/gpu-check.sh "
               "(see that script)\n");
        return 0;
    }
    int code;
    kva_context *ctx = cli_open_context(CLI_DEVICE_CPU, threads, &code);
    if (!ctx) return code;
    bench_cpu_options opt = {quick};
    int rc = bench_cpu_main(ctx, &opt);
    kva_context_destroy(ctx);
    return rc;
}
