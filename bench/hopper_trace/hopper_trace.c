/*
 * hopper_trace.c -- where the Hopper prefill kernel's cycles go, per work item.
 *
 * Built with -DKVA_HP_TRACE=ON (the library's bf16 Hopper kernel then records a clock64 trace,
 * src/cuda/prefill_hopper_trace.cuh). For each head dim given (default 128) it runs ragged prefill
 * plans of 32 q / 8 kv heads, bf16, random inputs, 16384 tokens as 32 x 512, 8 x 2048 and
 * 1 x 16384, full and causal: warm-up, 20 timed calls (wall clock around them), one more launch
 * traced alone, then per consumer warpgroup the median cycles of each phase of a work item over blocks
 * 0-1 (the last item of each block left out):
 *   top->Q     the item's top until its Q landed (0 when the last item's tail took its S_0)
 *   S_0        until its first tile's softmax is done
 *   loop       the steady loop (tiles 1 .. n-1)
 *   tail       the last P V (with the cross-item tail: also the next item's S_0 and softmax)
 *   normalise  the epilogue's O normalised and lse written (O staged in shared memory; where o
 *              is stored directly -- split items, halves that are not whole, groups that do
 *              not divide 64 -- its stores too)
 *   store      the staged buffer handed to the store warp (whose copies are its O handed over
 *              -> O stored, below)
 *   gap        until the next item's top, and its parts: done (the record handed back), next
 *              (the record after next tried), top (the next Q's own copies where no tensor copy
 *              brings it, the loop's top: broadcasts, descriptors)
 * then the whole item (top to the next item's top: mean, median, mean per key tile) and each
 * block's span over its complete items (the phase medians of items of different lengths need not
 * add up to one),
 * and, relative to warpgroup 0's top of the item, the K producer's start / first copy / last copy
 * (warp 0; the V warp's copies are not traced),
 * the scheduler warp's Q buffer free / Q copy issued and the store warp's O handed over / O
 * stored.
 * --raw prints every item; --chunked runs the README's chunked-prefill row instead (512 new tokens
 * over a 16384-token prefix, causal), on contiguous keys and paged (shuffled pages of 16 tokens,
 * or of each --page N given);
 * --variant alibi|softcap|identity runs the calls with that variant (the built-in ALiBi, the
 * examples' soft-cap snippet with cap 50, a modifier returning the score) and reads the trace its
 * NVRTC module recorded (a trace build's modules trace too: src/cuda/variant_compile.c; which of a
 * d128 module's two builds ran follows the library's rule, KVA_PREFILL_TURNS=0 / 1 forces one);
 * --alibi-slopes passes ALiBi slopes as caller data without a variant (for a scratch build whose
 * bf16 Hopper kernel is the native ALiBi one; the plain kernel ignores them); --cap X sets every
 * call's logits_soft_cap (the library's built-in cap, beside --variant softcap's snippet, whose cap
 * is 50). Exits 1 if a traced
 * launch left no complete item in blocks 0-1: another kernel ran (run with
 * KVA_PREFILL_TMA_STRICT=1), or the call gave those blocks fewer than two items each.
 * Usage: hopper_trace [--raw] [--chunked [--page N ...]] [--variant NAME | --alibi-slopes] [--cap X] [head_dim ...]
 */
#include "kvattn.h"
#include "../trace_util.h"
#include "../../examples/variant_sources.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* in the library when built with KVA_HP_TRACE (src/cuda/prefill_hopper_bf16.cu, variant_load.cu) */
int kva__hp_trace_read(long long *dst, size_t count);
int kva__variant_trace_read(const kva_variant *v, int dim, long long *dst, size_t count);

enum { BLOCKS = 2, ROLES = 4, ITEMS = 64, POINTS = 10 }; /* as prefill_hopper_trace.cuh */
enum { TOP, Q, S0, LOOP, TAIL, EPILOGUE, TILES, STAGED, GAP_DONE, GAP_NEXT };
enum { P_START, P_FIRST, P_LAST, S_Q, W_GOT, W_DONE, S_FREE = 7 };

static long long trace[BLOCKS][ROLES][ITEMS][POINTS];


static long long median(long long *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_ll);
    return n ? v[n / 2] : 0;
}

/* items of block b with a complete record (a next item to measure the gap to) */
static int complete_items(int b) {
    int n = 0;
    while (n + 1 < ITEMS && trace[b][1][n + 1][TOP] != 0) ++n;
    return n;
}

/* prints the phases of the last launch; false if no item was traced (not the Hopper kernel?) */
static int report(int raw) {
    static const char *names[] = {"top->Q", "S_0", "loop", "tail", "normalise", "store", "gap",
                                  "(gap: done", "next", "top)"};
    for (int w = 0; w < ROLES - 1; ++w) { /* (a third consumer warpgroup at d64) */
        if (w >= 2 && trace[0][1 + w][0][TOP] == 0 && trace[1][1 + w][0][TOP] == 0) break; /* (no third warpgroup) */
        long long v[10][BLOCKS * ITEMS], item[BLOCKS * ITEMS], tiles = 0, item_sum = 0;
        int n = 0;
        for (int b = 0; b < BLOCKS; ++b)
            for (int i = 0; i < complete_items(b); ++i, ++n) {
                const long long *t = trace[b][1 + w][i];
                item[n] = trace[b][1 + w][i + 1][TOP] - t[TOP];
                item_sum += item[n];
                v[0][n] = t[Q] - t[TOP];
                v[1][n] = t[S0] - t[Q];
                v[2][n] = t[LOOP] - t[S0];
                v[3][n] = t[TAIL] - t[LOOP];
                v[4][n] = t[STAGED] - t[TAIL];
                v[5][n] = t[EPILOGUE] - t[STAGED];
                v[6][n] = trace[b][1 + w][i + 1][TOP] - t[EPILOGUE];
                v[7][n] = t[GAP_DONE] - t[EPILOGUE];
                v[8][n] = t[GAP_NEXT] - t[GAP_DONE];
                v[9][n] = trace[b][1 + w][i + 1][TOP] - t[GAP_NEXT];
                tiles += t[TILES];
            }
        if (n == 0) {
            printf("    no complete items traced (not the Hopper kernel, or fewer than 2 items per block)\n");
            return 0;
        }
        printf("    warpgroup %d, %d items, %.1f tiles per item, median cycles:", w, n, (double)tiles / n);
        for (int k = 0; k < 10; ++k) printf(" %s %lld", names[k], median(v[k], n));
        printf("\n");
        /* (the phase medians of items of different lengths need not add up to an item: the
         * whole item, top to the next top, and each block's span of its complete items) */
        printf("        item, top to next top: mean %.0f, median %lld cycles (%.0f per tile); span", (double)item_sum / n,
               median(item, n), (double)item_sum / (double)tiles);
        for (int b = 0; b < BLOCKS; ++b) {
            const int c = complete_items(b);
            printf(" block %d %lld (%d items)", b, c ? trace[b][1 + w][c][TOP] - trace[b][1 + w][0][TOP] : 0, c);
        }
        printf("\n");
    }
    long long p[3][BLOCKS * ITEMS];
    int n = 0;
    for (int b = 0; b < BLOCKS; ++b)
        for (int i = 0; i < complete_items(b); ++i) {
            if (trace[b][0][i][TILES] == 0) continue; /* (no copies: no first-copy clock) */
            for (int k = 0; k < 3; ++k) p[k][n] = trace[b][0][i][k] - trace[b][1][i][TOP];
            ++n;
        }
    printf("    producer, relative to warpgroup 0's top: start %lld, first copy %lld, last copy %lld\n",
           median(p[0], n), median(p[1], n), median(p[2], n));
    /* the scheduler's and the store warp's points of item i, relative to warpgroup 0's top of it */
    long long s[4][BLOCKS * ITEMS];
    static const int spts[4] = {S_FREE, S_Q, W_GOT, W_DONE};
    n = 0;
    for (int b = 0; b < BLOCKS; ++b)
        for (int i = 1; i < complete_items(b); ++i, ++n)
            for (int k = 0; k < 4; ++k) s[k][n] = trace[b][0][i][spts[k]] - trace[b][1][i][TOP];
    printf("    scheduler / store warp, relative to warpgroup 0's top: Q buffer free %lld, Q copy issued %lld, "
           "O handed over %lld, O stored %lld\n", median(s[0], n), median(s[1], n), median(s[2], n), median(s[3], n));
    if (!raw) return 1;
    for (int b = 0; b < BLOCKS; ++b)
        for (int i = 0; i < complete_items(b); ++i) {
            printf("    b%d item %2d", b, i);
            for (int w = 0; w < 2; ++w) {
                const long long *t = trace[b][1 + w][i];
                printf(" | wg%d %lld tiles: %lld %lld %lld %lld %lld %lld %lld", w, t[TILES], t[Q] - t[TOP], t[S0] - t[Q],
                       t[LOOP] - t[S0], t[TAIL] - t[LOOP], t[STAGED] - t[TAIL], t[EPILOGUE] - t[STAGED],
                       trace[b][1 + w][i + 1][TOP] - t[EPILOGUE]);
            }
            printf("\n");
        }
    return 1;
}

/* One traced case: warm-up, `reps` timed calls, then one more launch traced alone; false if none
 * was traced. */
typedef struct trace_case {
    kva_context *ctx;
    kva_plan plan;
    kva_attn_params p;
    kva_tensor q, k, v, o;
    const kva_kv_pages *pages; /* NULL: ragged */
} trace_case;

static kva_status run_case(trace_case *c) {
    return c->pages ? kva_prefill_run_paged(c->ctx, &c->plan, &c->p, c->q, c->pages, c->o, NULL)
                    : kva_prefill_run_ragged(c->ctx, &c->plan, &c->p, c->q, c->k, c->v, c->o, NULL);
}

/* the trace buffer of c's kernel into `trace`, then cleared (a variant's module at the head dim's
 * built size: 64, 128 or 256 here); the CUDA error */
static int read_trace(const trace_case *c) {
    const size_t n = sizeof trace / sizeof(long long);
    return c->p.variant ? kva__variant_trace_read(c->p.variant, c->p.head_dim, &trace[0][0][0][0], n)
                        : kva__hp_trace_read(&trace[0][0][0][0], n);
}

static int time_and_report(trace_case *c, const char *label, double flop, int raw) {
    for (int i = 0; i < 3; ++i) OK(run_case(c));
    OK(kva_synchronize(c->ctx));
    const int reps = 20;
    const double t0 = now_us();
    for (int i = 0; i < reps; ++i) OK(run_case(c));
    OK(kva_synchronize(c->ctx));
    const double us = (now_us() - t0) / reps;
    /* The buffer holds what every launch wrote: cleared (read), then one more launch, read
     * alone. (Tickets hand a block a different number of items each launch, and a launch with
     * fewer left its predecessors' later items behind: the whole-item means and block spans of
     * 2026-11-30 came out negative.) */
    int e = read_trace(c);
    if (e == 0) {
        OK(run_case(c));
        e = read_trace(c);
    }
    if (e != 0) {
        fprintf(stderr, "reading the trace failed\n");
        exit(1);
    }
    printf("%s: %.1f us per call, %.0f TFLOP/s\n", label, us, flop / us * 1e-6);
    return report(raw);
}

/* device copy of n random bf16 values (seed) */
static void *upload_random(kva_context *ctx, size_t n, uint32_t seed) {
    uint16_t *h = malloc(n * sizeof *h);
    void *d = NULL;
    if (!h) exit(1);
    uint32_t state = seed;
    fill_bf16(h, n, &state);
    OK(kva_malloc(ctx, n * 2, &d));
    OK(kva_memcpy(ctx, d, h, n * 2, KVA_COPY_HOST_TO_DEVICE));
    free(h);
    return d;
}

static void *upload_slopes(kva_context *ctx, int Hq) {
    float sl[256];
    void *d = NULL;
    kva_alibi_slopes(Hq, sl);
    OK(kva_malloc(ctx, sizeof(float) * (size_t)Hq, &d));
    OK(kva_memcpy(ctx, d, sl, sizeof(float) * (size_t)Hq, KVA_COPY_HOST_TO_DEVICE));
    return d;
}

enum { Hq = 32, Hk = 8, CHUNK_NEW = 512, CHUNK_PREFIX = 16384 };

/* A case's device memory: q / o of nq tokens, k / v of nkv rows (random bf16), the workspace for
 * `lim`; and the case's params and tensors over them. */
typedef struct case_memory {
    void *q, *o, *k, *v;
    kva_workspace ws;
} case_memory;

static kva_variant *g_variant; /* --variant: every case runs with it */
static float g_cap;            /* --cap: every case's logits_soft_cap (0: none) */

static void case_setup(trace_case *c, case_memory *m, kva_context *ctx, int D, int nq, int nkv,
                       const kva_plan_limits *lim, int causal, void *user) {
    memset(c, 0, sizeof *c);
    memset(m, 0, sizeof *m);
    c->ctx = ctx;
    m->q = upload_random(ctx, (size_t)nq * Hq * D, 1);
    m->k = upload_random(ctx, (size_t)nkv * Hk * D, 2);
    m->v = upload_random(ctx, (size_t)nkv * Hk * D, 3);
    OK(kva_malloc(ctx, (size_t)nq * Hq * D * 2, &m->o));
    OK(kva_prefill_workspace_size(ctx, lim, &m->ws.device_bytes, &m->ws.host_bytes));
    OK(kva_malloc(ctx, m->ws.device_bytes, &m->ws.device));
    OK(kva_host_alloc(ctx, m->ws.host_bytes, &m->ws.host));
    c->p = kva_attn_params_default(Hq, Hk, D);
    c->p.causal = causal;
    c->p.score_mod_user = user;
    c->p.variant = g_variant;
    c->p.logits_soft_cap = g_cap;
    c->q = kva_tensor_nhd(m->q, KVA_BF16, Hq, D);
    c->o = kva_tensor_nhd(m->o, KVA_BF16, Hq, D);
    c->k = kva_tensor_nhd(m->k, KVA_BF16, Hk, D);
    c->v = kva_tensor_nhd(m->v, KVA_BF16, Hk, D);
}

static void case_free(kva_context *ctx, case_memory *m) {
    kva_free(ctx, m->q);
    kva_free(ctx, m->k);
    kva_free(ctx, m->v);
    kva_free(ctx, m->o);
    kva_free(ctx, m->ws.device);
    kva_host_free(ctx, m->ws.host);
}

/* Ragged: B x S tokens, K/V as long as Q. */
static int ragged_case(kva_context *ctx, int D, int B, int S, int causal, void *user, int raw) {
    const int T = B * S;
    const kva_plan_limits lim = {B, 0, T, T, Hq, Hk, D, 0, 0};
    trace_case c;
    case_memory m;
    case_setup(&c, &m, ctx, D, T, T, &lim, causal, user);
    int32_t *indptr = malloc(sizeof(int32_t) * (size_t)(B + 1));
    if (!indptr) exit(1);
    for (int b = 0; b <= B; ++b) indptr[b] = b * S;
    OK(kva_prefill_plan(ctx, &lim, B, indptr, indptr, NULL, 0, NULL, m.ws, &c.plan));
    char label[64];
    snprintf(label, sizeof label, "d%d %dx%d %s", D, B, S, causal ? "causal" : "full");
    const int traced = time_and_report(&c, label, 4.0 * S * (double)S * Hq * D * B * (causal ? 0.5 : 1.0), raw);
    case_free(ctx, &m);
    free(indptr);
    return traced;
}

/* The README's chunked-prefill row: CHUNK_NEW new tokens over a CHUNK_PREFIX-token prefix, causal
 * (bottom-right), K/V in shuffled pages of ps tokens (paged) or the pool read in its physical
 * order as one contiguous sequence (ragged; other keys than the paged case's, the same amount):
 * the two plans side by side, for timing. */
static int chunked_case(kva_context *ctx, int D, int paged, int ps, void *user, int raw) {
    const int nq = CHUNK_NEW, nk = CHUNK_PREFIX + CHUNK_NEW, np = (nk + ps - 1) / ps;
    const kva_plan_limits lim = {1, np, nk, nq, Hq, Hk, D, ps, 0};
    trace_case c;
    case_memory m;
    case_setup(&c, &m, ctx, D, nq, np * ps, &lim, 1, user);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)np);
    if (!perm) exit(1);
    uint32_t seed = 7;
    for (int i = 0; i < np; ++i) perm[i] = i;
    for (int i = np - 1; i > 0; --i) { /* Fisher-Yates */
        seed = seed * 1664525u + 1013904223u;
        const int j = (int)((seed >> 8) % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int32_t qo_indptr[2] = {0, nq}, kv_indptr[2] = {0, nk}, p_indptr[2] = {0, np};
    const int32_t last = nk - (np - 1) * ps;
    const kva_page_table table = {1, p_indptr, perm, &last};
    kva_kv_pages pages = kva_kv_pages_separate(m.k, m.v, KVA_BF16, np, ps, Hk, D, KVA_LAYOUT_NHD);
    if (paged) {
        OK(kva_prefill_plan(ctx, &lim, 1, qo_indptr, NULL, &table, np, NULL, m.ws, &c.plan));
        c.pages = &pages;
    } else {
        OK(kva_prefill_plan(ctx, &lim, 1, qo_indptr, kv_indptr, NULL, 0, NULL, m.ws, &c.plan));
    }
    char label[96];
    if (paged) snprintf(label, sizeof label, "d%d chunked %d over %d, paged %d (shuffled)", D, nq, CHUNK_PREFIX, ps);
    else snprintf(label, sizeof label, "d%d chunked %d over %d, contiguous (ragged plan)", D, nq, CHUNK_PREFIX);
    /* keys visible to query i: nk - nq + i + 1 */
    const double pairs = (double)nq * (nk - nq) + (double)nq * (nq + 1) / 2;
    const int traced = time_and_report(&c, label, 4.0 * pairs * Hq * D, raw);
    case_free(ctx, &m);
    free(perm);
    return traced;
}

int main(int argc, char **argv) {
    int raw = 0, chunked = 0, alibi = 0, dims[8], ndims = 0, traced = 1, pages[8], npages = 0;
    const char *variant = NULL;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--raw")) raw = 1;
        else if (!strcmp(argv[i], "--variant") && i + 1 < argc) variant = argv[++i];
        else if (!strcmp(argv[i], "--chunked")) chunked = 1;
        else if (!strcmp(argv[i], "--alibi-slopes")) alibi = 1;
        else if (!strcmp(argv[i], "--cap") && i + 1 < argc) {
            g_cap = (float)atof(argv[++i]);
            if (!(g_cap > 0.0f)) {
                fprintf(stderr, "--cap needs a soft cap > 0\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--page")) {
            const int ps = i + 1 < argc ? atoi(argv[++i]) : 0;
            if (ps < 1 || npages == 8) {
                fprintf(stderr, "--page needs a page size >= 1 (at most 8 of them)\n");
                return 2;
            }
            pages[npages++] = ps;
        }
        else if (ndims < 8) dims[ndims++] = atoi(argv[i]);
    }
    if (variant && alibi) {
        fprintf(stderr, "--variant and --alibi-slopes: one or the other\n");
        return 2;
    }
    if (ndims == 0) dims[ndims++] = 128;
    if (npages == 0) pages[npages++] = 16;
    kva_context *ctx = NULL;
    OK(kva_context_create(KVA_DEVICE_CUDA, 0, &ctx));
    void *user = alibi ? upload_slopes(ctx, Hq) : NULL;
    if (user) printf("ALiBi slopes passed as the modifier's data\n");
    if (g_cap > 0.0f) printf("logits soft cap %g on every call\n", (double)g_cap);
    if (variant) {
        const kva_variant_options opt = {KVA_VARIANT_PREFILL, 1u << KVA_BF16, 0};
        if (!strcmp(variant, "alibi")) {
            OK(kva_variant_create_alibi(ctx, &opt, &g_variant));
            user = upload_slopes(ctx, Hq);
        } else if (!strcmp(variant, "softcap")) {
            const float cap = 50.0f;
            OK(kva_variant_create(ctx, KVA_EX_SOURCE_SOFTCAP, "softcap", &opt, &g_variant));
            OK(kva_malloc(ctx, sizeof cap, &user));
            OK(kva_memcpy(ctx, user, &cap, sizeof cap, KVA_COPY_HOST_TO_DEVICE));
        } else if (!strcmp(variant, "identity")) {
            OK(kva_variant_create(ctx,
                                  "float identity(float s, int32_t q, int32_t k, int32_t h, const void *u) {\n"
                                  "    (void)q; (void)k; (void)h; (void)u;\n    return s;\n}\n",
                                  "identity", &opt, &g_variant));
        } else {
            fprintf(stderr, "--variant: alibi, softcap or identity\n");
            return 2;
        }
        printf("variant %s (its module's trace)\n", variant);
    }
    const int shapes[3][2] = {{32, 512}, {8, 2048}, {1, 16384}};
    for (int di = 0; di < ndims; ++di) {
        if (chunked) {
            traced &= chunked_case(ctx, dims[di], 0, 16, user, raw);
            for (int pi = 0; pi < npages; ++pi) traced &= chunked_case(ctx, dims[di], 1, pages[pi], user, raw);
            continue;
        }
        for (int si = 0; si < 3; ++si)
            for (int causal = 0; causal < 2; ++causal)
                traced &= ragged_case(ctx, dims[di], shapes[si][0], shapes[si][1], causal, user, raw);
    }
    if (user) kva_free(ctx, user);
    kva_variant_destroy(g_variant);
    kva_context_destroy(ctx);
    return traced ? 0 : 1;
}
