/*
 * fa_peer.c -- times ggml's CPU flash attention (GGML_OP_FLASH_ATTN_EXT, the op llama.cpp runs)
 * on the shapes of `kvattn bench`, so the two can be compared in one window on one machine.
 * ggml is a peer here, never a dependency: build with bench/ggml_peer/build.sh, which fetches
 * ggml at a pinned commit into a temporary directory.
 *
 * Shapes (as bench/bench_cpu.c): 32 q / 8 kv heads, d = 128, scale 1/sqrt(d).
 *   - decode: q [d, 1, 32, batch] f32 (llama.cpp's q is f32), K/V f16 or bf16 in llama.cpp's
 *     cache layout: one contiguous cache per sequence (stream, ne3 = batch), rows of
 *     kv_heads x d per token (so a head's keys are 2 KB apart, like our NHD pages), a zero f16
 *     mask row as llama.cpp always passes one. Graphs over disjoint K/V sets rotate through a
 *     pool of >= 1 GB (>= 4x the last-level cache), so every timed run streams K/V from DRAM;
 *     reported as GB/s of K+V read. ggml's K/V is contiguous, ours is in shuffled 16-token pages.
 *   - prefill: one sequence of n tokens, causal f16 mask (0 / -inf), K/V [n, 8, d]; useful
 *     GFLOP/s = 4 * n * n * d * heads / 2 (causal counts half), as ours.
 * Each timed region is one ggml_graph_compute of a one-node graph on a persistent 2-thread ggml
 * threadpool (as llama.cpp computes); the figure is the median, with the fastest run and the CPU
 * share (process CPU time / (wall x threads)) beside it. One head of one run is checked against a
 * scalar reference first.
 *
 * Usage: fa_peer [--threads N] [--hugepages] [--only decode|prefill]
 *   --hugepages: the tensors' memory comes from mmap + MADV_HUGEPAGE (kva_malloc does this for
 *   our pools); by default it is plain memory, as ggml's CPU buffers are in llama.cpp.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include "ggml.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#define HEADS 32
#define KV_HEADS 8
#define HEAD_DIM 128
#define MAX_TIMES 4096

typedef struct peer {
    int threads;
    int hugepages;
    struct ggml_threadpool *pool;
} peer;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double cpu_s(void) {
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec +
           (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place; returns the median. */
static double median_sorted(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static size_t llc_bytes(void) {
    size_t best = 0;
    for (int idx = 0; idx < 8; ++idx) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        FILE *f = fopen(path, "r");
        if (!f) break;
        unsigned long v = 0;
        char unit = 0;
        if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
            size_t b = v * (unit == 'K' ? 1024UL : unit == 'M' ? 1048576UL : 1UL);
            if (b > best) best = b;
        }
        fclose(f);
    }
    return best;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static float rand_pm1(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Fills n elements of a tensor's memory of the given type with uniform values in [-1, 1). */
static void fill_random(void *data, enum ggml_type type, size_t n) {
    enum { CHUNK = 4096 };
    float tmp[CHUNK];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        for (size_t j = 0; j < m; ++j) tmp[j] = rand_pm1();
        if (type == GGML_TYPE_F32)
            memcpy((float *)data + i, tmp, m * sizeof(float));
        else if (type == GGML_TYPE_F16)
            ggml_fp32_to_fp16_row(tmp, (ggml_fp16_t *)data + i, (int64_t)m);
        else
            ggml_fp32_to_bf16_row(tmp, (ggml_bf16_t *)data + i, (int64_t)m);
    }
}

static float to_f32(const void *data, enum ggml_type type, size_t i) {
    if (type == GGML_TYPE_F16) return ggml_fp16_to_fp32(((const ggml_fp16_t *)data)[i]);
    return ggml_bf16_to_fp32(((const ggml_bf16_t *)data)[i]);
}

/* Scalar attention of one query row q[d] over keys/values 0..n-1 of one head, whose element e of
 * token t sits at k[t * row + e]. Returns the largest |out - ref|. */
static double check_row(const float *q, const void *k, const void *v, enum ggml_type type,
                        size_t row, int n, const float *out) {
    double *s = malloc(sizeof(double) * (size_t)n), ref[HEAD_DIM] = {0}, m = -INFINITY, l = 0;
    double err = INFINITY;
    if (!s) return err;
    for (int t = 0; t < n; ++t) {
        double acc = 0;
        for (int e = 0; e < HEAD_DIM; ++e) acc += (double)q[e] * to_f32(k, type, t * row + e);
        s[t] = acc / sqrt((double)HEAD_DIM);
        if (s[t] > m) m = s[t];
    }
    for (int t = 0; t < n; ++t) {
        double p = exp(s[t] - m);
        l += p;
        for (int e = 0; e < HEAD_DIM; ++e) ref[e] += p * to_f32(v, type, t * row + e);
    }
    err = 0;
    for (int e = 0; e < HEAD_DIM; ++e) {
        double d = fabs(ref[e] / l - out[e]);
        if (d > err) err = d;
    }
    free(s);
    return err;
}

/* The ggml context's memory: plain malloc (as llama.cpp's CPU buffers) or huge pages. */
static void *alloc_mem(const peer *p, size_t bytes) {
    if (!p->hugepages) return malloc(bytes);
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    madvise(m, bytes, MADV_HUGEPAGE);
    return m;
}

static void free_mem(const peer *p, void *m, size_t bytes) {
    if (!m) return;
    if (p->hugepages)
        munmap(m, bytes);
    else
        free(m);
}

/* Computes one graph on the threadpool; returns wall seconds, or -1 on failure. */
static double compute(const peer *p, struct ggml_cgraph *g, void *work, size_t work_size) {
    struct ggml_cplan plan = ggml_graph_plan(g, p->threads, p->pool);
    if (plan.work_size > work_size) return -1;
    plan.work_data = work;
    double t0 = now_s();
    if (ggml_graph_compute(g, &plan) != GGML_STATUS_SUCCESS) return -1;
    return now_s() - t0;
}

static void report(const char *op, enum ggml_type type, const char *shape, double *times,
                   int count, double work, const char *unit, double share, const char *extra) {
    double best = times[0];
    for (int i = 1; i < count; ++i)
        if (times[i] < best) best = times[i];
    double t = median_sorted(times, count);
    printf("  %-16s %-5s %-8s %9.3f ms (best %8.3f) %8.2f %s  (%d runs%s, cpu %.0f%%)\n", op,
           ggml_type_name(type), shape, t * 1e3, best * 1e3, work / t / 1e9, unit, count, extra,
           100 * share);
    fflush(stdout);
}

static int bench_decode(const peer *p, enum ggml_type type, int batch, int n_kv,
                        size_t pool_bytes) {
    const size_t es = ggml_type_size(type);
    const size_t row = (size_t)KV_HEADS * HEAD_DIM;   /* elements per token */
    const size_t set_elems = (size_t)batch * n_kv * row;
    int sets = (int)(pool_bytes / (2 * set_elems * es));
    if (sets < 1) sets = 1;
    if (sets > 512) sets = 512;
    const size_t q_elems = (size_t)batch * HEADS * HEAD_DIM;
    size_t mem = 2 * (size_t)sets * set_elems * es + q_elems * 4 * (size_t)(sets + 1) +
                 (size_t)n_kv * 2 + (size_t)(4 * sets + 8) * ggml_tensor_overhead() +
                 (size_t)sets * ggml_graph_overhead() + ((size_t)16 << 20);
    void *buf = alloc_mem(p, mem);
    if (!buf) return fprintf(stderr, "cannot allocate %.0f MB\n", mem / 1e6), 1;
    struct ggml_init_params ip = {mem, buf, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *kp = ggml_new_tensor_1d(ctx, type, (int64_t)(sets * set_elems));
    struct ggml_tensor *vp = ggml_new_tensor_1d(ctx, type, (int64_t)(sets * set_elems));
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, HEAD_DIM, 1, HEADS, batch);
    struct ggml_tensor *mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, 1, 1, 1);
    fill_random(kp->data, type, sets * set_elems);
    fill_random(vp->data, type, sets * set_elems);
    fill_random(q->data, GGML_TYPE_F32, q_elems);
    memset(mask->data, 0, ggml_nbytes(mask));

    struct ggml_cgraph **graphs = malloc(sizeof *graphs * (size_t)sets);
    struct ggml_tensor **outs = malloc(sizeof *outs * (size_t)sets);
    double *times = malloc(sizeof(double) * MAX_TIMES);
    size_t work_size = 0;
    for (int s = 0; s < sets; ++s) {
        /* llama.cpp's per-stream cache view: [d, n_kv, kv_heads, streams]. */
        size_t nb1 = row * es, nb2 = HEAD_DIM * es, nb3 = (size_t)n_kv * row * es;
        size_t off = (size_t)s * set_elems * es;
        struct ggml_tensor *k = ggml_view_4d(ctx, kp, HEAD_DIM, n_kv, KV_HEADS, batch, nb1, nb2,
                                             nb3, off);
        struct ggml_tensor *v = ggml_view_4d(ctx, vp, HEAD_DIM, n_kv, KV_HEADS, batch, nb1, nb2,
                                             nb3, off);
        outs[s] = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf(HEAD_DIM), 0.0f, 0.0f);
        ggml_flash_attn_ext_set_prec(outs[s], GGML_PREC_F32);
        graphs[s] = ggml_new_graph(ctx);
        ggml_build_forward_expand(graphs[s], outs[s]);
        struct ggml_cplan plan = ggml_graph_plan(graphs[s], p->threads, p->pool);
        if (plan.work_size > work_size) work_size = plan.work_size;
    }
    void *work = malloc(work_size + 64);

    /* Check: the last sequence, head 5 (kv head 1), of set 0. */
    double ok = compute(p, graphs[0], work, work_size);
    int b = batch - 1, h = 5, hk = h / (HEADS / KV_HEADS);
    size_t kv_off = (size_t)b * n_kv * row + (size_t)hk * HEAD_DIM;
    double err = ok < 0 ? INFINITY
                 : check_row((const float *)q->data + ((size_t)b * HEADS + h) * HEAD_DIM,
                             (const char *)kp->data + kv_off * es,
                             (const char *)vp->data + kv_off * es, type, row, n_kv,
                             (const float *)outs[0]->data + ((size_t)b * HEADS + h) * HEAD_DIM);

    /* One warm-up set, then at least one pass over every set and at least 1 s. */
    int count = 0;
    double start = now_s(), cpu0 = cpu_s();
    for (int it = -1; it < MAX_TIMES && ok >= 0; ++it) {
        double t = compute(p, graphs[(it + 1) % sets], work, work_size);
        if (t < 0) {
            count = 0;
            break;
        }
        if (it >= 0) times[count++] = t;
        if (count >= sets && now_s() - start >= 1.0) break;
    }
    double share = (cpu_s() - cpu0) / ((now_s() - start) * p->threads);
    char shape[24], extra[64];
    snprintf(shape, sizeof shape, "%dx%d", batch, n_kv);
    snprintf(extra, sizeof extra, ", %d sets rotated, check err %.1e", sets, err);
    int rc = 0;
    if (count == 0 || !(err < 1e-2)) {
        fprintf(stderr, "decode %s %s failed (check err %.3g)\n", ggml_type_name(type), shape, err);
        rc = 1;
    } else {
        report("decode", type, shape, times, count, 2.0 * (double)set_elems * es, "GB/s", share,
               extra);
    }
    free(work);
    free(times);
    free(outs);
    free(graphs);
    ggml_free(ctx);
    free_mem(p, buf, mem);
    return rc;
}

static int bench_prefill(const peer *p, enum ggml_type type, int n, int reps) {
    const size_t es = ggml_type_size(type);
    const size_t row = (size_t)KV_HEADS * HEAD_DIM;
    const size_t q_elems = (size_t)n * HEADS * HEAD_DIM;
    size_t mem = 2 * (size_t)n * row * es + 2 * q_elems * 4 + (size_t)n * n * 2 +
                 16 * ggml_tensor_overhead() + ggml_graph_overhead() + ((size_t)16 << 20);
    void *buf = alloc_mem(p, mem);
    if (!buf) return fprintf(stderr, "cannot allocate %.0f MB\n", mem / 1e6), 1;
    struct ggml_init_params ip = {mem, buf, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *kc = ggml_new_tensor_2d(ctx, type, (int64_t)row, n);
    struct ggml_tensor *vc = ggml_new_tensor_2d(ctx, type, (int64_t)row, n);
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, HEAD_DIM, n, HEADS, 1);
    struct ggml_tensor *mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n, n, 1, 1);
    fill_random(kc->data, type, (size_t)n * row);
    fill_random(vc->data, type, (size_t)n * row);
    fill_random(q->data, GGML_TYPE_F32, q_elems);
    ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
    ggml_fp16_t *mp = mask->data;
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) mp[(size_t)i * n + j] = j <= i ? zero : ninf;
    struct ggml_tensor *k = ggml_view_4d(ctx, kc, HEAD_DIM, n, KV_HEADS, 1, row * es,
                                         HEAD_DIM * es, (size_t)n * row * es, 0);
    struct ggml_tensor *v = ggml_view_4d(ctx, vc, HEAD_DIM, n, KV_HEADS, 1, row * es,
                                         HEAD_DIM * es, (size_t)n * row * es, 0);
    struct ggml_tensor *out = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf(HEAD_DIM),
                                                  0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
    struct ggml_cgraph *g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, out);
    struct ggml_cplan plan = ggml_graph_plan(g, p->threads, p->pool);
    size_t work_size = plan.work_size;
    void *work = malloc(work_size + 64);
    double times[64];
    if (reps > 64) reps = 64;

    /* The warm-up run is also checked: query row n/2 + 3 of head 5 sees keys 0..n/2 + 3. */
    double ok = compute(p, g, work, work_size);
    int i = n / 2 + 3, h = 5, hk = h / (HEADS / KV_HEADS);
    double err = ok < 0 ? INFINITY
                 : check_row((const float *)q->data + ((size_t)h * n + i) * HEAD_DIM,
                             (const char *)kc->data + (size_t)hk * HEAD_DIM * es,
                             (const char *)vc->data + (size_t)hk * HEAD_DIM * es, type, row, i + 1,
                             (const float *)out->data + ((size_t)i * HEADS + h) * HEAD_DIM);
    int count = 0;
    double start = now_s(), cpu0 = cpu_s();
    for (int r = 0; r < reps && ok >= 0; ++r) {
        double t = compute(p, g, work, work_size);
        if (t < 0) {
            count = 0;
            break;
        }
        times[count++] = t;
    }
    double share = (cpu_s() - cpu0) / ((now_s() - start) * p->threads);
    char shape[24], extra[48];
    snprintf(shape, sizeof shape, "1x%d", n);
    snprintf(extra, sizeof extra, ", check err %.1e", err);
    int rc = 0;
    if (count == 0 || !(err < 1e-2)) {
        fprintf(stderr, "prefill %s %s failed (check err %.3g)\n", ggml_type_name(type), shape,
                err);
        rc = 1;
    } else {
        report("prefill causal", type, shape, times, count,
               4.0 * n * (double)n * HEAD_DIM * HEADS / 2, "GFLOP/s", share, extra);
    }
    free(work);
    ggml_free(ctx);
    free_mem(p, buf, mem);
    return rc;
}

int main(int argc, char **argv) {
    peer p = {2, 0, NULL};
    const char *only = "";
    for (int a = 1; a < argc; ++a) {
        if (strcmp(argv[a], "--threads") == 0 && a + 1 < argc)
            p.threads = atoi(argv[++a]);
        else if (strcmp(argv[a], "--hugepages") == 0)
            p.hugepages = 1;
        else if (strcmp(argv[a], "--only") == 0 && a + 1 < argc)
            only = argv[++a];
        else
            return fprintf(stderr, "usage: %s [--threads N] [--hugepages] "
                                   "[--only decode|prefill]\n", argv[0]), 2;
    }
    if (p.threads < 1) p.threads = 1;
    ggml_cpu_init();
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(p.threads);
    p.pool = ggml_threadpool_new(&tpp);
    if (!p.pool) return fprintf(stderr, "cannot create a ggml threadpool\n"), 1;

    size_t llc = llc_bytes();
    size_t pool_bytes = 4 * (llc ? llc : (size_t)32 << 20);
    if (pool_bytes < ((size_t)1 << 30)) pool_bytes = (size_t)1 << 30;
    printf("ggml flash_attn_ext (CPU): %d threads, AVX2 %d, AVX512 %d, AVX512_BF16 %d, "
           "F16C %d, LLC %.0f MB, %s memory\n", p.threads, ggml_cpu_has_avx2(),
           ggml_cpu_has_avx512(), ggml_cpu_has_avx512_bf16(), ggml_cpu_has_f16c(),
           (double)llc / 1048576, p.hugepages ? "huge-page (madvise)" : "plain");
    const enum ggml_type types[2] = {GGML_TYPE_BF16, GGML_TYPE_F16};
    int rc = 0;
    if (strcmp(only, "prefill") != 0) {
        printf("decode: %d q / %d kv heads, d %d, K/V pool %.0f MB per shape\n", HEADS, KV_HEADS,
               HEAD_DIM, (double)pool_bytes / 1e6);
        for (int t = 0; t < 2; ++t) {
            rc |= bench_decode(&p, types[t], 1, 4096, pool_bytes);
            rc |= bench_decode(&p, types[t], 8, 4096, pool_bytes);
        }
    }
    if (strcmp(only, "decode") != 0) {
        printf("prefill: causal, one sequence, %d q / %d kv heads, d %d\n", HEADS, KV_HEADS,
               HEAD_DIM);
        for (int t = 0; t < 2; ++t) {
            rc |= bench_prefill(&p, types[t], 512, 7);
            rc |= bench_prefill(&p, types[t], 2048, 3);
        }
    }
    ggml_threadpool_free(p.pool);
    return rc;
}
