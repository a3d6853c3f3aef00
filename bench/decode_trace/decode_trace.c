/*
 * decode_trace.c -- where a small decode batch's time goes, per block of the decode kernel.
 *
 * Built with -DKVA_DECODE_TRACE=ON (the library's bf16 decode kernels then record per-block times,
 * src/cuda/decode_trace.cuh). For each batch x context given (default 1x8192, 1x2048, 1x32768,
 * 8x4096) it runs paged decode of 32 q / 8 kv heads, d 128, bf16, pages of 16 shuffled, random
 * inputs, the plan's own chunks, over enough input sets that each call reads cold K/V (>= 256 MB
 * in all): 20 warm-up calls, 50 timed ones (host clock around them: the launch path included),
 * then one more launch traced alone. It prints, over the blocks that ran a unit (median / max,
 * microseconds from %globaltimer; median cycles of clock64, the same phases within each block):
 *   start      the block's first instruction after the first block's
 *   record     its first unit's plan record decoded
 *   wait       with PDL (the default build): the first tiles' page-id loads issued and the
 *              programmatic-dependency wait passed (no earlier kernel here, yet ~0.4 us);
 *              without (-DKVA__DECODE_PDL=0): the caller data, q and page-id loads issued
 *   first      warp 0's first tile landed (with PDL: the q load's issue falls in this phase)
 *   loop       warp 0's tiles of the first unit done
 *   combine    the first unit's warps combined, thread 0's o or partial-state stores issued
 *   exit       the block's last unit done, and its merge
 * and the kernel's span (first start to last exit). Blocks with no unit (a grid larger than the
 * plan's units) are counted apart; at most 512 blocks are traced. Usage:
 *   ./build-trace/decode_trace [--shapes 1x8192,8x4096] [--hq 32 --hk 8] [--graph]
 * (--graph: graph plans, whose grid is every resident block, more than the units of small batches;
 * a ragged batch is groups of requests joined by '+': 1x65536+63x100 is issue 8's batch (b))
 */
#include "kvattn.h"
#include "../trace_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* in the library when built with KVA_DECODE_TRACE (src/cuda/decode_bf16.cu) */
int kva__decode_trace_read(unsigned long long *ns, long long *clk);

enum { BLOCKS = 512, POINTS = 8 }; /* as decode_trace.cuh */
enum { ENTRY, REC, WAIT, FIRST, LOOP, COMB, EXIT, UNITS };

static unsigned long long tns[BLOCKS][POINTS];
static long long tclk[BLOCKS][POINTS];

static uint32_t rng_next(uint32_t *s) { return *s = *s * 1664525u + 1013904223u; }

/* median and max of v[0..n) (sorts v) */
static void med_max(long long *v, int n, long long *med, long long *mx) {
    qsort(v, (size_t)n, sizeof *v, cmp_ll);
    *med = n ? v[n / 2] : 0;
    *mx = n ? v[n - 1] : 0;
}

/* One batch: B requests of lens[b] keys (label: how the command line named it). */
static void trace_shape(kva_context *ctx, int B, const int *lens, const char *label, int hq, int hk,
                        uint32_t plan_flags) {
    enum { D = 128, PS = 16 };
    int P = 0;
    for (int b = 0; b < B; ++b) P += (lens[b] + PS - 1) / PS;
    const size_t pool = (size_t)P * PS * hk * D; /* elements of one K (or V) pool */
    int sets = (int)((256u << 20) / (2 * pool * 2)) + 1;
    if (sets < 2) sets = 2;
    if (sets > 64) sets = 64;
    uint32_t seed = 12345u;
    uint16_t *host = malloc(pool * 2);
    void **k = calloc((size_t)sets, sizeof *k), **v = calloc((size_t)sets, sizeof *v);
    if (!host || !k || !v) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (int s = 0; s < sets; ++s) {
        OK(kva_malloc(ctx, pool * 2, &k[s]));
        OK(kva_malloc(ctx, pool * 2, &v[s]));
        fill_bf16(host, pool, &seed);
        OK(kva_memcpy(ctx, k[s], host, pool * 2, KVA_COPY_HOST_TO_DEVICE));
        fill_bf16(host, pool, &seed);
        OK(kva_memcpy(ctx, v[s], host, pool * 2, KVA_COPY_HOST_TO_DEVICE));
    }
    const size_t qn = (size_t)B * hq * D;
    void *q, *o;
    OK(kva_malloc(ctx, qn * 2, &q));
    OK(kva_malloc(ctx, qn * 2, &o));
    fill_bf16(host, qn, &seed);
    OK(kva_memcpy(ctx, q, host, qn * 2, KVA_COPY_HOST_TO_DEVICE));
    /* pages shuffled over the pool */
    int32_t *indptr = malloc(sizeof(int32_t) * (size_t)(B + 1)), *idx = malloc(sizeof(int32_t) * (size_t)P),
            *last = malloc(sizeof(int32_t) * (size_t)B);
    kva_kv_pages *pg = malloc(sizeof *pg * (size_t)sets);
    if (!indptr || !idx || !last || !pg) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (int i = 0; i < P; ++i) idx[i] = i;
    for (int i = P - 1; i > 0; --i) {
        const int j = (int)(rng_next(&seed) % (uint32_t)(i + 1)), t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    indptr[0] = 0;
    for (int b = 0; b < B; ++b) {
        const int pages = (lens[b] + PS - 1) / PS;
        indptr[b + 1] = indptr[b] + pages;
        last[b] = lens[b] - (pages - 1) * PS;
    }
    const kva_page_table table = {B, indptr, idx, last};
    const kva_plan_limits lim = {.max_batch = B, .max_total_pages = P, .num_qo_heads = hq,
                                 .num_kv_heads = hk, .head_dim = D, .page_size = PS};
    kva_workspace ws = {0};
    OK(kva_decode_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes));
    OK(kva_malloc(ctx, ws.device_bytes, &ws.device));
    OK(kva_host_alloc(ctx, ws.host_bytes, &ws.host));
    kva_plan plan;
    const kva_plan_options opt = {plan_flags, 0, KVA_DECODE_PARTIAL_ROWMAX};
    OK(kva_decode_plan(ctx, &lim, &table, P, &opt, ws, &plan));
    const kva_attn_params p = kva_attn_params_default(hq, hk, D);
    const kva_tensor tq = kva_tensor_nhd(q, KVA_BF16, hq, D), to = kva_tensor_nhd(o, KVA_BF16, hq, D);
    for (int s = 0; s < sets; ++s) pg[s] = kva_kv_pages_separate(k[s], v[s], KVA_BF16, P, PS, hk, D, KVA_LAYOUT_NHD);
    int s = 0;
    for (int i = 0; i < 20; ++i, s = (s + 1) % sets) OK(kva_decode_run(ctx, &plan, &p, tq, &pg[s], to, NULL));
    OK(kva_synchronize(ctx));
    const double t0 = now_us();
    for (int i = 0; i < 50; ++i, s = (s + 1) % sets) OK(kva_decode_run(ctx, &plan, &p, tq, &pg[s], to, NULL));
    OK(kva_synchronize(ctx));
    const double per_call = (now_us() - t0) / 50;
    if (kva__decode_trace_read(&tns[0][0], &tclk[0][0]) != 0) {
        fprintf(stderr, "kva__decode_trace_read failed\n");
        exit(1);
    }
    OK(kva_decode_run(ctx, &plan, &p, tq, &pg[s], to, NULL));
    OK(kva_synchronize(ctx));
    if (kva__decode_trace_read(&tns[0][0], &tclk[0][0]) != 0) exit(1);

    /* the blocks that ran a unit and recorded every point (one without a first tile -- warp 0
     * had none -- is left out too) */
    int used[BLOCKS], n = 0, idle = 0, partial = 0, all = 0;
    unsigned long long first = ~0ull;
    for (int b = 0; b < BLOCKS && tns[b][ENTRY]; ++b, ++all) {
        if (tns[b][ENTRY] < first) first = tns[b][ENTRY];
        int complete = 1;
        for (int ph = REC; ph <= EXIT; ++ph) complete = complete && tns[b][ph] != 0;
        if (tclk[b][UNITS] == 0) ++idle;
        else if (!complete) ++partial;
        else used[n++] = b;
    }
    printf("%d/%d d128 bf16 %s%s: chunk %d, %d sets of K/V, %.1f us per call (host clock, 50 calls), "
           "%d blocks traced (%d without a unit, %d without every point)%s\n",
           hq, hk, label, plan_flags ? " (graph plan)" : "", plan.kv_chunk_size, sets, per_call, n, idle, partial,
           all == BLOCKS ? "; the grid may have more blocks than are traced" : "");
    static const char *names[] = {"start", "record", "wait", "first", "loop", "combine", "exit"};
    long long *v_ns = malloc(sizeof(long long) * (size_t)(n > 0 ? n : 1)),
              *v_ck = malloc(sizeof(long long) * (size_t)(n > 0 ? n : 1));
    if (!v_ns || !v_ck) exit(1);
    if (n == 0) {
        printf("    nothing traced (not the decode kernel? a trace build? -DKVA_DECODE_TRACE=ON)\n");
    } else {
        printf("    %-8s %14s %14s %18s\n", "phase", "median us", "max us", "median cycles");
        for (int ph = ENTRY; ph <= EXIT; ++ph) {
            for (int i = 0; i < n; ++i) {
                const int b = used[i];
                /* start: from the first block's start; the others: from the block's previous point */
                v_ns[i] = ph == ENTRY ? (long long)(tns[b][ENTRY] - first) : (long long)(tns[b][ph] - tns[b][ph - 1]);
                v_ck[i] = ph == ENTRY ? 0 : tclk[b][ph] - tclk[b][ph - 1];
            }
            long long mn, mx, cm, cx;
            med_max(v_ns, n, &mn, &mx);
            med_max(v_ck, n, &cm, &cx);
            printf("    %-8s %14.2f %14.2f %18lld\n", names[ph], mn * 1e-3, mx * 1e-3, cm);
        }
        for (int i = 0; i < n; ++i) v_ns[i] = (long long)(tns[used[i]][EXIT] - first);
        long long mn, mx;
        med_max(v_ns, n, &mn, &mx); /* (sorted: the exits' spread, the tail a static split leaves) */
        printf("    exit from the first start, us: min %.2f, p10 %.2f, p25 %.2f, p50 %.2f, p75 %.2f, p90 %.2f, max %.2f\n",
               v_ns[0] * 1e-3, v_ns[n / 10] * 1e-3, v_ns[n / 4] * 1e-3, v_ns[n / 2] * 1e-3, v_ns[3 * n / 4] * 1e-3,
               v_ns[9 * n / 10] * 1e-3, v_ns[n - 1] * 1e-3);
        for (int i = 0; i < n; ++i) v_ck[i] = tclk[used[i]][UNITS];
        long long um, ux;
        med_max(v_ck, n, &um, &ux);
        printf("    span: first start to exit, median %.2f us, last %.2f us; units per block median %lld, max %lld\n",
               mn * 1e-3, mx * 1e-3, um, ux);
    }
    free(v_ns);
    free(v_ck);
    for (int i = 0; i < sets; ++i) {
        kva_free(ctx, k[i]);
        kva_free(ctx, v[i]);
    }
    kva_free(ctx, q);
    kva_free(ctx, o);
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    free(k);
    free(v);
    free(pg);
    free(host);
    free(indptr);
    free(idx);
    free(last);
}

int main(int argc, char **argv) {
    const char *shapes = "1x8192,1x2048,1x32768,8x4096";
    int hq = 32, hk = 8;
    uint32_t flags = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) shapes = argv[++i];
        else if (strcmp(argv[i], "--hq") == 0 && i + 1 < argc) hq = atoi(argv[++i]);
        else if (strcmp(argv[i], "--hk") == 0 && i + 1 < argc) hk = atoi(argv[++i]);
        else if (strcmp(argv[i], "--graph") == 0) flags = KVA_PLAN_GRAPH;
        else {
            fprintf(stderr, "usage: %s [--shapes BxL,...] [--hq N] [--hk N] [--graph]\n", argv[0]);
            return 2;
        }
    }
    if (hk < 1 || hq < hk || hq % hk != 0) {
        fprintf(stderr, "--hq must be a multiple of --hk >= 1 (got %d, %d)\n", hq, hk);
        return 2;
    }
    kva_context *ctx;
    OK(kva_context_create(KVA_DEVICE_CUDA, 0, &ctx));
    const char *c = shapes;
    while (*c) {
        /* a batch: BxL groups joined by '+' */
        enum { MAX_REQ = 4096 };
        static int lens[MAX_REQ];
        const char *begin = c;
        int nreq = 0;
        for (;;) {
            int B = 0, L = 0, used = 0;
            if (sscanf(c, "%dx%d%n", &B, &L, &used) != 2 || B < 1 || L < 1 || B > MAX_REQ - nreq) {
                fprintf(stderr, "bad shape at \"%s\" (BxL groups joined by '+', at most %d requests)\n", c, MAX_REQ);
                return 2;
            }
            for (int i = 0; i < B; ++i) lens[nreq++] = L;
            c += used;
            if (*c != '+') break;
            ++c;
        }
        char label[160]; /* "1x8192" printed as "1 x 8192" */
        size_t k = 0;
        for (const char *x = begin; x < c && k + 4 < sizeof label; ++x) {
            if (*x == 'x') {
                label[k++] = ' ';
                label[k++] = 'x';
                label[k++] = ' ';
            } else {
                label[k++] = *x;
            }
        }
        label[k] = '\0';
        trace_shape(ctx, nreq, lens, label, hq, hk, flags);
        if (*c == ',') ++c;
        else if (*c) {
            fprintf(stderr, "bad shape at \"%s\"\n", c);
            return 2;
        }
    }
    kva_context_destroy(ctx);
    return 0;
}
