/*
 * cmd_run.c -- `kvattn run`: the serving simulation (serve_sim.c) with options, a progress bar
 * on a terminal, and a human or JSON summary. Exit status: 0 verified clean, 1 a verification
 * failure (wrong output, corrupted cache or leaked pages), 2 bad options or a device/library
 * error.
 */
#include "commands.h"

#include "cli.h"
#include "serve_sim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *const algo_names[] = {"partial", "global", NULL};
static const char *const layout_names[] = {"nhd", "hnd", NULL};

typedef struct soak_log soak_log;
typedef struct progress_bar {
    double last_draw;
    int drawn;
    soak_log *soak;
} progress_bar;

static void draw_progress(const sim_progress *p, void *user) {
    progress_bar *bar = user;
    double now = cli_now();
    if (p->finished < p->total_requests && now - bar->last_draw < 0.1) return;
    bar->last_draw = now;
    bar->drawn = 1;
    const int width = 30;
    int fill = p->total_requests ? (int)((int64_t)width * p->finished / p->total_requests) : width;
    char bar_text[64];
    for (int i = 0; i < width; ++i) bar_text[i] = i < fill ? '#' : '.';
    bar_text[width] = 0;
    fprintf(stderr, "\r[%s] %d/%d done  step %d  running %d  waiting %d  pages %d/%d  preempted %d%s ",
            bar_text, p->finished, p->total_requests, p->step, p->running, p->waiting,
            p->used_pages, p->num_pages, p->preemptions, p->verify_failures ? "  VERIFY FAIL" : "");
    fflush(stderr);
}

static double per_second(double amount, double seconds) {
    return seconds > 0 ? amount / seconds : 0.0;
}

static const char *verdict(const sim_result *r) {
    if (r->verify_failures || r->cache_mismatches || r->leaked_pages || r->shared_page_writes)
        return "FAIL";
    return r->verified_steps ? "PASS" : "not verified (--verify-every 0)";
}

static int passed(const sim_result *r) { return strcmp(verdict(r), "FAIL") != 0; }

/* ---- soak: memory measured while the run goes on --------------------------------------------- */

/* Resident set of this process in bytes (/proc/self/statm), or -1. */
static int64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long long size, resident;
    int ok = fscanf(f, "%lld %lld", &size, &resident) == 2;
    fclose(f);
    return ok ? (int64_t)resident * sysconf(_SC_PAGESIZE) : -1;
}

/* Device memory in use on ctx's GPU (total - free, every process on it), or -1 on the CPU. */
static int64_t device_used_bytes(const kva_context *ctx) {
    kva_device_info i;
    if (kva_context_device(ctx) != KVA_DEVICE_CUDA || kva_context_info(ctx, &i) != KVA_OK) return -1;
    return (int64_t)(i.total_memory - i.free_memory);
}

typedef struct soak_log {
    progress_bar *bar;
    double start;
    int64_t rss_first, rss_min, rss_max, rss_last; /* from the end of the warm-up on */
    int64_t rss_warm;                              /* at the first sample */
    const kva_context *ctx;                        /* CUDA: device memory sampled too */
    int64_t dev_first, dev_max;                    /* device bytes in use, after the warm-up */
    int samples;
    int quiet;                                     /* --json: no lines on stderr */
    double warmup;                                 /* seconds before the baseline sample */
} soak_log;

static void soak_sample(const sim_progress *p, void *user) {
    soak_log *log = ((progress_bar *)user)->soak;
    int64_t rss = rss_bytes(), dev = device_used_bytes(log->ctx);
    double t = cli_now() - log->start;
    if (log->samples++ == 0) log->rss_warm = rss;
    if (t >= log->warmup) {
        if (log->rss_first < 0) log->rss_first = log->rss_min = log->rss_max = rss;
        if (rss < log->rss_min) log->rss_min = rss;
        if (rss > log->rss_max) log->rss_max = rss;
        if (log->dev_first < 0) log->dev_first = log->dev_max = dev;
        if (dev > log->dev_max) log->dev_max = dev;
    }
    log->rss_last = rss;
    if (!log->quiet) {
        char devtxt[48] = "";
        if (dev >= 0) snprintf(devtxt, sizeof devtxt, "  device %.1f MB", (double)dev / 1e6);
        fprintf(stderr, "%ssoak %6.0f s  step %d  rss %.1f MB%s  pages %d/%d  preempted %d%s\n",
                log->bar->drawn ? "\n" : "", t, p->step, (double)rss / 1e6, devtxt, p->used_pages,
                p->num_pages, p->preemptions, p->verify_failures ? "  VERIFY FAIL" : "");
    }
}

static void print_summary(const sim_config *c, const sim_result *r, const kva_device_info *info,
                          const char *device) {
    double pool_mb = (double)sim_pool_bytes(c) / 1e6;
    printf("kvattn run on %s (%s, %d %s)\n", device, info->name, info->num_sms,
           strcmp(device, "cpu") == 0 ? "threads" : "SMs");
    printf("model      %d layers, %d q heads / %d kv heads, head dim %d, %s\n", c->num_layers,
           c->num_qo_heads, c->num_kv_heads, c->head_dim, kva_dtype_name(c->dtype));
    printf("cache      %d pages x %d tokens per layer (%.0f MB for all layers), token budget %d, "
           "max batch %d\n", r->num_pages, c->page_size, pool_mb, c->token_budget, c->max_batch);
    printf("requests   %d finished in %d steps (at most %d running at once)\n",
           r->requests_finished, r->steps, r->max_running);
    printf("tokens     %lld prompt + %lld output; prefilled %lld (%lld recomputed after "
           "preemption), decoded %lld\n", (long long)r->prompt_tokens, (long long)r->output_tokens,
           (long long)r->prefill_tokens, (long long)r->recomputed_tokens,
           (long long)r->decode_tokens);
    if (r->prefill_unsupported)
        printf("prefill    attention not available on this device (chunks only filled the cache)\n");
    else
        printf("prefill    %.2f s of attention: %.0f tokens/s, %.1f GFLOP/s\n", r->prefill_seconds,
               per_second((double)r->prefill_tokens, r->prefill_seconds),
               per_second(r->prefill_flops, r->prefill_seconds) / 1e9);
    printf("decode     %.2f s of attention: %.0f tokens/s, %.1f GB/s of K/V read\n",
           r->decode_seconds, per_second((double)r->decode_tokens, r->decode_seconds),
           per_second(r->decode_bytes, r->decode_seconds) / 1e9);
    printf("overhead   plan %.3f s, append %.3f s; wall %.1f s\n", r->plan_seconds,
           r->append_seconds, r->wall_seconds);
    printf("pages      peak %d of %d in use, %d preemptions, %d leaked after the run\n",
           r->peak_pages, r->num_pages, r->preemptions, r->leaked_pages);
    if (c->shared_prefix_len > 0 || c->parallel_samples > 1)
        printf("sharing    %d forks (%d system prompts of %d tokens, %d samples per prompt): %lld "
               "tokens shared instead of prefilled, peak %d shared pages, %lld copy-on-write "
               "copies; %lld checks of shared pages, %lld written while shared\n",
               r->forks, c->shared_prefix_len > 0 ? c->prefix_groups : 0, c->shared_prefix_len,
               c->parallel_samples > 1 ? c->parallel_samples : 1, (long long)r->shared_tokens,
               r->peak_shared_pages, (long long)r->cow_copies, (long long)r->shared_page_checks,
               (long long)r->shared_page_writes);
    printf("verify     %d steps, %lld rows vs float64 reference: max |err| %.3g, %lld rows off, "
           "%lld cache values off -> %s\n",
           r->verified_steps, (long long)r->verified_rows, r->max_abs_err,
           (long long)r->verify_failures, (long long)r->cache_mismatches, verdict(r));
}

static void print_json(const sim_config *c, const sim_result *r, const kva_device_info *info,
                       const char *device) {
    char name[256];
    size_t j = 0;
    for (size_t i = 0; info->name[i] && j + 2 < sizeof name; ++i) {
        if (info->name[i] == '"' || info->name[i] == '\\') name[j++] = '\\';
        name[j++] = info->name[i];
    }
    name[j] = 0;
    printf("{\n");
    printf("  \"device\": \"%s\", \"device_name\": \"%s\", \"threads_or_sms\": %d,\n", device, name,
           info->num_sms);
    printf("  \"layers\": %d, \"num_qo_heads\": %d, \"num_kv_heads\": %d, \"head_dim\": %d, "
           "\"dtype\": \"%s\",\n", c->num_layers, c->num_qo_heads, c->num_kv_heads, c->head_dim,
           kva_dtype_name(c->dtype));
    printf("  \"page_size\": %d, \"num_pages\": %d, \"token_budget\": %d, \"max_batch\": %d, "
           "\"seed\": %llu,\n", c->page_size, r->num_pages, c->token_budget, c->max_batch,
           (unsigned long long)c->seed);
    printf("  \"requests\": %d, \"steps\": %d, \"max_running\": %d,\n", r->requests_finished,
           r->steps, r->max_running);
    printf("  \"prompt_tokens\": %lld, \"output_tokens\": %lld,\n", (long long)r->prompt_tokens,
           (long long)r->output_tokens);
    printf("  \"prefill_tokens\": %lld, \"recomputed_tokens\": %lld, \"decode_tokens\": %lld,\n",
           (long long)r->prefill_tokens, (long long)r->recomputed_tokens,
           (long long)r->decode_tokens);
    printf("  \"prefill_supported\": %s, \"prefill_seconds\": %.6f, \"prefill_tokens_per_s\": %.1f, "
           "\"prefill_gflops\": %.3f,\n", r->prefill_unsupported ? "false" : "true",
           r->prefill_seconds, per_second((double)r->prefill_tokens, r->prefill_seconds),
           per_second(r->prefill_flops, r->prefill_seconds) / 1e9);
    printf("  \"decode_seconds\": %.6f, \"decode_tokens_per_s\": %.1f, \"decode_gb_per_s\": %.3f,\n",
           r->decode_seconds, per_second((double)r->decode_tokens, r->decode_seconds),
           per_second(r->decode_bytes, r->decode_seconds) / 1e9);
    printf("  \"plan_seconds\": %.6f, \"append_seconds\": %.6f, \"wall_seconds\": %.3f,\n",
           r->plan_seconds, r->append_seconds, r->wall_seconds);
    printf("  \"peak_pages\": %d, \"preemptions\": %d, \"leaked_pages\": %d,\n", r->peak_pages,
           r->preemptions, r->leaked_pages);
    printf("  \"verified_steps\": %d, \"verified_rows\": %lld, \"verify_failures\": %lld, "
           "\"cache_mismatches\": %lld, \"max_abs_err\": %.6g,\n", r->verified_steps,
           (long long)r->verified_rows, (long long)r->verify_failures,
           (long long)r->cache_mismatches, isfinite(r->max_abs_err) ? r->max_abs_err : 1e300);
    printf("  \"forks\": %d, \"shared_tokens\": %lld, \"root_tokens\": %lld, "
           "\"peak_shared_pages\": %d, \"cow_copies\": %lld, \"shared_page_checks\": %lld, "
           "\"shared_page_writes\": %lld,\n", r->forks, (long long)r->shared_tokens,
           (long long)r->root_tokens, r->peak_shared_pages, (long long)r->cow_copies,
           (long long)r->shared_page_checks, (long long)r->shared_page_writes);
    printf("  \"pass\": %s\n}\n", passed(r) ? "true" : "false");
}

int kvattn_cmd_run(int argc, char **argv) {
    sim_config cfg;
    sim_config_default(&cfg);
    cli_device device = CLI_DEVICE_AUTO;
    int32_t threads = 0;
    int json = 0, algo = 0, layout = 0;
    int32_t duration = 0;
    const cli_option options[] = {
        {"requests", CLI_INT, &cfg.num_requests, "requests to serve", NULL, 1},
        {"seed", CLI_U64, &cfg.seed, "seed of request lengths and synthetic Q/K/V", NULL, 0},
        {"layers", CLI_INT, &cfg.num_layers, "model layers (one cache pool each)", NULL, 1},
        {"heads", CLI_INT, &cfg.num_qo_heads, "query heads", NULL, 1},
        {"kv-heads", CLI_INT, &cfg.num_kv_heads, "K/V heads (must divide --heads)", NULL, 1},
        {"head-dim", CLI_INT, &cfg.head_dim, "head dimension (CPU: multiple of 16 up to 256; "
                                             "CUDA: multiple of 16 in 32..256)", NULL, 16},
        {"dtype", CLI_DTYPE, &cfg.dtype, "element type of Q, K, V and outputs", NULL, 0},
        {"page-size", CLI_INT, &cfg.page_size, "tokens per cache page", NULL, 1},
        {"pages", CLI_INT, &cfg.num_pages, "pages per layer; 0 = 9/10 of what max-batch "
                                           "requests of average length need (long batches "
                                           "preempt)", NULL, 0},
        {"token-budget", CLI_INT, &cfg.token_budget, "tokens (decode + prefill chunks) per step",
         NULL, 1},
        {"max-batch", CLI_INT, &cfg.max_batch, "running requests at once", NULL, 1},
        {"prompt-len", CLI_RANGE, cfg.prompt_len, "prompt length range (uniform)", NULL, 1},
        {"output-len", CLI_RANGE, cfg.output_len, "decode steps per request range (uniform)", NULL, 0},
        {"verify-every", CLI_INT, &cfg.verify_every, "check one layer of every Nth step against the "
                                                     "float64 reference (0 = never)", NULL, 0},
        {"verify-requests", CLI_INT, &cfg.verify_requests, "requests checked per verified step, "
                                                           "decode and prefill each", NULL, 1},
        {"algo", CLI_CHOICE, &algo, "split-KV decode algorithm", algo_names, 0},
        {"layout", CLI_CHOICE, &layout, "layout inside a cache page", layout_names, 0},
        {"threads", CLI_INT, &threads, "CPU worker threads (0 = all cores)", NULL, 0},
        {"device", CLI_DEVICE, &device, "where attention runs; auto = cuda when a GPU is "
                                        "present, else cpu", NULL, 0},
        {"shared-prefix", CLI_INT, &cfg.shared_prefix_len, "system-prompt tokens every request "
                                                           "starts with, prefilled once and forked "
                                                           "(0 = none)", NULL, 0},
        {"prefix-groups", CLI_INT, &cfg.prefix_groups, "distinct system prompts (with "
                                                       "--shared-prefix)", NULL, 1},
        {"samples", CLI_INT, &cfg.parallel_samples, "parallel samples per prompt, forked from the "
                                                    "first once it has prefilled", NULL, 1},
        {"duration", CLI_INT, &duration, "soak: keep serving new requests for this many seconds "
                                         "and report memory (0 = serve --requests once)", NULL, 0},
        {"json", CLI_FLAG, &json, "print the summary as JSON on stdout", NULL, 0},
    };
    const char *summary =
        "Serving simulation: continuous batching with chunked prefill over the paged KV cache.\n"
        "Requests with random prompt/output lengths are scheduled under a per-step token budget;\n"
        "each step reserves cache slots (preempting the youngest request when pages run out),\n"
        "appends synthetic K/V, plans once and runs decode + paged prefill on every layer.\n"
        "Sampled steps are checked against the float64 reference. Throughputs are tokens and\n"
        "work per second of attention time, summed over layers. Exit 0 = verified clean,\n"
        "1 = verification failed, 2 = bad options or device/library error.";
    int n = (int)(sizeof options / sizeof options[0]);
    cli_parse_result pr = cli_parse("run", summary, options, n, argc, argv, 2);
    if (pr == CLI_HELP_SHOWN) return 0;
    if (pr == CLI_BAD_ARGS) return 2;
    cfg.decode_algo = algo ? KVA_DECODE_GLOBAL_ROWMAX : KVA_DECODE_PARTIAL_ROWMAX;
    cfg.layout = layout ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;

    int code;
    kva_context *ctx = cli_open_context(device, threads, &code);
    if (!ctx) return code;
    kva_device_info info;
    kva_context_info(ctx, &info);
    const char *dev_name = kva_context_device(ctx) == KVA_DEVICE_CUDA ? "cuda" : "cpu";

    progress_bar bar = {0, 0, NULL};
    /* Warm-up: the first third of the run, at least a minute (runs of 2 minutes or more). The
     * allocator, the CUDA driver's lazily built state and first-touch pages settle there: an H200
     * soak of 582 s grew 2.7 MB between 60 and 111 s and not at all in the 470 s after; a leak
     * that grows with the work shows over the remaining two thirds. */
    const double warmup = duration >= 120 ? (duration / 3.0 > 60.0 ? duration / 3.0 : 60.0) : 0.0;
    soak_log soak = {&bar, cli_now(), -1, -1, -1, -1, -1, ctx, -1, -1, 0, json, warmup};
    cfg.progress_user = &bar;
    if (isatty(STDERR_FILENO)) cfg.progress = draw_progress;
    if (duration > 0) {
        cfg.duration_seconds = duration;
        cfg.soak_report = soak_sample;
        cfg.soak_report_every = duration >= 600 ? 30.0 : duration >= 60 ? 10.0 : 1.0;
        bar.soak = &soak;
    }
    sim_result res;
    kva_status st = sim_run(ctx, &cfg, &res);
    if (bar.drawn) fprintf(stderr, "\n");
    int64_t rss_end = rss_bytes();
    kva_context_destroy(ctx);
    if (st != KVA_OK) {
        fprintf(stderr, "kvattn run: %s\n", res.error);
        return 2;
    }
    if (json)
        print_json(&cfg, &res, &info, dev_name);
    else
        print_summary(&cfg, &res, &info, dev_name);
    if (duration > 0) {
        /* Flat = from the end of the warm-up (above) the resident set grows by at most 1% (or
         * 1 MB). */
        int64_t growth = soak.rss_max - soak.rss_first;
        int64_t allowed = soak.rss_first / 100 > (1 << 20) ? soak.rss_first / 100 : (1 << 20);
        int flat = soak.samples > 0 && growth <= allowed;
        /* (a run shorter than 120 s has no warm-up, so its growth is the settling itself: the
         * numbers are printed, no verdict is drawn from them) */
        const int judged = warmup > 0.0;
        /* Device memory: the library allocates only at setup, so after the warm-up any growth
         * is a leak (1 MB of slack for the driver's own bookkeeping). */
        const int64_t dev_growth = soak.dev_first >= 0 ? soak.dev_max - soak.dev_first : 0;
        if (dev_growth > (1 << 20)) flat = 0;
        FILE *out = json ? stderr : stdout;
        fprintf(out, "soak       %.0f s, %d lives of %d request slots, %d samples: host RSS %.1f MB "
                     "at first sample, %.1f MB after warm-up, then min %.1f / max %.1f MB "
                     "(growth %.2f MB), %.1f MB at the end (context destroyed) -> %s\n",
                res.wall_seconds, res.requests_finished, cfg.num_requests, soak.samples,
                (double)soak.rss_warm / 1e6, (double)soak.rss_first / 1e6,
                (double)soak.rss_min / 1e6, (double)soak.rss_max / 1e6, (double)growth / 1e6,
                (double)rss_end / 1e6,
                !judged ? "not judged (under 120 s: no warm-up)" : flat ? "flat" : "GROWING");
        if (soak.dev_first >= 0)
            fprintf(out, "soak       device memory in use (all processes) %.1f MB after warm-up, max "
                         "%.1f MB (growth %.2f MB)\n",
                    (double)soak.dev_first / 1e6, (double)soak.dev_max / 1e6, (double)dev_growth / 1e6);
        if (judged && !flat) return 1;
    }
    return passed(&res) ? 0 : 1;
}
