/*
 * bench_cpu.c -- CPU benchmarks of `kvattn bench`.
 *
 * Ceilings first, measured on this machine in this run:
 *   - read bandwidth: every thread sums its slice of a buffer >= 1 GB (and >= 4x the last-level
 *     cache) with 8 vector accumulators; the fastest of several passes;
 *   - fp32 FMA rate: every thread runs 8, 12 (and 16) independent register-resident FMA chains;
 *     the sum of each thread's FLOPs per second of its own CPU time (fastest repetition);
 * both with the loops of bench/probes/, compiled per kernel variant like the kernels, run at the
 * variant the context dispatched to (its native vector width), cross-checked (read also at the
 * generic width; FMA at several chain counts) and taken as the best of those.
 * Then the kernels, as fractions of those ceilings:
 *   - decode (bf16, f16; 32 q / 8 kv heads, d = 128, page 16): the K/V of all rotated batches
 *     together is >= 1 GB (>= 4x LLC), pages shuffled, so every timed run streams from DRAM;
 *     reported as GB/s of K+V read;
 *   - prefill (causal, one sequence of 512 / 2048 tokens, ragged K/V): useful GFLOP/s,
 *     4 * qo * kv * D * heads with causal counting half;
 *   - the two split-KV decode algorithms side by side.
 * Decode rows also report their rate over the streaming read measured beside them (a short read
 * pass after every ~25 ms of decode runs; the median over blocks of runs of block rate / mean of
 * the passes before and after): on a host whose memory bandwidth moves while the bench runs, the
 * fraction of the start-of-run ceiling can read 20 points high or low. A cross-check reads the
 * ceiling's buffer as shuffled 32 KB pages (decode's pattern, no arithmetic); where that read is
 * faster than the streaming probes, it is the read ceiling (measure_paged_read).
 * Plans are made outside the timed region (a serving engine plans once per step for all
 * layers); every timed region is one run, and the figure is the median. Each row also reports
 * the CPU share it got (process CPU time / (wall time x threads)): on a shared machine a row
 * well under ~90% ran with its cores taken away part of the time.
 */
#include "bench_cpu.h"

#include "probes/ceiling_probe.h"
#include "../tools/cli.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define BENCH_HEADS 32
#define BENCH_KV_HEADS 8
#define BENCH_HEAD_DIM 128
#define BENCH_PAGE 16

typedef struct bench_row {
    char op[40];
    char dtype[8];
    char shape[24];
    double ms;         /* median */
    double best_ms;    /* fastest run: how far interference from other work pulled the median */
    double rate;       /* GB/s or GFLOP/s, from the median */
    const char *unit;
    double fraction;   /* of the matching ceiling */
    double cpu_share;  /* CPU time / (wall time x threads) over the timed runs: < ~90% means
                          other work took the cores away (the figure is then a floor) */
    double paired;     /* decode: median over blocks of runs of rate / the streaming read
                          measured right before and after the block (0: not measured) */
} bench_row;

typedef struct bench_state {
    kva_context *ctx;
    int threads;
    int quick;
    size_t llc;
    size_t read_bytes;
    double read_gbs;   /* ceilings */
    double fma_gflops;
    double paged_read_gbs; /* cross-check: the same buffer read as shuffled decode pages */
    double stream_gbs;     /* the streaming probes' best (the ceiling unless the paged read beat it) */
    const struct kva_ceiling_probe *probe; /* the dispatched variant's loops */
    float *pair_buf;       /* streaming-read buffer read between decode runs (>= 4x LLC) */
    size_t pair_floats;
    bench_row rows[32];
    int num_rows;
} bench_state;

static double min_of(const double *v, int n) {
    double m = n > 0 ? v[0] : 0;
    for (int i = 1; i < n; ++i)
        if (v[i] < m) m = v[i];
    return m;
}

/* User + system CPU seconds of the whole process (all threads). */
static double cpu_seconds(void) {
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec +
           (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

static void add_row(bench_state *b, const bench_row *r) {
    if (b->num_rows < (int)(sizeof b->rows / sizeof b->rows[0])) b->rows[b->num_rows++] = *r;
}

/* Buffers the timed loops stream (K/V pools, the read-ceiling buffer) come from kva_malloc, as
 * a caller's pools should: on the CPU it gives blocks of 2 MB or more huge pages, which decode
 * from shuffled pages needs (kvattn.h, kva_malloc); the ceiling gets the same pages, so the
 * fractions compare like with like. */
static void *alloc_big(bench_state *b, size_t bytes) {
    void *p = NULL;
    return kva_malloc(b->ctx, bytes, &p) == KVA_OK ? p : NULL;
}

static void free_big(bench_state *b, void *p) { kva_free(b->ctx, p); }

/* ------------------------------------------------------------------------------------------ */
/* Ceilings                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* The probes of the context's kernel variant (same flags, same vector width as its kernels). */
#if KVA_HAVE_ISA_AVX512
extern const kva_ceiling_probe kva_probe_avx512_ceiling;
#endif
#if KVA_HAVE_ISA_AVX2
extern const kva_ceiling_probe kva_probe_avx2_ceiling;
#endif
#if KVA_HAVE_ISA_NEON
extern const kva_ceiling_probe kva_probe_neon_ceiling;
#endif
extern const kva_ceiling_probe kva_probe_generic_ceiling;
const kva_ceiling_probe *const kva_ceiling_probes[] = {
#if KVA_HAVE_ISA_AVX512
    &kva_probe_avx512_ceiling,
#endif
#if KVA_HAVE_ISA_AVX2
    &kva_probe_avx2_ceiling,
#endif
#if KVA_HAVE_ISA_NEON
    &kva_probe_neon_ceiling,
#endif
    &kva_probe_generic_ceiling,
    NULL,
};

static const kva_ceiling_probe *probe_named(const char *name) {
    for (int i = 0; kva_ceiling_probes[i]; ++i)
        if (name && strcmp(kva_ceiling_probes[i]->name, name) == 0) return kva_ceiling_probes[i];
    return &kva_probe_generic_ceiling;
}

static double thread_cpu_seconds(void);

/* The probes' threads: fn(arg, t, T) once on each of T threads at the same time (the caller is
 * thread 0). A ceiling is what the cores do together, so every thread streams its own slice,
 * unlike the library's pool, where the others take a late worker's tasks. A thread that cannot
 * be started has its slice run by the caller afterwards. */
typedef void (*team_fn)(void *arg, int t, int T);
typedef struct team_member {
    team_fn fn;
    void *arg;
    int t, T;
    pthread_t tid;
} team_member;

static void *team_member_main(void *p) {
    team_member *m = (team_member *)p;
    m->fn(m->arg, m->t, m->T);
    return NULL;
}

static void team_run(int T, team_fn fn, void *arg) {
    team_member m[256];
    if (T > 256) T = 256;
    if (T < 1) T = 1;
    int started = 1;
    for (int t = 1; t < T; ++t) {
        m[t] = (team_member){fn, arg, t, T, 0};
        if (pthread_create(&m[t].tid, NULL, team_member_main, &m[t]) != 0) break;
        started = t + 1;
    }
    fn(arg, 0, T);
    for (int t = 1; t < started; ++t) pthread_join(m[t].tid, NULL);
    for (int t = started; t < T; ++t) fn(arg, t, T);
}

/* One pass of the probe's read loop by T threads, each over its slice of buf (granules of
 * READ_GRANULE floats); returns the wall seconds and adds to *rate_sum each thread's slice bytes
 * over its own CPU time. */
#define READ_GRANULE (16 * 64) /* floats: whole probe iterations at every width */
typedef struct read_pass_arg {
    const kva_ceiling_probe *probe;
    const float *buf;
    size_t granules;
    float partial[256];
    double rate[256];
} read_pass_arg;

static void read_slice(void *arg, int t, int T) {
    read_pass_arg *a = (read_pass_arg *)arg;
    size_t lo = a->granules * (size_t)t / (size_t)T * READ_GRANULE;
    size_t hi = a->granules * (size_t)(t + 1) / (size_t)T * READ_GRANULE;
    double c0 = thread_cpu_seconds();
    a->partial[t & 255] = a->probe->read(a->buf + lo, hi - lo);
    double c = thread_cpu_seconds() - c0;
    a->rate[t & 255] = c > 0 ? (double)((hi - lo) * sizeof(float)) / c : 0;
}

static double read_pass(const kva_ceiling_probe *probe, const float *buf, size_t granules, int T,
                        double *rate_sum) {
    read_pass_arg a = {probe, buf, granules, {0}, {0}};
    double t0 = cli_now();
    team_run(T, read_slice, &a);
    double dt = cli_now() - t0;
    volatile float sink = 0;
    for (int t = 0; t < T && t < 256; ++t) {
        sink += a.partial[t];
        *rate_sum += a.rate[t];
    }
    (void)sink;
    return dt;
}

static void first_touch_slice(void *arg, int t, int T) {
    read_pass_arg *a = (read_pass_arg *)arg;
    float *buf = (float *)a->buf;
    size_t lo = a->granules * (size_t)t / (size_t)T * READ_GRANULE;
    size_t hi = a->granules * (size_t)(t + 1) / (size_t)T * READ_GRANULE;
    for (size_t i = lo; i < hi; ++i) buf[i] = (float)(i & 255) * 0.25f;
}

/* Every thread sums its contiguous slice of a buffer with the probe's loop; GB/s of the fastest
 * pass. A ceiling is what the machine can do: other work on the cores only ever lowers a pass,
 * so the best pass is the estimate (a median ceiling under load let kernels "exceed" it).
 * *per_core_sum gets the best pass's sum over threads of slice bytes / that thread's own CPU
 * time: when another job holds a core the threads do not stream at the same time and the wall
 * figure drops to one core's rate (seen on the 2-vCPU Zen 5: 35-40 vs 78 GB/s); the sum is what
 * the cores stream while they run (an upper estimate if they contend for memory). */
static double measure_read_bandwidth(bench_state *b, const kva_ceiling_probe *probe, size_t bytes,
                                     int reps, double *per_core_sum) {
    const size_t chunk = READ_GRANULE;
    const size_t n = bytes / sizeof(float) / chunk * chunk;
    float *buf = alloc_big(b, n * sizeof(float));
    if (!buf) return 0;
    const int T = b->threads;
    const size_t granules = n / chunk;
    /* First touch by the thread that will read it (page placement, and no zero pages). */
    read_pass_arg a = {probe, buf, granules, {0}, {0}};
    team_run(T, first_touch_slice, &a);
    double times[64];
    if (reps > 64) reps = 64;
    *per_core_sum = 0;
    for (int r = 0; r <= reps; ++r) {
        double sum = 0, dt = read_pass(probe, buf, granules, T, &sum);
        if (r > 0) times[r - 1] = dt; /* pass 0 warms up */
        if (r > 0 && sum / 1e9 > *per_core_sum) *per_core_sum = sum / 1e9;
    }
    free_big(b, buf);
    return (double)(n * sizeof(float)) / min_of(times, reps) / 1e9;
}

typedef struct paged_arg {
    const kva_ceiling_probe *probe;
    float *buf;
    const uint32_t *order;
    size_t pages, page_floats, slice;
    float partial[256];
} paged_arg;

static void paged_first_touch(void *arg, int t, int T) {
    paged_arg *a = (paged_arg *)arg;
    for (size_t i = a->pages * (size_t)t / (size_t)T; i < a->pages * (size_t)(t + 1) / (size_t)T; ++i)
        for (size_t e = 0; e < a->page_floats; ++e)
            a->buf[(size_t)a->order[i] * a->page_floats + e] = (float)(e & 255) * 0.25f;
}

static void paged_read_slice(void *arg, int t, int T) {
    paged_arg *a = (paged_arg *)arg;
    const size_t page_floats = a->page_floats, slice = a->slice;
    size_t lo = a->pages * (size_t)t / (size_t)T, hi = a->pages * (size_t)(t + 1) / (size_t)T;
    float acc = 0;
    for (size_t i = lo; i < hi; ++i) {
        const float *page = a->buf + (size_t)a->order[i] * page_floats;
        const char *next = i + 1 < hi ? (const char *)(a->buf + (size_t)a->order[i + 1] * page_floats) : NULL;
        for (size_t q = 0; q < 8; ++q) {
            if (next)
                for (size_t line = 0; line < slice * sizeof(float); line += 64)
                    __builtin_prefetch(next + q * slice * sizeof(float) + line, 0, 2);
            acc += a->probe->read(page + q * slice, slice);
        }
    }
    a->partial[t & 255] = acc;
}

/* Decode's access pattern without its arithmetic: the threads read a buffer as pages of one
 * decode page's K bytes (page 16 x 8 KV heads x d 128 x 2 bytes = 32 KB) in a shuffled order,
 * each page with the probe's loop, prefetching every line of the next page in 8 slices between
 * the loads (as decode spreads its prefetches over its tiles). It says how much of the gap to the
 * streaming read is the access pattern itself; where it reads faster than the streaming loops
 * (their width's loads without software prefetches: the AVX2 probe on an Emerald Rapids guest,
 * 24.6 GB/s against 27.9 paged, 2026-11-24) it is itself the read ceiling, since a ceiling a
 * read of the same bytes exceeds is not one. Wall time, best pass. */
#define PAGED_READ_BYTES ((size_t)BENCH_PAGE * BENCH_KV_HEADS * BENCH_HEAD_DIM * 2)
static double measure_paged_read(bench_state *b, const kva_ceiling_probe *probe, size_t bytes,
                                 int reps) {
    const size_t page_floats = PAGED_READ_BYTES / sizeof(float), slice = page_floats / 8;
    const size_t pages = bytes / PAGED_READ_BYTES;
    float *buf = alloc_big(b, pages * PAGED_READ_BYTES);
    uint32_t *order = malloc(sizeof(uint32_t) * pages);
    if (!buf || !order || pages < 2) {
        free_big(b, buf);
        free(order);
        return 0;
    }
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < pages; ++i) order[i] = (uint32_t)i;
    for (size_t i = pages - 1; i > 0; --i) { /* Fisher-Yates, xorshift */
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        size_t j = (size_t)(s % (i + 1));
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    const int T = b->threads;
    paged_arg a = {probe, buf, order, pages, page_floats, slice, {0}};
    team_run(T, paged_first_touch, &a);
    double best = 0;
    volatile float sink = 0;
    for (int r = 0; r <= reps; ++r) {
        double t0 = cli_now();
        team_run(T, paged_read_slice, &a);
        double dt = cli_now() - t0;
        for (int t = 0; t < T && t < 256; ++t) sink += a.partial[t];
        if (r > 0 && (double)(pages * PAGED_READ_BYTES) / dt / 1e9 > best)
            best = (double)(pages * PAGED_READ_BYTES) / dt / 1e9; /* pass 0 warms up */
    }
    (void)sink;
    free(order);
    free_big(b, buf);
    return best;
}

/* Seconds this thread has run on a core. */
static double thread_cpu_seconds(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct fma_arg {
    const kva_ceiling_probe *probe;
    int chains;
    long iters;
    double flops;
    float partial[256];
    double rate[256];
} fma_arg;

static void fma_chains(void *arg, int t, int T) {
    (void)T;
    fma_arg *a = (fma_arg *)arg;
    double c0 = thread_cpu_seconds();
    a->partial[t & 255] = a->probe->fma(a->iters, 1.0f + 0.001f * (float)t, a->chains);
    double c = thread_cpu_seconds() - c0;
    a->rate[t & 255] = c > 0 ? a->flops / c : 0;
}

/* All threads run `chains` independent FMA chains of the probe's width. The rate is the sum of
 * each thread's FLOPs over the CPU time that thread actually ran (not wall time): a compute
 * ceiling is what the cores do while they run, and on a shared machine a thread that loses its
 * core for a while would otherwise halve the "ceiling" (measured: AVX2 at 2 threads read 121
 * GFLOP/s, the 1-core figure, whenever another job held a core). Best of the repetitions. */
static double measure_fma_rate(bench_state *b, const kva_ceiling_probe *probe, int chains,
                               long iters, int reps) {
    const int T = b->threads;
    const double flops = 2.0 * probe->lanes * chains * (double)iters;
    double best = 0;
    volatile float sink = 0;
    fma_arg a = {probe, chains, iters, flops, {0}, {0}};
    for (int r = 0; r <= reps; ++r) {
        team_run(T, fma_chains, &a);
        double sum = 0;
        for (int t = 0; t < T && t < 256; ++t) {
            sink += a.partial[t];
            sum += a.rate[t];
        }
        if (r > 0 && sum > best) best = sum; /* repetition 0 warms up */
    }
    (void)sink;
    return best / 1e9;
}

/* ------------------------------------------------------------------------------------------ */
/* Inputs                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Random finite half-precision values of magnitude about 2^-7 .. 1, generated in parallel
 * straight as bit patterns (a gigabyte in well under a second). */
typedef struct fill_arg {
    uint16_t *p;
    size_t n;
    kva_dtype dtype;
    uint64_t seed;
} fill_arg;

static void fill_slice(void *arg, int t, int T) {
    const fill_arg *a = (const fill_arg *)arg;
    uint16_t *p = a->p;
    size_t lo = a->n * (size_t)t / (size_t)T, hi = a->n * (size_t)(t + 1) / (size_t)T;
    uint64_t s = (a->seed + (uint64_t)t) * 0x9E3779B97F4A7C15ull | 1;
    for (size_t i = lo; i < hi; ++i) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        uint64_t r = s * 0x2545F4914F6CDD1Dull;
        uint16_t sign = (uint16_t)((r >> 63) << 15);
        uint16_t e = (uint16_t)((r >> 32) & 7);
        if (a->dtype == KVA_BF16)
            p[i] = (uint16_t)(sign | (uint16_t)((120 + e) << 7) | (uint16_t)(r & 0x7f));
        else
            p[i] = (uint16_t)(sign | (uint16_t)((8 + e) << 10) | (uint16_t)(r & 0x3ff));
    }
}

static void fill_half_random(void *data, size_t n, kva_dtype dtype, uint64_t seed, int threads) {
    fill_arg a = {(uint16_t *)data, n, dtype, seed};
    team_run(threads, fill_slice, &a);
}

static kva_status alloc_workspace(kva_context *ctx, const kva_plan_limits *l, int decode,
                                  kva_workspace *ws) {
    size_t dev, host;
    kva_status st = decode ? kva_decode_workspace_size(ctx, l, &dev, &host)
                           : kva_prefill_workspace_size(ctx, l, &dev, &host);
    if (st != KVA_OK) return st;
    ws->device_bytes = dev;
    ws->host_bytes = host;
    if ((st = kva_malloc(ctx, dev, &ws->device)) != KVA_OK) return st;
    return kva_host_alloc(ctx, host, &ws->host);
}

static void free_workspace(kva_context *ctx, kva_workspace *ws) {
    kva_free(ctx, ws->device);
    kva_host_free(ctx, ws->host);
    ws->device = ws->host = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Decode                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* One pool of shuffled pages, big enough that rotating page tables over it defeats the LLC. */
typedef struct decode_pool {
    kva_dtype dtype;
    int32_t num_pages;
    void *k, *v;
    int32_t *perm;         /* physical page order: a random permutation */
} decode_pool;

static int pool_create(bench_state *b, decode_pool *p, kva_dtype dtype, size_t kv_bytes) {
    const size_t es = kva_dtype_size(dtype);
    const size_t page_elems = (size_t)BENCH_PAGE * BENCH_KV_HEADS * BENCH_HEAD_DIM;
    p->dtype = dtype;
    p->num_pages = (int32_t)(kv_bytes / (2 * page_elems * es));
    p->k = alloc_big(b, (size_t)p->num_pages * page_elems * es);
    p->v = alloc_big(b, (size_t)p->num_pages * page_elems * es);
    p->perm = malloc(sizeof(int32_t) * (size_t)p->num_pages);
    if (!p->k || !p->v || !p->perm) return -1;
    fill_half_random(p->k, (size_t)p->num_pages * page_elems, dtype, 11, b->threads);
    fill_half_random(p->v, (size_t)p->num_pages * page_elems, dtype, 12, b->threads);
    uint64_t s = 0x1234567;
    for (int32_t i = 0; i < p->num_pages; ++i) p->perm[i] = i;
    for (int32_t i = p->num_pages - 1; i > 0; --i) {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        int32_t j = (int32_t)((s * 0x2545F4914F6CDD1Dull) % (uint64_t)(i + 1));
        int32_t t = p->perm[i]; p->perm[i] = p->perm[j]; p->perm[j] = t;
    }
    return 0;
}

static void pool_destroy(bench_state *b, decode_pool *p) {
    free_big(b, p->k);
    free_big(b, p->v);
    free(p->perm);
    memset(p, 0, sizeof *p);
}

/* One wall-time pass of the streaming read over pair_buf by all threads, GB/s. Run between
 * blocks of decode runs: on a machine whose memory is shared with other guests the read rate
 * moves by 2x within seconds (measured on the 2-vCPU Zen 5: 45 <-> 80 GB/s), so a ceiling taken
 * at the start of the bench and a decode row taken a minute later may see different machines;
 * a read measured next to the decode runs sees the same one. */
static double pair_read_pass(bench_state *b) {
    const size_t granules = b->pair_floats / READ_GRANULE;
    double unused = 0, dt = read_pass(b->probe, b->pair_buf, granules, b->threads, &unused);
    return (double)(granules * READ_GRANULE * sizeof(float)) / dt / 1e9;
}

/* Bytes of K and V one decode call reads. */
static double decode_bytes(kva_dtype dtype, int32_t batch, int32_t kv_len) {
    return 2.0 * batch * kv_len * BENCH_KV_HEADS * BENCH_HEAD_DIM * (double)kva_dtype_size(dtype);
}

/* Times batch x kv_len decode over the pool, rotating among as many disjoint batches as the
 * pool holds. Returns median seconds, or a negative value on failure. */
static double time_decode(bench_state *b, const decode_pool *pool, int32_t batch, int32_t kv_len,
                          kva_decode_algo algo, int *num_sets_out, double *best,
                          double *cpu_share, double *paired_fraction) {
    const int32_t ppr = (kv_len + BENCH_PAGE - 1) / BENCH_PAGE; /* pages per request */
    const int32_t sets = pool->num_pages / (batch * ppr);
    const size_t es = kva_dtype_size(pool->dtype);
    double result = -1;
    *num_sets_out = sets;
    if (sets < 1) return -1;
    kva_kv_pages pages = kva_kv_pages_separate(pool->k, pool->v, pool->dtype, pool->num_pages,
                                               BENCH_PAGE, BENCH_KV_HEADS, BENCH_HEAD_DIM,
                                               KVA_LAYOUT_NHD);
    kva_plan_limits l = {0};
    l.max_batch = batch;
    l.max_total_pages = (int64_t)batch * ppr;
    l.max_total_kv = (int64_t)batch * kv_len;
    l.num_qo_heads = BENCH_HEADS;
    l.num_kv_heads = BENCH_KV_HEADS;
    l.head_dim = BENCH_HEAD_DIM;
    l.page_size = BENCH_PAGE;
    kva_workspace ws = {0};
    int32_t *indptr = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int32_t *last = malloc(sizeof(int32_t) * (size_t)batch);
    size_t qbytes = (size_t)batch * BENCH_HEADS * BENCH_HEAD_DIM * es;
    void *q = alloc_big(b, qbytes), *o = alloc_big(b, qbytes);
    double *times = malloc(sizeof(double) * 4096);
    if (!indptr || !last || !q || !o || !times || alloc_workspace(b->ctx, &l, 1, &ws) != KVA_OK)
        goto done;
    fill_half_random(q, qbytes / 2, pool->dtype, 13, 1);
    for (int32_t r = 0; r <= batch; ++r) indptr[r] = r * ppr;
    for (int32_t r = 0; r < batch; ++r) last[r] = kv_len - (ppr - 1) * BENCH_PAGE;
    kva_attn_params params = kva_attn_params_default(BENCH_HEADS, BENCH_KV_HEADS, BENCH_HEAD_DIM);
    kva_tensor qt = kva_tensor_nhd(q, pool->dtype, BENCH_HEADS, BENCH_HEAD_DIM);
    kva_tensor ot = kva_tensor_nhd(o, pool->dtype, BENCH_HEADS, BENCH_HEAD_DIM);
    kva_plan_options opt = {0, 0, algo};

    /* Run at least one pass over every set, and at least min_seconds, after one warm-up set.
     * Every ~25 ms of decode a streaming-read pass (untimed for decode) closes a block; each
     * block's median decode time is paired with the mean read rate of the passes on either side
     * of it, and the median of those ratios is the same-moment fraction of the read rate. */
    const double min_seconds = b->quick ? 0.3 : 1.0;
    enum { MAX_BLOCKS = 256 };
    double block_read[MAX_BLOCKS + 1], block_ratio[MAX_BLOCKS];
    int block_start[MAX_BLOCKS + 1], blocks = 0;
    double block_time = 0;
    const double bytes = decode_bytes(pool->dtype, batch, kv_len);
    if (b->pair_buf) block_read[0] = pair_read_pass(b);
    block_start[0] = 0;
    int count = 0;
    double start = cli_now(), cpu0 = cpu_seconds(), paused = 0;
    for (int it = -1; it < 4096; ++it) {
        int set = (it + 1) % sets;
        kva_page_table table = {batch, indptr, pool->perm + (size_t)set * batch * ppr, last};
        kva_plan plan;
        if (kva_decode_plan(b->ctx, &l, &table, pool->num_pages, &opt, ws, &plan) != KVA_OK)
            goto done;
        double t0 = cli_now();
        if (kva_decode_run(b->ctx, &plan, &params, qt, &pages, ot, NULL) != KVA_OK) goto done;
        double dt = cli_now() - t0;
        if (it >= 0) {
            times[count++] = dt;
            block_time += dt;
        }
        const int last_run = count >= sets && cli_now() - start - paused >= min_seconds;
        if (b->pair_buf && blocks < MAX_BLOCKS && count > block_start[blocks] &&
            (block_time >= 0.025 || last_run)) {
            double p0 = cli_now();
            block_read[blocks + 1] = pair_read_pass(b);
            paused += cli_now() - p0;
            double t_block = cli_median(times + block_start[blocks], count - block_start[blocks]);
            block_ratio[blocks] = bytes / t_block / 1e9 /
                                  (0.5 * (block_read[blocks] + block_read[blocks + 1]));
            block_start[++blocks] = count;
            block_time = 0;
        }
        if (last_run) break;
    }
    result = cli_median(times, count);
    /* CPU share over the decode runs only (the read passes run at full share) */
    *cpu_share = (cpu_seconds() - cpu0 - paused * b->threads) / ((cli_now() - start - paused) * b->threads);
    *best = min_of(times, count);
    *paired_fraction = blocks > 0 ? cli_median(block_ratio, blocks) : 0;
done:
    if (result < 0) fprintf(stderr, "  decode %dx%d failed: %s\n", batch, kv_len, kva_last_error());
    free_workspace(b->ctx, &ws);
    free(indptr);
    free(last);
    free_big(b, q);
    free_big(b, o);
    free(times);
    return result;
}

static void bench_decode(bench_state *b, const decode_pool *pool, int32_t batch, int32_t kv_len,
                         kva_decode_algo algo, const char *label) {
    int sets;
    double best = 0, share = 0, paired = 0;
    double t = time_decode(b, pool, batch, kv_len, algo, &sets, &best, &share, &paired);
    if (t <= 0) return;
    const double bytes = decode_bytes(pool->dtype, batch, kv_len);
    bench_row r;
    memset(&r, 0, sizeof r);
    snprintf(r.op, sizeof r.op, "%s", label);
    snprintf(r.dtype, sizeof r.dtype, "%s", kva_dtype_name(pool->dtype));
    snprintf(r.shape, sizeof r.shape, "%dx%d", batch, kv_len);
    r.ms = t * 1e3;
    r.best_ms = best * 1e3;
    r.rate = bytes / t / 1e9;
    r.unit = "GB/s";
    r.fraction = b->read_gbs > 0 ? r.rate / b->read_gbs : 0;
    r.cpu_share = share;
    /* (the reads beside are streaming passes: in units of the ceiling where the paged read is it) */
    r.paired = b->read_gbs > 0 && b->stream_gbs > 0 ? paired * b->stream_gbs / b->read_gbs : paired;
    printf("  %-24s %-5s %-8s %9.3f ms (best %8.3f) %8.2f GB/s  %5.1f%% of read bw (%5.1f%% of the "
           "read beside it, %5.1f%% of the paged read)  (%d batches rotated, cpu %.0f%%)\n", r.op,
           r.dtype, r.shape, r.ms, r.best_ms, r.rate, 100 * r.fraction, 100 * r.paired,
           b->paged_read_gbs > 0 ? 100 * r.rate / b->paged_read_gbs : 0.0, sets, 100 * share);
    fflush(stdout);
    add_row(b, &r);
}

/* ------------------------------------------------------------------------------------------ */
/* Prefill                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static void bench_prefill(bench_state *b, kva_dtype dtype, int32_t n, int reps) {
    const size_t es = kva_dtype_size(dtype);
    const size_t qbytes = (size_t)n * BENCH_HEADS * BENCH_HEAD_DIM * es;
    const size_t kbytes = (size_t)n * BENCH_KV_HEADS * BENCH_HEAD_DIM * es;
    void *q = alloc_big(b, qbytes), *o = alloc_big(b, qbytes), *k = alloc_big(b, kbytes),
         *v = alloc_big(b, kbytes);
    kva_workspace ws = {0};
    kva_plan_limits l = {0};
    l.max_batch = 1;
    l.max_total_qo = n;
    l.max_total_kv = n;
    l.num_qo_heads = BENCH_HEADS;
    l.num_kv_heads = BENCH_KV_HEADS;
    l.head_dim = BENCH_HEAD_DIM;
    l.page_size = BENCH_PAGE;
    int32_t indptr[2] = {0, n};
    double times[64];
    int count = 0;
    kva_plan plan;
    if (!q || !o || !k || !v || alloc_workspace(b->ctx, &l, 0, &ws) != KVA_OK ||
        kva_prefill_plan(b->ctx, &l, 1, indptr, indptr, NULL, 0, NULL, ws, &plan) != KVA_OK)
        goto done;
    fill_half_random(q, qbytes / 2, dtype, 21, b->threads);
    fill_half_random(k, kbytes / 2, dtype, 22, b->threads);
    fill_half_random(v, kbytes / 2, dtype, 23, b->threads);
    kva_attn_params params = kva_attn_params_default(BENCH_HEADS, BENCH_KV_HEADS, BENCH_HEAD_DIM);
    params.causal = 1;
    if (reps > 64) reps = 64;
    double wall0 = 0, cpu0 = 0;
    for (int r = 0; r <= reps; ++r) {
        if (r == 1) {
            wall0 = cli_now();
            cpu0 = cpu_seconds();
        }
        double t0 = cli_now();
        kva_status st = kva_prefill_run_ragged(
            b->ctx, &plan, &params, kva_tensor_nhd(q, dtype, BENCH_HEADS, BENCH_HEAD_DIM),
            kva_tensor_nhd(k, dtype, BENCH_KV_HEADS, BENCH_HEAD_DIM),
            kva_tensor_nhd(v, dtype, BENCH_KV_HEADS, BENCH_HEAD_DIM),
            kva_tensor_nhd(o, dtype, BENCH_HEADS, BENCH_HEAD_DIM), NULL);
        if (st != KVA_OK) {
            count = 0;
            break;
        }
        if (r > 0) times[count++] = cli_now() - t0;
    }
done:
    if (count == 0) {
        fprintf(stderr, "  prefill %d failed: %s\n", n, kva_last_error());
    } else {
        double t = cli_median(times, count);
        double share = (cpu_seconds() - cpu0) / ((cli_now() - wall0) * b->threads);
        double flops = 4.0 * n * (double)n * BENCH_HEAD_DIM * BENCH_HEADS / 2; /* causal: half */
        bench_row r;
        memset(&r, 0, sizeof r);
        snprintf(r.op, sizeof r.op, "prefill causal (ragged)");
        snprintf(r.dtype, sizeof r.dtype, "%s", kva_dtype_name(dtype));
        snprintf(r.shape, sizeof r.shape, "1x%d", n);
        r.ms = t * 1e3;
        r.best_ms = min_of(times, count) * 1e3;
        r.rate = flops / t / 1e9;
        r.unit = "GFLOP/s";
        r.fraction = b->fma_gflops > 0 ? r.rate / b->fma_gflops : 0;
        r.cpu_share = share;
        printf("  %-24s %-5s %-8s %9.3f ms (best %8.3f) %8.1f GFLOP/s  %5.1f%% of FMA rate  "
               "(cpu %.0f%%)\n", r.op, r.dtype, r.shape, r.ms, r.best_ms, r.rate, 100 * r.fraction,
               100 * share);
        fflush(stdout);
        add_row(b, &r);
    }
    free_workspace(b->ctx, &ws);
    free_big(b, q);
    free_big(b, o);
    free_big(b, k);
    free_big(b, v);
}

/* ------------------------------------------------------------------------------------------ */
/* Driver                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static void print_table(const bench_state *b) {
    printf("\n| operation | dtype | shape | median ms | best ms | throughput (median) | of ceiling "
           "| of the read beside it | cpu |\n");
    printf("|---|---|---|---:|---:|---:|---:|---:|---:|\n");
    printf("| read bandwidth (ceiling) | - | %.0f MB | - | - | %.1f GB/s | 100%% | | |\n",
           (double)b->read_bytes / 1e6, b->read_gbs);
    if (b->paged_read_gbs > 0)
        printf("| read, shuffled %zu KB pages (cross-check) | - | %.0f MB | - | - | %.1f GB/s | "
               "%.1f%% | | |\n", PAGED_READ_BYTES / 1024, (double)b->read_bytes / 1e6,
               b->paged_read_gbs, b->read_gbs > 0 ? 100 * b->paged_read_gbs / b->read_gbs : 0.0);
    printf("| fp32 FMA rate (ceiling) | - | - | - | - | %.0f GFLOP/s | 100%% | | |\n", b->fma_gflops);
    for (int i = 0; i < b->num_rows; ++i) {
        const bench_row *r = &b->rows[i];
        char paired[16] = "";
        if (r->paired > 0) snprintf(paired, sizeof paired, "%.1f%%", 100 * r->paired);
        printf("| %s | %s | %s | %.3f | %.3f | %.*f %s | %.1f%% | %s | %.0f%% |\n", r->op, r->dtype,
               r->shape, r->ms, r->best_ms, strcmp(r->unit, "GB/s") == 0 ? 2 : 1, r->rate, r->unit,
               100 * r->fraction, paired, 100 * r->cpu_share);
    }
}

/* 1-minute load average (0 if unknown). */
static double load_average(void) {
    double load = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1) load = 0;
        fclose(f);
    }
    return load;
}

int bench_cpu_main(kva_context *ctx, const bench_cpu_options *options) {
    bench_state b;
    memset(&b, 0, sizeof b);
    b.ctx = ctx;
    b.threads = kva_context_threads(ctx);
    b.quick = options->quick;
    b.llc = cli_llc_bytes();
    kva_device_info info;
    kva_context_info(ctx, &info);

    /* Decode pools: >= 4x LLC always; full runs also >= 1 GB. */
    size_t pool_bytes = 4 * (b.llc ? b.llc : (size_t)32 << 20);
    if (!b.quick && pool_bytes < ((size_t)1 << 30)) pool_bytes = (size_t)1 << 30;
    size_t read_bytes = b.quick ? pool_bytes : ((size_t)1 << 30);
    if (read_bytes < pool_bytes) read_bytes = pool_bytes;

    const char *variant = kva_cpu_variant(ctx);
    const kva_ceiling_probe *probe = probe_named(variant);
    printf("kvattn bench (CPU): %s, kernel variant %s (%d-lane f32 vectors), %d threads, "
           "last-level cache %.0f MB%s\n", info.name, variant ? variant : "?", probe->lanes,
           b.threads, (double)b.llc / (1 << 20), b.quick ? ", quick" : "");
    double load = load_average();
    if (load > 0.5)
        printf("note: 1-minute load average %.1f before starting: other work shares these cores, "
               "so every figure below (ceilings included) is lower and noisier than on an idle "
               "machine\n", load);
    printf("\nceilings (probes compiled like the %s kernels)\n", probe->name);
    b.read_bytes = read_bytes;
    /* Cross-checks: the read ceiling is measured at the kernels' width and at the narrowest
     * (generic) width, the FMA ceiling with 8, 12 and (with 32 registers) 16 chains; each
     * ceiling is the best of its probes, and probes that disagree are reported. */
    const kva_ceiling_probe *narrow = &kva_probe_generic_ceiling;
    double cores_native = 0, cores_narrow = 0;
    double read_native = measure_read_bandwidth(&b, probe, read_bytes, b.quick ? 3 : 7,
                                                &cores_native);
    double read_narrow = read_native;
    if (probe != narrow)
        read_narrow = measure_read_bandwidth(&b, narrow, read_bytes, b.quick ? 3 : 5, &cores_narrow);
    b.read_gbs = read_native > read_narrow ? read_native : read_narrow;
    if (cores_native > b.read_gbs) b.read_gbs = cores_native;
    printf("  read bandwidth   %8.2f GB/s   (%d threads summing %.0f MB, best pass; wall: %d-lane "
           "loads %.2f, %d-lane %.2f; sum of the threads' own rates %.2f)\n", b.read_gbs,
           b.threads, (double)read_bytes / 1e6, probe->lanes, read_native, narrow->lanes,
           read_narrow, cores_native);
    if (read_narrow > 1.05 * read_native)
        printf("  warning: narrower loads read faster than the kernels' width: check the probe\n");
    b.paged_read_gbs = measure_paged_read(&b, probe, read_bytes, b.quick ? 3 : 5);
    b.stream_gbs = b.read_gbs;
    if (b.paged_read_gbs > b.read_gbs) {
        b.read_gbs = b.paged_read_gbs;
        printf("  read ceiling     %8.2f GB/s   the shuffled-page read below outran the streaming "
               "loops (%.2f): it is the ceiling; the reads beside decode rows are scaled by the same "
               "ratio\n", b.read_gbs, b.stream_gbs);
    }
    b.probe = probe;
    {   /* the buffer read between decode runs: >= 4x the LLC, so every pass streams from DRAM */
        size_t pair_bytes = 4 * (b.llc ? b.llc : (size_t)32 << 20);
        if (pair_bytes < ((size_t)256 << 20)) pair_bytes = (size_t)256 << 20;
        b.pair_floats = pair_bytes / sizeof(float) / READ_GRANULE * READ_GRANULE;
        b.pair_buf = alloc_big(&b, b.pair_floats * sizeof(float));
        if (b.pair_buf)
            for (size_t i = 0; i < b.pair_floats; ++i) b.pair_buf[i] = (float)(i & 255) * 0.25f;
    }
    printf("  (cross-check)    %8.2f GB/s   the same read as shuffled %zu KB pages, each page's "
           "lines prefetched a page ahead: decode's access pattern without its arithmetic, %.0f%% "
           "of the streaming read\n", b.paged_read_gbs, PAGED_READ_BYTES / 1024,
           b.stream_gbs > 0 ? 100 * b.paged_read_gbs / b.stream_gbs : 0.0);
    fflush(stdout);
    const long iters = b.quick ? 20000000L : 40000000L; /* >= ~40 ms of CPU per repetition */
    double fma_by_chains[3] = {0, 0, 0};
    const int chain_counts[3] = {8, 12, 16};
    for (int c = 0; c < 3; ++c) {
        if (chain_counts[c] > probe->max_chains) continue;
        fma_by_chains[c] = measure_fma_rate(&b, probe, chain_counts[c], iters, b.quick ? 3 : 9);
        if (fma_by_chains[c] > b.fma_gflops) b.fma_gflops = fma_by_chains[c];
    }
    printf("  fp32 FMA rate    %8.1f GFLOP/s (%d threads, %d-lane FMAs, per-thread CPU time, best "
           "rep; 8 / 12 / 16 chains: %.1f / %.1f / %.1f)\n", b.fma_gflops, b.threads, probe->lanes,
           fma_by_chains[0], fma_by_chains[1], fma_by_chains[2]);
    if (fma_by_chains[1] > 1.1 * fma_by_chains[0] || fma_by_chains[2] > 1.1 * fma_by_chains[1])
        printf("  note: more chains kept raising the FMA rate: latency still shows at fewer\n");
    fflush(stdout);

    const kva_dtype dtypes[2] = {KVA_BF16, KVA_F16};
    printf("\ndecode: %d q / %d kv heads, d %d, page %d, K/V pool %.0f MB per dtype (%.1fx LLC)\n",
           BENCH_HEADS, BENCH_KV_HEADS, BENCH_HEAD_DIM, BENCH_PAGE, (double)pool_bytes / 1e6,
           b.llc ? (double)pool_bytes / (double)b.llc : 0.0);
    for (int d = 0; d < 2; ++d) {
        decode_pool pool;
        memset(&pool, 0, sizeof pool);
        if (pool_create(&b, &pool, dtypes[d], pool_bytes) != 0) {
            fprintf(stderr, "  cannot allocate a %.0f MB pool\n", (double)pool_bytes / 1e6);
            pool_destroy(&b, &pool);
            return 2;
        }
        bench_decode(&b, &pool, 1, 4096, KVA_DECODE_PARTIAL_ROWMAX, "decode");
        bench_decode(&b, &pool, 8, 4096, KVA_DECODE_PARTIAL_ROWMAX, "decode");
        if (dtypes[d] == KVA_BF16) {
            printf("decode algorithms (bf16): partial rowmax (merge by LSE) vs global rowmax "
                   "(two passes)\n");
            bench_decode(&b, &pool, 1, 4096, KVA_DECODE_PARTIAL_ROWMAX, "decode partial-rowmax");
            bench_decode(&b, &pool, 1, 4096, KVA_DECODE_GLOBAL_ROWMAX, "decode global-rowmax");
            bench_decode(&b, &pool, 32, 512, KVA_DECODE_PARTIAL_ROWMAX, "decode partial-rowmax");
            bench_decode(&b, &pool, 32, 512, KVA_DECODE_GLOBAL_ROWMAX, "decode global-rowmax");
        }
        pool_destroy(&b, &pool);
    }

    printf("\nprefill: causal, one sequence, %d q / %d kv heads, d %d\n", BENCH_HEADS,
           BENCH_KV_HEADS, BENCH_HEAD_DIM);
    for (int d = 0; d < 2; ++d) {
        bench_prefill(&b, dtypes[d], 512, b.quick ? 2 : 7);
        bench_prefill(&b, dtypes[d], 2048, b.quick ? 1 : 3);
    }
    free_big(&b, b.pair_buf);
    b.pair_buf = NULL;
    print_table(&b);
    /* A kernel cannot beat a true ceiling: if one does, the probe measured something else. */
    for (int i = 0; i < b.num_rows; ++i)
        if (b.rows[i].fraction > 1.0)
            printf("warning: %s %s %s reaches %.0f%% of its ceiling: the ceiling is wrong\n",
                   b.rows[i].op, b.rows[i].dtype, b.rows[i].shape, 100 * b.rows[i].fraction);
    return b.num_rows > 0 ? 0 : 1;
}
