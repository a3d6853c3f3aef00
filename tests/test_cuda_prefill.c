/*
 * test_cuda_prefill.c -- GPU prefill (kva_prefill_plan + kva_prefill_run_ragged / _paged) and
 * dense attention (kva_attention) against the float64 reference, through the public API only.
 *
 *   cuda_prefill_ragged_sweep   dtypes f32 / f16 / bf16 x head dims 64 / 128 / 256 x batches of
 *                               1 / 7 / 37 requests; GQA groups 1, 2, 4, 8 and odd (3, 7);
 *                               query lengths 1, 2, 15, 16, 17, 127, 128, 129, 1000 and odd ones;
 *                               key lengths 0, 1, odd; chunked prefill (keys = cached prefix +
 *                               the new queries) and requests with more queries than keys (causal:
 *                               the first queries see no key, o = 0, LSE = -inf); q, k, v, o as NHD,
 *                               HND or padded views (k and v may differ); automatic, forced-split
 *                               (fixed_chunk_size) and unsplit (KVA_PLAN_NO_SPLIT) plans
 *   cuda_prefill_paged_sweep    the same over a paged pool: page sizes 1 / 3 / 16 / 64, shuffled
 *                               physical pages, NHD and HND, separate, interleaved and padded pools
 *   cuda_prefill_variants       sliding window, logits soft cap (also far above the scores), custom
 *                               sm_scale, combined, no LSE
 *   cuda_prefill_dense          kva_attention (one sequence, no plan): qo_len ==, <, > kv_len,
 *                               no keys, one query, 1000 queries
 *   cuda_prefill_head_dims_match_reference   head dims between the built ones (32 .. 240) on
 *                               the next built kernel: ragged, paged, split, dense
 *   cuda_prefill_plan_reused_across_layers   one plan, two layers' pools; repeats bit-identical
 *   cuda_prefill_causal_independence         seed 003's causal-mask test: after changing the
 *                               keys and values past a position, every query at or before it
 *                               (and every other request) gives bit-identical o and LSE, through
 *                               split, unsplit and dense runs; later queries must change
 *   cuda_prefill_graph_replay   a KVA_PLAN_GRAPH paged run captured in a CUDA graph replays
 *                               correctly after re-planning other batches (smaller, empty
 *                               requests, split, one long request) into the same workspace
 *   cuda_prefill_quick          a few cases of each kind, small enough for racecheck; 16-bit
 *                               d64 / d128 with KVA_PREFILL_PERSISTENT=3 (many items per block);
 *                               padded d96 / d160 / d80
 *
 * Before every run the outputs, the LSE and the workspace's device part are poisoned with NaN:
 * every element must be written, and NaN never passes a comparison. Bytes outside the output
 * views (stride padding, guard rows after the end) must stay poisoned. Inputs are fresh random
 * values; input padding, guard rows and pool slots no request owns are NaN, so reading them fails.
 *
 * Environment: KVA_TEST_QUICK=1 (compute-sanitizer runs) shrinks every sweep.
 * KVA_TEST_PREFILL_DEVICE=cpu runs these tests on a CPU context instead of a GPU (where they
 * would skip without one): this checks the tests' own logic against the CPU backend, which is
 * known correct. Device memory is host memory there, graph capture becomes plain runs, and V
 * takes K's view (the CPU backend reads V with K's strides; see v_view_for).
 *
 * Run: kvattn_tests cuda_prefill (all), KVA_TEST_QUICK=1 under compute-sanitizer memcheck,
 * cuda_prefill_quick under racecheck.
 */
#include "harness.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "../src/reference/reference.h"
#include "../src/plan/workspace_layout.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if KVA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static bool quick(void) {
    const char *e = getenv("KVA_TEST_QUICK");
    return e && *e && *e != '0';
}

/* The context the tests run on: CUDA device 0 (skip without one), or the CPU on request. */
static bool cpu_mode; /* the current test runs on a CPU context */

static kva_context *prefill_context(void) {
    const char *e = getenv("KVA_TEST_PREFILL_DEVICE");
    cpu_mode = e && strcmp(e, "cpu") == 0;
    if (cpu_mode) {
        kva_context *ctx = NULL;
        kva_status st = kva_context_create(KVA_DEVICE_CPU, 0, &ctx);
        CHECK_MSG(st == KVA_OK, "CPU context: %s (%s)", kva_status_str(st), kva_last_error());
        return ctx;
    }
    return cuda_test_context();
}

/* K and V views are chosen independently: every backend must honour V's own strides. */
static int v_view_for(int k_view, int wanted) {
    (void)k_view;
    return wanted;
}

static void poison_device(kva_context *ctx, void *dev, size_t bytes) {
    void *p = kva_test_alloc(bytes);
    kva_poison(p, bytes);
    CHECK_OK(kva_memcpy(ctx, dev, p, bytes, KVA_COPY_HOST_TO_DEVICE));
    free(p);
}

/* ---- tensor buffers: [tokens, heads, D] in a view, a host copy and a device copy ---------- */

enum { VIEW_NHD, VIEW_HND, VIEW_PADDED, NUM_VIEWS };
static const char *view_name(int v) {
    static const char *n[] = {"NHD", "HND", "padded"};
    return v >= 0 && v < NUM_VIEWS ? n[v] : "?";
}

/* Rows past the used tokens: NaN in inputs (a kernel reading past the last key fails), and a
 * guard that must stay untouched in outputs. */
#define GUARD_TOKENS 3

typedef struct tbuf {
    kva_dtype dt;
    int view;
    int64_t tokens, alloc_tokens;
    int32_t heads, D;
    size_t bytes;
    void *host, *dev; /* host: the uploaded inputs, or the downloaded outputs */
    kva_tensor h, d;  /* the same view over each copy */
} tbuf;

static kva_tensor view_of(int view, void *data, kva_dtype dt, int64_t alloc_tokens, int32_t heads,
                          int32_t D) {
    if (view == VIEW_HND) return kva_tensor_hnd(data, dt, alloc_tokens, D);
    if (view == VIEW_PADDED) {
        /* 8 extra elements per head and per token keep 16-byte row alignment for every dtype */
        kva_tensor t = {data, dt, (int64_t)heads * (D + 8) + 8, D + 8};
        return t;
    }
    return kva_tensor_nhd(data, dt, heads, D);
}

static void tbuf_layout(tbuf *t, kva_dtype dt, int view, int64_t tokens, int32_t heads, int32_t D) {
    memset(t, 0, sizeof *t);
    t->dt = dt;
    t->view = view;
    t->tokens = tokens;
    t->alloc_tokens = tokens + GUARD_TOKENS;
    t->heads = heads;
    t->D = D;
    kva_tensor v = view_of(view, NULL, dt, t->alloc_tokens, heads, D);
    int64_t elems = view == VIEW_HND ? (int64_t)heads * t->alloc_tokens * D
                                     : t->alloc_tokens * v.stride_token;
    t->bytes = (size_t)elems * kva_dtype_size(dt);
}

/* An input: NaN everywhere, random values in [lo, hi) in the used rows; uploaded. */
static bool tbuf_input(kva_context *ctx, kva_rng *rng, tbuf *t, kva_dtype dt, int view,
                       int64_t tokens, int32_t heads, int32_t D, float lo, float hi) {
    tbuf_layout(t, dt, view, tokens, heads, D);
    t->host = kva_test_alloc(t->bytes);
    kva_poison(t->host, t->bytes);
    t->h = view_of(view, t->host, dt, t->alloc_tokens, heads, D);
    const size_t es = kva_dtype_size(dt);
    for (int64_t i = 0; i < tokens; ++i)
        for (int32_t h = 0; h < heads; ++h)
            kva_fill_random(rng, (char *)t->host + (size_t)(i * t->h.stride_token + h * t->h.stride_head) * es,
                            dt, (size_t)D, lo, hi);
    t->dev = cuda_test_upload(ctx, t->host, t->bytes);
    t->d = view_of(view, t->dev, dt, t->alloc_tokens, heads, D);
    return t->dev != NULL;
}

/* Re-uploads the host copy (after a test changed it). */
static void tbuf_reupload(kva_context *ctx, tbuf *t) {
    CHECK_OK(kva_memcpy(ctx, t->dev, t->host, t->bytes, KVA_COPY_HOST_TO_DEVICE));
}

/* An output: all NaN on the device. */
static bool tbuf_output(kva_context *ctx, tbuf *t, kva_dtype dt, int view, int64_t tokens,
                        int32_t heads, int32_t D) {
    tbuf_layout(t, dt, view, tokens, heads, D);
    t->dev = cuda_test_poisoned(ctx, t->bytes);
    t->d = view_of(view, t->dev, dt, t->alloc_tokens, heads, D);
    return t->dev != NULL;
}

static void tbuf_poison(kva_context *ctx, tbuf *t) { poison_device(ctx, t->dev, t->bytes); }

/* Downloads an output into t->host (t->h views it). */
static void tbuf_fetch(kva_context *ctx, tbuf *t) {
    free(t->host);
    t->host = cuda_test_download(ctx, t->dev, t->bytes);
    t->h = view_of(t->view, t->host, t->dt, t->alloc_tokens, t->heads, t->D);
}

static void tbuf_free(kva_context *ctx, tbuf *t) {
    free(t->host);
    if (t->dev) kva_free(ctx, t->dev);
    memset(t, 0, sizeof *t);
}

/* Outputs: bytes outside rows [0, tokens) x heads x D (padding, guard rows) are still poison. */
static void check_untouched(const char *what, const tbuf *t) {
    unsigned char *c = kva_test_alloc(t->bytes);
    memcpy(c, t->host, t->bytes);
    const size_t es = kva_dtype_size(t->dt);
    for (int64_t i = 0; i < t->tokens; ++i)
        for (int32_t h = 0; h < t->heads; ++h)
            memset(c + (size_t)(i * t->h.stride_token + h * t->h.stride_head) * es, 0xFF,
                   (size_t)t->D * es);
    size_t changed = 0;
    for (size_t i = 0; i < t->bytes; ++i) changed += c[i] != 0xFF;
    CHECK_MSG(changed == 0, "%s: %zu bytes outside the output rows were written", what, changed);
    free(c);
}

/* LSE buffers: f32 [rows][heads] plus guard floats that must stay poison. */
#define LSE_GUARD 16

static void check_lse_guard(const char *what, const float *lse, size_t n) {
    const unsigned char *g = (const unsigned char *)(lse + n);
    size_t changed = 0;
    for (size_t i = 0; i < LSE_GUARD * sizeof(float); ++i) changed += g[i] != 0xFF;
    CHECK_MSG(changed == 0, "%s: %zu bytes after the LSE rows were written", what, changed);
}

/* ---- batches ------------------------------------------------------------------------------ */

typedef struct batch {
    int32_t n;
    int32_t *qo, *kv;               /* [n] */
    int32_t *qo_indptr, *kv_indptr; /* [n + 1] */
    int32_t total_qo, total_kv;
} batch;

static void batch_alloc(batch *b, int32_t n) {
    memset(b, 0, sizeof *b);
    b->n = n;
    b->qo = kva_test_alloc(sizeof(int32_t) * (size_t)n);
    b->kv = kva_test_alloc(sizeof(int32_t) * (size_t)n);
    b->qo_indptr = kva_test_alloc(sizeof(int32_t) * (size_t)(n + 1));
    b->kv_indptr = kva_test_alloc(sizeof(int32_t) * (size_t)(n + 1));
}

/* Fills the indptrs from qo / kv. */
static void batch_finish(batch *b) {
    b->qo_indptr[0] = b->kv_indptr[0] = 0;
    for (int32_t i = 0; i < b->n; ++i) {
        b->qo_indptr[i + 1] = b->qo_indptr[i] + b->qo[i];
        b->kv_indptr[i + 1] = b->kv_indptr[i] + b->kv[i];
    }
    b->total_qo = b->qo_indptr[b->n];
    b->total_kv = b->kv_indptr[b->n];
}

static void batch_from(batch *b, int32_t n, const int32_t *qo, const int32_t *kv) {
    batch_alloc(b, n);
    memcpy(b->qo, qo, sizeof(int32_t) * (size_t)n);
    memcpy(b->kv, kv, sizeof(int32_t) * (size_t)n);
    batch_finish(b);
}

static void batch_free(batch *b) {
    free(b->qo);
    free(b->kv);
    free(b->qo_indptr);
    free(b->kv_indptr);
    memset(b, 0, sizeof *b);
}

/* Query lengths around the 16-row MMA fragment and the 64 / 128-row tiles. A sweep takes them
 * in turn (edge_next) so every one is met, whatever the random draws. */
/* query runs at the tile edges: 128-row items (groups 1, 2, 4 at d128 / d256) and 192-row ones
 * (d64 on Hopper: 192, 96, 48 tokens) */
static const int32_t qo_edges[] = {1, 2, 15, 16, 17, 47, 48, 49, 95, 96, 97, 127, 128, 129, 191, 192, 193};
#define NUM_QO_EDGES ((int)(sizeof qo_edges / sizeof qo_edges[0]))
static int edge_next;

static int32_t odd_len(kva_rng *rng, int32_t lo, int32_t hi) {
    if (hi <= lo) return hi;
    int32_t n = kva_rng_int(rng, lo, hi);
    return n % 2 ? n : n - 1 >= lo ? n - 1 : n + 1 <= hi ? n + 1 : n;
}

static int32_t pick_qo(kva_rng *rng, int32_t max_qo, bool allow_zero) {
    int r = kva_rng_int(rng, 0, 9);
    if (r == 0 && allow_zero) return 0;
    if (r <= 5)
        for (int t = 0; t < NUM_QO_EDGES; ++t) {
            int32_t e = qo_edges[edge_next++ % NUM_QO_EDGES];
            if (e <= max_qo) return e;
        }
    return odd_len(rng, 3, max_qo);
}

/* n requests. Most are chunked prefill: kv = cached prefix (0, 1 or odd) + the new queries.
 * With `over`, about one in six has fewer keys than queries (0, 1 or odd keys). */
static void batch_random(batch *b, kva_rng *rng, int32_t n, int32_t max_qo, int32_t max_prefix,
                         bool over) {
    batch_alloc(b, n);
    for (int32_t i = 0; i < n; ++i) {
        int32_t qo = pick_qo(rng, max_qo, n > 1), kv;
        if (over && qo > 1 && kva_rng_int(rng, 0, 5) == 0) {
            int r = kva_rng_int(rng, 0, 2);
            kv = r == 0 ? 0 : r == 1 ? 1 : odd_len(rng, 1, qo - 1);
        } else {
            int r = kva_rng_int(rng, 0, 3);
            kv = qo + (r == 0 ? 0 : r == 1 ? 1 : odd_len(rng, 3, max_prefix));
        }
        b->qo[i] = qo;
        b->kv[i] = kv;
    }
    batch_finish(b);
    if (b->total_qo == 0) { /* keep every buffer non-empty */
        b->qo[0] = 1;
        b->kv[0] += 1;
        batch_finish(b);
    }
}

/* ---- one case: inputs, reference, plans and runs -------------------------------------------- */

enum { PLAN_AUTO = 1, PLAN_SPLIT = 2, PLAN_NOSPLIT = 4, PLAN_ALL = 7 };

typedef struct prefill_case {
    kva_dtype dtype;
    int32_t hq, hk, head_dim;
    int causal;
    int32_t window;   /* < 0: none */
    float cap, scale; /* <= 0: none / 1/sqrt(D) */
    int q_view, k_view, v_view, o_view; /* VIEW_*; k and v for ragged cases */
    int32_t page_size; /* 0: ragged K/V; else paged */
    int pool_layout;   /* CUDA_TEST_*, paged cases */
    bool with_lse;
    int plans; /* PLAN_* */
} prefill_case;

static void case_name(const prefill_case *c, const batch *b, char *s, size_t n) {
    int len = snprintf(s, n, "%s D=%d heads %d/%d batch %d (%d q, %d kv) causal %d window %d cap %g "
                       "scale %g q %s o %s lse %d",
                       kva_dtype_name(c->dtype), c->head_dim, c->hq, c->hk, b->n, b->total_qo,
                       b->total_kv, c->causal, c->window, (double)c->cap, (double)c->scale,
                       view_name(c->q_view), view_name(c->o_view), c->with_lse);
    if (len > 0 && (size_t)len < n) {
        if (c->page_size)
            snprintf(s + len, n - (size_t)len, " paged %s page %d",
                     cuda_test_layout_name(c->pool_layout), c->page_size);
        else
            snprintf(s + len, n - (size_t)len, " ragged k %s v %s", view_name(c->k_view),
                     view_name(c->v_view));
    }
}

static void print_lens(const batch *b) {
    printf("    lengths (qo/kv):");
    for (int32_t i = 0; i < b->n; ++i) printf(" %d/%d", b->qo[i], b->kv[i]);
    printf("\n");
}

typedef struct problem {
    const prefill_case *c;
    const batch *b;
    kva_attn_params p;
    tbuf q, k, v;            /* k, v: ragged cases */
    cuda_paged_batch pool;   /* paged cases */
    double *o_ref, *lse_ref; /* [total_qo][hq][D], [total_qo][hq] */
} problem;

static kva_attn_params case_params(const prefill_case *c) {
    kva_attn_params p = kva_attn_params_default(c->hq, c->hk, c->head_dim);
    p.causal = c->causal;
    p.window_left = c->window;
    p.logits_soft_cap = c->cap;
    p.sm_scale = c->scale;
    return p;
}

/* Expected o / lse of every request, from the host copies of the inputs. */
static void problem_reference(problem *pr) {
    const batch *b = pr->b;
    const int32_t Hq = pr->c->hq, Hk = pr->c->hk, D = pr->c->head_dim;
    int32_t max_qo = 1, max_kv = 1;
    for (int32_t i = 0; i < b->n; ++i) {
        if (b->qo[i] > max_qo) max_qo = b->qo[i];
        if (b->kv[i] > max_kv) max_kv = b->kv[i];
    }
    double *qd = kva_test_alloc(sizeof(double) * (size_t)max_qo * Hq * D);
    double *kd = kva_test_alloc(sizeof(double) * (size_t)max_kv * Hk * D);
    double *vd = kva_test_alloc(sizeof(double) * (size_t)max_kv * Hk * D);
    for (int32_t i = 0; i < b->n; ++i) {
        const int32_t row = b->qo_indptr[i];
        kva_ref_read_tensor(pr->q.h, row, b->qo[i], Hq, D, qd);
        if (pr->c->page_size) {
            int32_t len = kva_ref_read_paged(&pr->pool.host_pages, &pr->pool.table, i, kd, vd);
            CHECK(len == b->kv[i]);
        } else {
            kva_ref_read_tensor(pr->k.h, b->kv_indptr[i], b->kv[i], Hk, D, kd);
            kva_ref_read_tensor(pr->v.h, b->kv_indptr[i], b->kv[i], Hk, D, vd);
        }
        kva_ref_attention(&pr->p, b->qo[i], b->kv[i], qd, kd, vd, pr->o_ref + (size_t)row * Hq * D,
                          pr->lse_ref + (size_t)row * Hq);
    }
    free(qd);
    free(kd);
    free(vd);
}

static void problem_free(kva_context *ctx, problem *pr) {
    tbuf_free(ctx, &pr->q);
    tbuf_free(ctx, &pr->k);
    tbuf_free(ctx, &pr->v);
    if (pr->pool.indptr) cuda_paged_batch_free(ctx, &pr->pool);
    free(pr->o_ref);
    free(pr->lse_ref);
    memset(pr, 0, sizeof *pr);
}

/* Random inputs for the case and batch on the device and the host; with_ref: the reference. */
static bool problem_make(kva_context *ctx, kva_rng *rng, const prefill_case *c, const batch *b,
                         bool with_ref, problem *pr) {
    memset(pr, 0, sizeof *pr);
    pr->c = c;
    pr->b = b;
    pr->p = case_params(c);
    const int32_t D = c->head_dim;
    bool ok = tbuf_input(ctx, rng, &pr->q, c->dtype, c->q_view, b->total_qo, c->hq, D, -2.f, 2.f);
    if (c->page_size)
        ok = ok && cuda_paged_batch_make(ctx, rng, c->dtype, b->n, b->kv, c->hk, D, c->page_size,
                                         c->pool_layout, &pr->pool);
    else
        ok = ok &&
             tbuf_input(ctx, rng, &pr->k, c->dtype, c->k_view, b->total_kv, c->hk, D, -1.f, 1.f) &&
             tbuf_input(ctx, rng, &pr->v, c->dtype, c->v_view, b->total_kv, c->hk, D, -1.f, 1.f);
    if (!ok) return false;
    if (with_ref) {
        const size_t rows = (size_t)b->total_qo * c->hq;
        pr->o_ref = kva_test_alloc(sizeof(double) * rows * D);
        pr->lse_ref = kva_test_alloc(sizeof(double) * rows);
        problem_reference(pr);
    }
    return true;
}

/* The forced-split plans' smallest fixed chunk size. */
#define FORCED_CHUNK_MIN 5

static kva_plan_limits problem_limits(const problem *pr) {
    kva_plan_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.max_batch = pr->b->n;
    lim.max_total_qo = pr->b->total_qo;
    lim.max_total_kv = pr->b->total_kv;
    lim.num_qo_heads = pr->c->hq;
    lim.num_kv_heads = pr->c->hk;
    lim.head_dim = pr->c->head_dim;
    /* sized for the forced splits' smallest chunk (check_case), so they split on any device
     * (0 keys: max_total_kv 0 means "unbounded", which min_fixed_chunk refuses); only for cases
     * that plan them: the partial states of 5-key chunks of long prefixes take gigabytes */
    if (pr->b->total_kv > 0 && (pr->c->plans & PLAN_SPLIT)) lim.min_fixed_chunk = FORCED_CHUNK_MIN;
    if (pr->c->page_size) {
        lim.page_size = pr->c->page_size;
        lim.max_total_pages = pr->pool.indptr[pr->b->n];
    }
    return lim;
}

/* Plans into ws. A fixed chunk size needing more partial states than the workspace holds (it
 * is sized for the device's block budget) is doubled until it fits, so forced splits stay as
 * fine as the workspace allows. */
static kva_status make_plan(kva_context *ctx, const problem *pr, const kva_plan_limits *lim,
                            const kva_plan_options *opt, kva_workspace ws, kva_plan *plan) {
    kva_plan_options o = *opt;
    const batch *b = pr->b;
    for (;;) {
        kva_status st =
            pr->c->page_size
                ? kva_prefill_plan(ctx, lim, b->n, b->qo_indptr, NULL, &pr->pool.table,
                                   pr->pool.num_pages, &o, ws, plan)
                : kva_prefill_plan(ctx, lim, b->n, b->qo_indptr, b->kv_indptr, NULL, 0, &o, ws, plan);
        if (st != KVA_ERR_WORKSPACE_TOO_SMALL || o.fixed_chunk_size <= 0 ||
            o.fixed_chunk_size > b->total_kv)
            return st;
        o.fixed_chunk_size *= 2;
    }
}

/* A workspace for the limits whose device part is poisoned. */
static bool workspace_make(kva_context *ctx, const kva_plan_limits *lim, kva_workspace *ws) {
    memset(ws, 0, sizeof *ws);
    kva_status st = kva_prefill_workspace_size(ctx, lim, &ws->device_bytes, &ws->host_bytes);
    if (st == KVA_OK) st = kva_malloc(ctx, ws->device_bytes, &ws->device);
    if (st == KVA_OK) st = kva_host_alloc(ctx, ws->host_bytes, &ws->host);
    CHECK_MSG(st == KVA_OK, "prefill workspace: %s (%s)", kva_status_str(st), kva_last_error());
    if (st != KVA_OK) return false;
    poison_device(ctx, ws->device, ws->device_bytes);
    return true;
}

static void workspace_free(kva_context *ctx, kva_workspace *ws) {
    if (ws->device) kva_free(ctx, ws->device);
    if (ws->host) kva_host_free(ctx, ws->host);
    memset(ws, 0, sizeof *ws);
}

/* What one plan + run produced (host copies). */
typedef struct run_out {
    tbuf o;
    float *lse; /* host copy, NULL without LSE */
    int32_t split, chunk, num_work;
    bool ok;
    int32_t num_groups, merge_groups; /* the plan header's (a cut plan: merge_groups 1) */
} run_out;

static void run_out_free(kva_context *ctx, run_out *r) {
    tbuf_free(ctx, &r->o);
    free(r->lse);
    memset(r, 0, sizeof *r);
}

/* Plans with opt into a fresh poisoned workspace, runs into poisoned o / lse, downloads. */
static void plan_and_run(kva_context *ctx, const problem *pr, const kva_plan_options *opt,
                         const char *what, run_out *out) {
    memset(out, 0, sizeof *out);
    const prefill_case *c = pr->c;
    const int32_t Hq = c->hq, D = c->head_dim;
    const size_t rows = (size_t)pr->b->total_qo * Hq;
    kva_plan_limits lim = problem_limits(pr);
    kva_workspace ws;
    float *lse_dev = NULL;
    if (!workspace_make(ctx, &lim, &ws)) return;
    if (!tbuf_output(ctx, &out->o, c->dtype, c->o_view, pr->b->total_qo, Hq, D)) goto done;
    if (c->with_lse && !(lse_dev = cuda_test_poisoned(ctx, sizeof(float) * (rows + LSE_GUARD))))
        goto done;
    kva_plan plan;
    kva_status st = make_plan(ctx, pr, &lim, opt, ws, &plan);
    CHECK_MSG(st == KVA_OK, "%s: plan: %s (%s)", what, kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto done;
    out->split = plan.split_kv;
    out->chunk = plan.kv_chunk_size;
    out->num_work = plan.num_work;
    out->num_groups = kva__plan_header_of(ws.host)->num_groups;
    out->merge_groups = kva__plan_header_of(ws.host)->merge_groups;
    st = c->page_size ? kva_prefill_run_paged(ctx, &plan, &pr->p, pr->q.d, &pr->pool.dev_pages,
                                              out->o.d, lse_dev)
                      : kva_prefill_run_ragged(ctx, &plan, &pr->p, pr->q.d, pr->k.d, pr->v.d,
                                               out->o.d, lse_dev);
    CHECK_MSG(st == KVA_OK, "%s: run: %s (%s)", what, kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto done;
    CHECK_OK(kva_synchronize(ctx));
    tbuf_fetch(ctx, &out->o);
    if (lse_dev) out->lse = cuda_test_download(ctx, lse_dev, sizeof(float) * (rows + LSE_GUARD));
    out->ok = true;
done:
    kva_free(ctx, lse_dev);
    workspace_free(ctx, &ws);
}

/* Compares a run with the reference: values, LSE, and nothing written outside the rows. */
static void check_against_reference(const problem *pr, const run_out *r, const char *what) {
    const prefill_case *c = pr->c;
    const size_t rows = (size_t)pr->b->total_qo * c->hq;
    kva_compare_tensor(what, r->o.h, pr->b->total_qo, c->hq, c->head_dim, pr->o_ref,
                       kva_tol_for(c->dtype), NULL);
    check_untouched(what, &r->o);
    if (r->lse) {
        kva_compare_lse(what, r->lse, pr->lse_ref, rows, c->dtype, NULL);
        check_lse_guard(what, r->lse, rows);
    }
}

/* Forced-split plans that really split, so the sweeps can insist the merge path ran. */
static int splits_seen;

/* Runs the case with each plan kind in c->plans; each must match the reference. */
static void check_case(kva_context *ctx, kva_rng *rng, const prefill_case *c, const batch *b) {
    const int before = kva_test_failures;
    char name[400];
    case_name(c, b, name, sizeof name);
    problem pr;
    if (problem_make(ctx, rng, c, b, true, &pr)) {
        static const char *kinds[3] = {"auto", "split", "no-split"};
        for (int k = 0; k < 3; ++k) {
            if (!(c->plans & (1 << k))) continue;
            kva_plan_options opt = {0, 0, KVA_DECODE_PARTIAL_ROWMAX};
            if (k == 1) opt.fixed_chunk_size = kva_rng_int(rng, FORCED_CHUNK_MIN, 40);
            if (k == 2) opt.flags = KVA_PLAN_NO_SPLIT;
            char what[480];
            snprintf(what, sizeof what, "%s [%s plan]", name, kinds[k]);
            const int f0 = kva_test_failures;
            run_out r;
            plan_and_run(ctx, &pr, &opt, what, &r);
            if (r.ok) {
                check_against_reference(&pr, &r, what);
                if (k == 1 && r.split) ++splits_seen;
                if (k == 2) CHECK_MSG(!r.split, "%s: an unsplit plan split", what);
            }
            if (kva_test_failures != f0)
                printf("    %s plan: chunk %d, %d work items, split %d\n", kinds[k], r.chunk,
                       r.num_work, r.split);
            run_out_free(ctx, &r);
        }
    }
    problem_free(ctx, &pr);
    if (kva_test_failures != before) {
        printf("    case: %s\n", name);
        print_lens(b);
    }
}

/* (query heads, KV heads): GQA groups 1, 2, 4, 8 and the odd 3 and 7. */
static const int32_t head_pairs[][2] = {{4, 4}, {8, 2}, {8, 1}, {16, 2}, {6, 2},
                                        {2, 1}, {7, 1}, {4, 1}, {21, 3}};
#define NUM_HEAD_PAIRS ((int)(sizeof head_pairs / sizeof head_pairs[0]))

static const kva_dtype dtypes[3] = {KVA_BF16, KVA_F16, KVA_F32};
static const int32_t head_dims[3] = {64, 128, 256};

static prefill_case plain_case(kva_dtype dt, int32_t D, int idx) {
    prefill_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dt;
    c.head_dim = D;
    c.hq = head_pairs[idx % NUM_HEAD_PAIRS][0];
    c.hk = head_pairs[idx % NUM_HEAD_PAIRS][1];
    c.causal = idx % 3 != 2;
    c.window = -1;
    c.q_view = idx % NUM_VIEWS;
    c.k_view = (idx / 3) % NUM_VIEWS;
    c.v_view = v_view_for(c.k_view, (idx + 1) % NUM_VIEWS);
    c.o_view = (idx / 2) % NUM_VIEWS;
    c.with_lse = idx % 4 != 3;
    c.plans = PLAN_ALL;
    return c;
}

/* ---- the sweeps ---------------------------------------------------------------------------- */

KVA_TEST(cuda_prefill_ragged_sweep) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t sizes[3] = {1, 7, 37};
    splits_seen = 0;
    int idx = 0;
    for (int di = 0; di < 3; ++di)
        for (int hi = 0; hi < 3; ++hi)
            for (int si = 0; si < 3; ++si, ++idx) {
                if (quick() && !(head_dims[hi] == 128 && si < 2) && idx % 9 != 4) continue;
                prefill_case c = plain_case(dtypes[di], head_dims[hi], idx);
                /* 21 query heads make the host reference expensive: small batches only */
                if (c.hq == 21 && sizes[si] == 37) c.hq = 9;
                const int32_t n = sizes[si];
                batch b;
                batch_random(&b, &rng, n, n == 37 ? 40 : quick() ? 70 : 129,
                             n == 37 ? 60 : quick() ? 80 : 200, true);
                check_case(ctx, &rng, &c, &b);
                batch_free(&b);
                if (kva_test_failures > 20) goto out;
            }
    {
        /* 1000 queries (few heads: the float64 reference is the cost), with a short neighbour */
        prefill_case c = plain_case(KVA_BF16, 128, 1);
        c.hq = 2;
        c.hk = 1;
        c.causal = 1;
        c.with_lse = true;
        if (quick()) c.plans = PLAN_SPLIT;
        const int32_t qo[2] = {1000, 17}, kv[2] = {1037, 17};
        batch b;
        batch_from(&b, 2, qo, kv);
        check_case(ctx, &rng, &c, &b);
        batch_free(&b);
    }
    CHECK_MSG(splits_seen > 0, "no forced-split plan split: the merge path went untested");
out:
    kva_context_destroy(ctx);
}

KVA_TEST(cuda_prefill_paged_sweep) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t page_sizes[4] = {1, 3, 16, 64}, sizes[3] = {1, 7, 37};
    splits_seen = 0;
    int idx = 0;
    for (int pi = 0; pi < 4; ++pi)
        for (int layout = 0; layout < CUDA_TEST_NUM_LAYOUTS; ++layout, ++idx) {
            if (quick() && (idx % 4) != 0) continue;
            prefill_case c = plain_case(dtypes[idx % 3], head_dims[(idx / 3) % 3], idx + 2);
            c.page_size = page_sizes[pi];
            c.pool_layout = layout;
            if (c.hq == 21) c.hq = 9;
            const int32_t n = sizes[idx % 3];
            batch b;
            batch_random(&b, &rng, n, n == 37 ? 40 : quick() ? 60 : 129,
                         n == 37 ? 70 : quick() ? 100 : 300, true);
            check_case(ctx, &rng, &c, &b);
            batch_free(&b);
            if (kva_test_failures > 20) goto out;
        }
    if (!quick()) {
        /* 1000 new queries over a 513-token cached prefix, odd GQA group */
        prefill_case c = plain_case(KVA_F16, 64, 0);
        c.hq = 3;
        c.hk = 1;
        c.causal = 1;
        c.with_lse = true;
        c.page_size = 16;
        c.pool_layout = CUDA_TEST_HND_INTERLEAVED;
        const int32_t qo[1] = {1000}, kv[1] = {1513};
        batch b;
        batch_from(&b, 1, qo, kv);
        check_case(ctx, &rng, &c, &b);
        batch_free(&b);
    }
    CHECK_MSG(splits_seen > 0, "no forced-split plan split: the merge path went untested");
out:
    kva_context_destroy(ctx);
}

/* Short query runs over long cached prefixes (chunked prefill of a few tokens), and a request whose
 * last item is short: items in which a consumer warpgroup of the Hopper kernel holds no query row
 * yet the item has a dozen or more key tiles. A warpgroup that skips such tiles (v6.38's G::SKIP:
 * on at d = 256; at d64 / d128 only with -DKVA__HP_SKIP=1 -DKVA__HP_PINGPONG=0, the turns keep it
 * off there) must still release every K and V stage in an order the producers can follow:
 * draining all K stages before any V stage deadlocks once the item has more than 2 x STAGES + 1
 * tiles (bench/NOTES.md, v6.38). Unsplit plans keep every tile in one item. */
KVA_TEST(cuda_prefill_short_items_over_long_prefix) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* (g = 4: 16 tokens are one warpgroup's 64 rows; g = 1: 64) */
    /* (528 tokens: a last item of 16 tokens at 32 or 128 tokens per item; a prefix of 1520 keys,
     * 48 past a 64-key tile boundary: at d = 256 and g = 4 the first warpgroup of every other item
     * ends its rows just before a tile that the second warpgroup's rows reach, so it skips that
     * tile while holding rows -- a count one tile short fails here) */
    const int32_t qo[6] = {1, 16, 40, 65, 528, 100}, kv[6] = {1501, 1516, 1540, 1565, 528, 1620};
    static const int32_t pairs[2][2] = {{8, 2}, {4, 4}};
    for (int di = 0; di < 3; ++di)
        for (int gi = 0; gi < 2; ++gi)
            for (int mask = 0; mask < 2; ++mask) {
                if (quick() && (gi + mask + di) % 2) continue;
                prefill_case c = plain_case(KVA_BF16, head_dims[di], 0);
                c.hq = pairs[gi][0];
                c.hk = pairs[gi][1];
                c.causal = mask == 0;
                c.with_lse = true;
                c.plans = PLAN_AUTO | PLAN_NOSPLIT;
                c.page_size = (di + gi) % 2 ? 16 : 0;
                c.pool_layout = CUDA_TEST_NHD;
                batch b;
                batch_from(&b, 6, qo, kv);
                check_case(ctx, &rng, &c, &b);
                batch_free(&b);
                if (kva_test_failures > 20) goto out;
            }
out:
    kva_context_destroy(ctx);
}

KVA_TEST(cuda_prefill_variants) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* dtype, D, heads, causal, window, cap, scale, page size (0 ragged), lse */
    struct {
        kva_dtype dt;
        int32_t D, hq, hk, causal, window;
        float cap, scale;
        int32_t page;
        bool lse;
    } v[] = {
        {KVA_BF16, 128, 8, 2, 1, 0, 0.f, 0.f, 0, true},      /* each query sees itself only */
        {KVA_F16, 64, 4, 1, 1, 13, 0.f, 0.f, 16, true},      /* window inside a tile */
        {KVA_F32, 128, 4, 4, 0, 30, 0.f, 0.f, 0, true},      /* window without causal */
        {KVA_BF16, 256, 6, 2, 1, 100000, 0.f, 0.f, 3, true}, /* window wider than every request */
        {KVA_BF16, 128, 16, 2, 1, -1, 3.0f, 0.f, 16, true},  /* soft cap */
        {KVA_F16, 64, 8, 8, 1, 20, 30.0f, 0.f, 0, true},     /* soft cap + window */
        {KVA_F32, 64, 7, 1, 0, -1, 0.f, 0.3f, 0, true},      /* custom scale, full attention */
        {KVA_BF16, 128, 4, 2, 1, 7, 1.5f, 0.05f, 3, true},   /* everything at once */
        {KVA_F16, 256, 8, 4, 1, -1, 0.f, 0.2f, 64, false},   /* no LSE */
        {KVA_F32, 256, 2, 1, 1, 40, 2.0f, 0.f, 1, true},
        /* a cap far above the scores: tanh(x) ~ x must keep x's digits (f32: the accurate
         * tanh's series; 16-bit: the hardware tanh's relative error) */
        {KVA_F32, 128, 4, 2, 1, -1, 1.0e5f, 0.f, 16, true},
        {KVA_BF16, 64, 8, 2, 0, -1, 3.0e4f, 0.f, 0, true},
    };
    const int nv = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i < nv; ++i) {
        if (quick() && i % 2) continue;
        prefill_case c = plain_case(v[i].dt, v[i].D, i);
        c.hq = v[i].hq;
        c.hk = v[i].hk;
        c.causal = v[i].causal;
        c.window = v[i].window;
        c.cap = v[i].cap;
        c.scale = v[i].scale;
        c.page_size = v[i].page;
        c.pool_layout = i % CUDA_TEST_NUM_LAYOUTS;
        c.with_lse = v[i].lse;
        batch b;
        batch_random(&b, &rng, 7, quick() ? 70 : 129, quick() ? 80 : 200, true);
        check_case(ctx, &rng, &c, &b);
        batch_free(&b);
        if (kva_test_failures > 20) break;
    }
    kva_context_destroy(ctx);
}

/* ---- dense attention ------------------------------------------------------------------------ */

typedef struct dense_case {
    kva_dtype dt;
    int32_t D, hq, hk, qo, kv, causal, window;
    float cap, scale;
    int view;
    bool lse;
} dense_case;

/* kva_attention on one sequence against the reference; returns the downloaded o and lse (if
 * wanted by the caller: o_keep / lse_keep) for bitwise comparisons. */
static void check_dense(kva_context *ctx, kva_rng *rng, const dense_case *d, tbuf *qk_in,
                        tbuf *k_in, tbuf *v_in, bool compare, void **o_keep, float **lse_keep) {
    const int before = kva_test_failures;
    char what[256];
    snprintf(what, sizeof what, "dense %s D=%d heads %d/%d qo %d kv %d causal %d window %d cap %g "
             "scale %g %s lse %d",
             kva_dtype_name(d->dt), d->D, d->hq, d->hk, d->qo, d->kv, d->causal, d->window,
             (double)d->cap, (double)d->scale, view_name(d->view), d->lse);
    tbuf q = {0}, k = {0}, v = {0}, o = {0};
    float *lse_dev = NULL, *lse = NULL;
    double *o_ref = NULL, *lse_ref = NULL;
    const size_t rows = (size_t)d->qo * d->hq;
    /* inputs are made here unless the caller owns them (causal independence) */
    tbuf *pq = qk_in ? qk_in : &q, *pk = k_in ? k_in : &k, *pv = v_in ? v_in : &v;
    if (!qk_in && !(tbuf_input(ctx, rng, &q, d->dt, d->view, d->qo, d->hq, d->D, -2.f, 2.f) &&
                    tbuf_input(ctx, rng, &k, d->dt, (d->view + 1) % NUM_VIEWS, d->kv, d->hk, d->D,
                               -1.f, 1.f) &&
                    tbuf_input(ctx, rng, &v, d->dt, v_view_for((d->view + 1) % NUM_VIEWS, d->view), d->kv,
                               d->hk, d->D, -1.f, 1.f)))
        goto done;
    if (!tbuf_output(ctx, &o, d->dt, d->view, d->qo, d->hq, d->D)) goto done;
    if (d->lse && !(lse_dev = cuda_test_poisoned(ctx, sizeof(float) * (rows + LSE_GUARD)))) goto done;
    kva_attn_params p = kva_attn_params_default(d->hq, d->hk, d->D);
    p.causal = d->causal;
    p.window_left = d->window;
    p.logits_soft_cap = d->cap;
    p.sm_scale = d->scale;
    kva_status st = kva_attention(ctx, &p, d->qo, d->kv, pq->d, pk->d, pv->d, o.d, lse_dev);
    CHECK_MSG(st == KVA_OK, "%s: %s (%s)", what, kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto done;
    CHECK_OK(kva_synchronize(ctx));
    tbuf_fetch(ctx, &o);
    check_untouched(what, &o);
    if (lse_dev) {
        lse = cuda_test_download(ctx, lse_dev, sizeof(float) * (rows + LSE_GUARD));
        check_lse_guard(what, lse, rows);
    }
    if (compare) {
        double *qd = kva_test_alloc(sizeof(double) * (rows * d->D + 1));
        double *kd = kva_test_alloc(sizeof(double) * ((size_t)d->kv * d->hk * d->D + 1));
        double *vd = kva_test_alloc(sizeof(double) * ((size_t)d->kv * d->hk * d->D + 1));
        o_ref = kva_test_alloc(sizeof(double) * (rows * d->D + 1));
        lse_ref = kva_test_alloc(sizeof(double) * (rows + 1));
        kva_ref_read_tensor(pq->h, 0, d->qo, d->hq, d->D, qd);
        kva_ref_read_tensor(pk->h, 0, d->kv, d->hk, d->D, kd);
        kva_ref_read_tensor(pv->h, 0, d->kv, d->hk, d->D, vd);
        kva_ref_attention(&p, d->qo, d->kv, qd, kd, vd, o_ref, lse_ref);
        kva_compare_tensor(what, o.h, d->qo, d->hq, d->D, o_ref, kva_tol_for(d->dt), NULL);
        if (lse) kva_compare_lse(what, lse, lse_ref, rows, d->dt, NULL);
        free(qd);
        free(kd);
        free(vd);
    }
    if (o_keep) { /* packed copy of the rows */
        size_t es = kva_dtype_size(d->dt), row = (size_t)d->D * es;
        unsigned char *pk_o = kva_test_alloc(rows * row + 1);
        for (int32_t i = 0; i < d->qo; ++i)
            for (int32_t h = 0; h < d->hq; ++h)
                memcpy(pk_o + ((size_t)i * d->hq + h) * row,
                       (unsigned char *)o.host + (size_t)(i * o.h.stride_token + h * o.h.stride_head) * es,
                       row);
        *o_keep = pk_o;
    }
    if (lse_keep) {
        *lse_keep = lse;
        lse = NULL;
    }
    if (kva_test_failures != before) printf("    case: %s\n", what);
done:
    free(lse);
    free(o_ref);
    free(lse_ref);
    kva_free(ctx, lse_dev);
    tbuf_free(ctx, &o);
    tbuf_free(ctx, &q);
    tbuf_free(ctx, &k);
    tbuf_free(ctx, &v);
}

KVA_TEST(cuda_prefill_dense) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const dense_case cases[] = {
        /* dt, D, hq, hk, qo, kv, causal, window, cap, scale, view, lse */
        {KVA_BF16, 128, 8, 2, 129, 129, 1, -1, 0.f, 0.f, VIEW_NHD, true},  /* self-attention */
        {KVA_F16, 64, 4, 1, 17, 301, 1, -1, 0.f, 0.f, VIEW_HND, true},     /* chunk after a prefix */
        {KVA_F32, 128, 2, 2, 300, 17, 1, -1, 0.f, 0.f, VIEW_PADDED, true}, /* 283 rows see no key */
        {KVA_BF16, 64, 4, 2, 128, 0, 0, -1, 0.f, 0.f, VIEW_NHD, true},     /* no keys at all */
        {KVA_BF16, 256, 7, 1, 1, 1000, 1, -1, 0.f, 0.f, VIEW_HND, true},   /* one query, odd group */
        {KVA_F16, 256, 8, 4, 16, 16, 0, 5, 2.0f, 0.f, VIEW_PADDED, true},  /* window + cap */
        {KVA_F32, 64, 2, 1, 2, 1, 1, -1, 0.f, 0.f, VIEW_NHD, true},        /* row 0 sees no key */
        {KVA_F16, 128, 21, 3, 15, 127, 0, -1, 0.f, 0.25f, VIEW_HND, false}, /* group 7, no LSE */
        {KVA_BF16, 64, 16, 2, 127, 255, 1, 31, 0.f, 0.f, VIEW_NHD, true},  /* group 8 + window */
        {KVA_F32, 256, 1, 1, 1000, 1000, 1, -1, 0.f, 0.f, VIEW_NHD, true}, /* 1000 queries */
        {KVA_BF16, 128, 2, 1, 1000, 1001, 0, -1, 0.f, 0.f, VIEW_HND, true},
        /* windows so wide that position - window wraps in 32 bits (positions are negative when
         * a request has more queries than keys): they must hide nothing */
        {KVA_BF16, 128, 4, 2, 100, 50, 1, INT32_MAX, 0.f, 0.f, VIEW_NHD, true},
        {KVA_F32, 64, 2, 1, 40, 10, 0, INT32_MAX - 1, 0.f, 0.f, VIEW_NHD, true},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; ++i) {
        if (quick() && (i % 3 == 1 || i == n - 1)) continue;
        check_dense(ctx, &rng, &cases[i], NULL, NULL, NULL, true, NULL, NULL);
        if (kva_test_failures > 20) break;
    }
    kva_context_destroy(ctx);
}

/* Head dims between the built kernels (64, 128, 256): each runs on the next built one with Q,
 * K and V zero-filled past the real dim (tensor maps whose inner extent is the real dim on the
 * Hopper path, predicated copies elsewhere) and o / partial states stored only inside it (o is
 * poisoned; with dense o a store past the dim would clobber the next head, and split plans read
 * partial rows of the real dim). Ragged and paged (page sizes 3 and 16), every dtype, causal and
 * full, split and unsplit plans, then kva_attention. d160 and d192 leave whole 64-column blocks
 * past the dim (copies entirely outside the tensor). */
KVA_TEST(cuda_prefill_head_dims_match_reference) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t dims[] = {32, 48, 80, 96, 112, 144, 160, 192, 208, 240};
    const int32_t quick_dims[] = {32, 96, 192};
    const int nd = quick() ? 3 : 10;
    splits_seen = 0;
    int idx = 0;
    for (int di = 0; di < 3; ++di)
        for (int k = 0; k < nd; ++k, ++idx) {
            if (quick() && dtypes[di] == KVA_F16) continue;
            prefill_case c = plain_case(dtypes[di], quick() ? quick_dims[k] : dims[k], idx);
            if (c.hq == 21) c.hq = 9;
            /* (padded o: a store past the dim lands in poisoned padding, which must stay) */
            c.o_view = idx % 2 ? VIEW_NHD : VIEW_PADDED;
            batch b;
            batch_random(&b, &rng, idx % 2 ? 7 : 1, quick() ? 70 : 129, quick() ? 90 : 200, true);
            check_case(ctx, &rng, &c, &b);
            batch_free(&b);
            c.page_size = idx % 2 ? 3 : 16;
            c.pool_layout = idx % CUDA_TEST_NUM_LAYOUTS;
            batch_random(&b, &rng, idx % 2 ? 1 : 7, 40, 120, false);
            check_case(ctx, &rng, &c, &b);
            batch_free(&b);
            const dense_case d = {dtypes[di], c.head_dim, c.hq, c.hk, 150, 170, idx % 2, -1, 0.f, 0.f,
                                  idx % 2 ? VIEW_NHD : VIEW_PADDED, true};
            check_dense(ctx, &rng, &d, NULL, NULL, NULL, true, NULL, NULL);
            if (kva_test_failures > 20) goto out;
        }
    CHECK_MSG(splits_seen > 0, "no forced-split plan split: the merge path went untested");
out:
    kva_context_destroy(ctx);
}

/* ---- one plan, several layers; repeats -------------------------------------------------- */

/* New random K/V in the slots the requests own (pool NaN elsewhere), uploaded to a second
 * device pool of the same geometry: another layer of the same batch. */
static void *another_layer(kva_context *ctx, kva_rng *rng, const cuda_paged_batch *pb,
                           kva_kv_pages *pages, void **host_out) {
    unsigned char *host = kva_test_alloc(pb->pool_bytes);
    memcpy(host, pb->host_pool, pb->pool_bytes);
    const kva_kv_pages *hp = &pb->host_pages;
    const size_t es = kva_dtype_size(pb->dtype);
    const ptrdiff_t vk = (unsigned char *)hp->v_data - (unsigned char *)hp->k_data;
    for (int32_t b = 0; b < pb->batch; ++b)
        for (int32_t j = 0; j < pb->kv_len[b]; ++j) {
            int32_t page = pb->indices[pb->indptr[b] + j / pb->page_size], slot = j % pb->page_size;
            for (int32_t h = 0; h < pb->num_kv_heads; ++h) {
                size_t off = (size_t)(page * hp->stride_page + slot * hp->stride_token +
                                      h * hp->stride_head) * es;
                kva_fill_random(rng, host + off, pb->dtype, (size_t)pb->head_dim, -1.f, 1.f);
                kva_fill_random(rng, host + off + vk, pb->dtype, (size_t)pb->head_dim, -1.f, 1.f);
            }
        }
    void *dev = cuda_test_upload(ctx, host, pb->pool_bytes);
    *pages = pb->dev_pages;
    pages->k_data = dev;
    pages->v_data = (unsigned char *)dev + vk;
    *host_out = host;
    return dev;
}

KVA_TEST(cuda_prefill_plan_reused_across_layers) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    prefill_case c = plain_case(KVA_BF16, 128, 0);
    c.hq = 8;
    c.hk = 2;
    c.causal = 1;
    c.with_lse = true;
    c.page_size = 16;
    c.pool_layout = CUDA_TEST_NHD_INTERLEAVED;
    c.o_view = VIEW_NHD;
    batch b;
    batch_random(&b, &rng, 5, quick() ? 60 : 129, quick() ? 100 : 300, true);
    problem pr;
    kva_workspace ws = {0};
    tbuf o = {0};
    float *lse_dev = NULL;
    void *layer1_dev = NULL, *layer1_host = NULL, *first_o = NULL;
    const size_t rows = (size_t)b.total_qo * c.hq;
    if (!problem_make(ctx, &rng, &c, &b, true, &pr)) goto out;
    kva_kv_pages pages1;
    layer1_dev = another_layer(ctx, &rng, &pr.pool, &pages1, &layer1_host);
    /* layer 1's reference: the same problem over the second pool */
    problem pr1 = pr;
    pr1.pool.host_pages.k_data = layer1_host;
    pr1.pool.host_pages.v_data =
        (unsigned char *)layer1_host + ((unsigned char *)pr.pool.host_pages.v_data -
                                        (unsigned char *)pr.pool.host_pages.k_data);
    pr1.o_ref = kva_test_alloc(sizeof(double) * rows * c.head_dim);
    pr1.lse_ref = kva_test_alloc(sizeof(double) * rows);
    problem_reference(&pr1);

    kva_plan_limits lim = problem_limits(&pr);
    if (!layer1_dev || !workspace_make(ctx, &lim, &ws)) goto out1;
    if (!tbuf_output(ctx, &o, c.dtype, c.o_view, b.total_qo, c.hq, c.head_dim)) goto out1;
    if (!(lse_dev = cuda_test_poisoned(ctx, sizeof(float) * (rows + LSE_GUARD)))) goto out1;
    kva_plan_options opt = {0, 24, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan;
    kva_status st = make_plan(ctx, &pr, &lim, &opt, ws, &plan);
    CHECK_MSG(st == KVA_OK, "plan: %s (%s)", kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto out1;
    /* layer 0, layer 1, layer 0 again: the last must equal the first bit for bit */
    for (int run = 0; run < 3; ++run) {
        const int l = run % 2;
        const problem *cur = l ? &pr1 : &pr;
        const char *what = run == 0 ? "layer 0" : run == 1 ? "layer 1" : "layer 0 again";
        tbuf_poison(ctx, &o);
        poison_device(ctx, lse_dev, sizeof(float) * (rows + LSE_GUARD));
        st = kva_prefill_run_paged(ctx, &plan, &pr.p, pr.q.d, l ? &pages1 : &pr.pool.dev_pages,
                                   o.d, lse_dev);
        CHECK_MSG(st == KVA_OK, "%s: run: %s (%s)", what, kva_status_str(st), kva_last_error());
        if (st != KVA_OK) break;
        CHECK_OK(kva_synchronize(ctx));
        tbuf_fetch(ctx, &o);
        float *lse = cuda_test_download(ctx, lse_dev, sizeof(float) * (rows + LSE_GUARD));
        run_out r = {o, lse, 0, 0, 0, true, 0, 0};
        check_against_reference(cur, &r, what);
        if (run == 0) {
            first_o = kva_test_alloc(o.bytes);
            memcpy(first_o, o.host, o.bytes);
        } else if (run == 2) {
            CHECK_MSG(memcmp(first_o, o.host, o.bytes) == 0, "a repeated run differs from the first");
        }
        free(lse);
    }
    if (kva_test_failures) print_lens(&b);
out1:
    free(pr1.o_ref);
    free(pr1.lse_ref);
out:
    free(first_o);
    free(layer1_host);
    kva_free(ctx, layer1_dev);
    kva_free(ctx, lse_dev);
    tbuf_free(ctx, &o);
    workspace_free(ctx, &ws);
    problem_free(ctx, &pr);
    batch_free(&b);
    kva_context_destroy(ctx);
}

/* The Hopper kernel's work distribution (prefill_hopper.cuh): blocks after their first item draw
 * tickets from the plan's workspace, and the run's last block puts them back to zero. One causal
 * ragged plan -- a plain one, then a KVA_PLAN_GRAPH one (its launch covers the padded work, so
 * blocks without a first item must count themselves too) -- runs four times without re-planning:
 * grids capped at 3 and 7 blocks (many items per block, so most come from tickets), then
 * uncapped, each into poisoned outputs. Every run matches the reference and the first bit for
 * bit, and the tickets are zero after each; a run that left them behind would start the next
 * one's tickets past the end: its items never computed (NaN). Where the Hopper kernel runs (an
 * sm_90 GPU, KVA_PREFILL_PATH unset or "hopper") block 0's ticket count (the last word of its
 * ring, zeroed before each capped run) must show it drew tickets, so the test knows the dynamic
 * walk ran. */
/* Whether this test's prefill runs take the persistent Hopper kernel: a CUDA context on an sm_90
 * device, KVA_PREFILL_PATH unset or "hopper". */
static bool hopper_path(void) {
    int major = 0;
#if KVA_HAVE_CUDA
    if (!cpu_mode) (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
#endif
    const char *path = getenv("KVA_PREFILL_PATH");
    return major == 9 && (!path || !*path || strcmp(path, "hopper") == 0);
}

static void check_work_distribution(kva_context *ctx, kva_rng *rng, uint32_t flags) {
    prefill_case c = plain_case(KVA_BF16, 128, 0);
    c.hq = 8;
    c.hk = 2;
    c.causal = 1;
    c.with_lse = true;
    c.o_view = VIEW_NHD;
    batch b;
    batch_random(&b, rng, 7, quick() ? 70 : 129, quick() ? 100 : 300, true);
    problem pr;
    kva_workspace ws = {0};
    tbuf o = {0};
    float *lse_dev = NULL;
    unsigned char *first_o = NULL;
    const size_t rows = (size_t)b.total_qo * c.hq;
    const bool hopper = hopper_path();
    if (!problem_make(ctx, rng, &c, &b, true, &pr)) goto out;
    kva_plan_limits lim = problem_limits(&pr);
    if (!workspace_make(ctx, &lim, &ws)) goto out;
    if (!tbuf_output(ctx, &o, c.dtype, c.o_view, b.total_qo, c.hq, c.head_dim)) goto out;
    if (!(lse_dev = cuda_test_poisoned(ctx, sizeof(float) * (rows + LSE_GUARD)))) goto out;
    kva_plan_options opt = {flags, 0, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan;
    kva_status st = make_plan(ctx, &pr, &lim, &opt, ws, &plan);
    CHECK_MSG(st == KVA_OK, "plan: %s (%s)", kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto out;
    static const char *const caps[4] = {"3", "3", "7", NULL};
    for (int run = 0; run < 4; ++run) {
        char what[96];
        snprintf(what, sizeof what, "%s plan, run %d (grid cap %s)", flags ? "graph" : "plain", run,
                 caps[run] ? caps[run] : "none");
        kva_test_env env;
        if (caps[run]) kva_test_env_set(&env, "KVA_PREFILL_PERSISTENT", caps[run]);
        tbuf_poison(ctx, &o);
        poison_device(ctx, lse_dev, sizeof(float) * (rows + LSE_GUARD));
        if (!cpu_mode && caps[run]) { /* (block 0's ticket count, read below) */
            const uint32_t zero = 0;
            const kva__plan_header *h = kva__plan_header_of(ws.host);
            CHECK_OK(kva_memcpy(ctx,
                                (unsigned char *)ws.device + h->off_sched +
                                    sizeof(uint32_t) * (KVA__SCHED_HEAD + KVA__SCHED_RING - 1),
                                &zero, sizeof zero, KVA_COPY_HOST_TO_DEVICE));
        }
        st = kva_prefill_run_ragged(ctx, &plan, &pr.p, pr.q.d, pr.k.d, pr.v.d, o.d, lse_dev);
        if (caps[run]) kva_test_env_restore(&env);
        CHECK_MSG(st == KVA_OK, "%s: %s (%s)", what, kva_status_str(st), kva_last_error());
        if (st != KVA_OK) break;
        CHECK_OK(kva_synchronize(ctx));
        tbuf_fetch(ctx, &o);
        float *lse = cuda_test_download(ctx, lse_dev, sizeof(float) * (rows + LSE_GUARD));
        run_out r = {o, lse, 0, 0, 0, true, 0, 0};
        check_against_reference(&pr, &r, what);
        free(lse);
        if (run == 0) {
            first_o = kva_test_alloc(o.bytes);
            memcpy(first_o, o.host, o.bytes);
        } else {
            CHECK_MSG(memcmp(first_o, o.host, o.bytes) == 0, "%s differs from run 0", what);
        }
        if (!cpu_mode) {
            const kva__plan_header *h = kva__plan_header_of(ws.host);
            uint32_t *sched = cuda_test_download(ctx, (unsigned char *)ws.device + h->off_sched,
                                                 sizeof(uint32_t) * (KVA__SCHED_HEAD + KVA__SCHED_RING));
            CHECK_MSG(sched && sched[0] == 0 && sched[1] == 0, "%s: work tickets left at %u / %u",
                      what, sched ? sched[0] : 0u, sched ? sched[1] : 0u);
            if (sched && hopper && caps[run])
                CHECK_MSG(sched[KVA__SCHED_HEAD + KVA__SCHED_RING - 1] > 0u,
                          "%s: block 0 drew no tickets: the dynamic walk did not run", what);
            free(sched);
        }
    }
    if (kva_test_failures) print_lens(&b);
out:
    free(first_o);
    kva_free(ctx, lse_dev);
    tbuf_free(ctx, &o);
    workspace_free(ctx, &ws);
    problem_free(ctx, &pr);
    batch_free(&b);
}

KVA_TEST(cuda_prefill_work_distribution) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    check_work_distribution(ctx, &rng, 0);
    check_work_distribution(ctx, &rng, KVA_PLAN_GRAPH);
    kva_context_destroy(ctx);
}

/* KVA_PLAN_FULL_ATTENTION plans (src/plan/prefill_balance.c): on the persistent Hopper launch,
 * capped at 7 blocks so that small batches have a last wave to even out, 15 work items per KV
 * head (2 waves + 1) make the planner cut the longest item into key pieces, run last and merged
 * after the launch. Ragged and paged (pages of 16 and 3), one and two KV heads, lengths that are
 * not multiples of a tile; each plan run without a mask and, since the hint only shapes the
 * schedule, with a causal one, against the float64 reference. The plan follows the context's
 * prefill path: on the Hopper path the f32 case runs a cut plan on the f32 kernel (other kernels
 * run cut plans wherever the Hopper one cannot: f32, variants without its hook, strides a tensor
 * map cannot describe); KVA_PREFILL_PATH=wgmma / mma contexts, and CPU ones
 * (KVA_TEST_PREFILL_DEVICE=cpu), must not cut. */
KVA_TEST(cuda_prefill_last_wave) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const bool hopper = hopper_path();
    static const struct {
        kva_dtype dt;
        int32_t D, hk, page;
    } cases[5] = {{KVA_BF16, 128, 1, 0}, {KVA_F16, 64, 2, 0}, {KVA_BF16, 256, 1, 16}, {KVA_F16, 128, 2, 3},
                  {KVA_F32, 128, 1, 0}};
    for (int ci = 0; ci < 5; ++ci) {
        /* the Hopper kernel's query tokens per item at group 4: 128 rows (192 at d64) / 4 */
        const int32_t T = cases[ci].D == 64 ? 48 : 32;
        const int32_t qo1[1] = {15 * T - 5}, kv1[1] = {2037};
        const int32_t qo2[2] = {8 * T, 7 * T - 3}, kv2[2] = {1999, 2100};
        batch b;
        if (cases[ci].hk == 1)
            batch_from(&b, 1, qo1, kv1);
        else
            batch_from(&b, 2, qo2, kv2);
        for (int causal = 0; causal < 2; ++causal) {
            prefill_case c = plain_case(cases[ci].dt, cases[ci].D, ci);
            c.hq = 4 * cases[ci].hk;
            c.hk = cases[ci].hk;
            c.causal = causal;
            c.with_lse = true;
            c.page_size = cases[ci].page;
            c.pool_layout = CUDA_TEST_NHD;
            char what[160];
            case_name(&c, &b, what, sizeof what);
            strncat(what, ", full-attention plan, 7 blocks", sizeof what - strlen(what) - 1);
            problem pr;
            if (problem_make(ctx, &rng, &c, &b, true, &pr)) {
                kva_test_env env;
                kva_test_env_set(&env, "KVA_PREFILL_PERSISTENT", "7");
                kva_test_env env2; /* (16-tile items: below the default minimum) */
                kva_test_env_set(&env2, "KVA_PREFILL_BALANCE_MIN_TILES", "4");
                kva_plan_options opt = {KVA_PLAN_FULL_ATTENTION, 0, KVA_DECODE_PARTIAL_ROWMAX};
                run_out r;
                plan_and_run(ctx, &pr, &opt, what, &r);
                kva_test_env_restore(&env2);
                kva_test_env_restore(&env);
                if (r.ok) {
                    check_against_reference(&pr, &r, what);
                    /* (the plan follows the device, not KVA_PREFILL_PATH: a cut plan run by the
                     * other kernels must be right too) */
                    /* cut: the pieces are group 0, the only group the merge walks; else a whole
                     * plan or one the split search cut everywhere */
                    if (hopper && !cpu_mode)
                        CHECK_MSG(r.split && r.merge_groups == 1 && r.num_work > r.num_groups,
                                  "%s: the plan was not cut (%d work items, %d groups, merge_groups %d)", what,
                                  r.num_work, r.num_groups, r.merge_groups);
                    else
                        CHECK_MSG(r.merge_groups == 0 || r.merge_groups == r.num_groups,
                                  "%s: a plan cut off the persistent Hopper kernel (merge_groups %d of %d)", what,
                                  r.merge_groups, r.num_groups);
                }
                run_out_free(ctx, &r);
            }
            problem_free(ctx, &pr);
        }
        batch_free(&b);
    }
    kva_context_destroy(ctx);
}

/* Scores that rise steeply along the keys (q[0] = 1, k_j[0] = 1.6 j within each request: about
 * +0.2 per key in log2 units after the scale, ~25 per 128-key tile) in f16 and bf16: every tile
 * raises each row's max far beyond the Hopper kernel's rescale slack (8), so the rescale must run
 * each time; a kernel that kept an old max too long would let P pass f16's 65504 (inf / NaN).
 * Random inputs rarely raise a max by more than a few units, so the sweeps cannot tell. */
KVA_TEST(cuda_prefill_rising_scores) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* (case 3: a rise steep enough that a tile's scores exceed any max kept from the tile before
     * by far more than f32's exponent range -- 2^128 -- once scaled to it) */
    for (int i = 0; i < 4; ++i) {
        prefill_case c = plain_case(i >= 2 ? KVA_BF16 : KVA_F16, i == 1 || i == 3 ? 64 : 128, 0);
        c.hq = 4;
        c.hk = 1;
        c.causal = i == 2;
        const float rise = i == 3 ? 16.0f : 1.6f;
        c.q_view = c.k_view = c.v_view = c.o_view = VIEW_NHD;
        c.with_lse = true;
        const int32_t qo[2] = {40, 9}, kv[2] = {450, 300};
        batch b;
        batch_from(&b, 2, qo, kv);
        problem pr;
        if (problem_make(ctx, &rng, &c, &b, false, &pr)) {
            const size_t es = kva_dtype_size(c.dtype);
            for (int32_t r = 0; r < b.n; ++r)
                for (int32_t j = 0; j < b.kv[r]; ++j) {
                    const float x = rise * (float)j;
                    const int64_t t = b.kv_indptr[r] + j;
                    kva_convert(&x, KVA_F32, (char *)pr.k.host + (size_t)(t * pr.k.h.stride_token) * es, c.dtype, 1);
                }
            for (int64_t t = 0; t < b.total_qo; ++t)
                for (int32_t h = 0; h < c.hq; ++h) {
                    const float one = 1.0f;
                    kva_convert(&one, KVA_F32,
                                (char *)pr.q.host + (size_t)(t * pr.q.h.stride_token + h * pr.q.h.stride_head) * es,
                                c.dtype, 1);
                }
            tbuf_reupload(ctx, &pr.q);
            tbuf_reupload(ctx, &pr.k);
            const size_t rows = (size_t)b.total_qo * c.hq;
            pr.o_ref = kva_test_alloc(sizeof(double) * rows * c.head_dim);
            pr.lse_ref = kva_test_alloc(sizeof(double) * rows);
            problem_reference(&pr);
            char what[96];
            snprintf(what, sizeof what, "rising scores x%.1f, %s d%d %s", (double)rise, kva_dtype_name(c.dtype),
                     c.head_dim, c.causal ? "causal" : "full");
            kva_plan_options opt = {0, 0, KVA_DECODE_PARTIAL_ROWMAX};
            run_out r;
            plan_and_run(ctx, &pr, &opt, what, &r);
            if (r.ok) check_against_reference(&pr, &r, what);
            run_out_free(ctx, &r);
        }
        problem_free(ctx, &pr);
        batch_free(&b);
    }
    kva_context_destroy(ctx);
}

/* ---- causal-mask independence (seed 003) -------------------------------------------------- */

/* Packed [rows][hq][D] bytes of an output view, for bitwise comparison. */
static unsigned char *packed_rows(const tbuf *t) {
    const size_t es = kva_dtype_size(t->dt), row = (size_t)t->D * es;
    unsigned char *p = kva_test_alloc((size_t)t->tokens * t->heads * row + 1);
    for (int64_t i = 0; i < t->tokens; ++i)
        for (int32_t h = 0; h < t->heads; ++h)
            memcpy(p + ((size_t)i * t->heads + h) * row,
                   (unsigned char *)t->host + (size_t)(i * t->h.stride_token + h * t->h.stride_head) * es,
                   row);
    return p;
}

/* Overwrites rows [first, first + count) of an input with large values, re-uploads. */
static void scramble_rows(kva_context *ctx, kva_rng *rng, tbuf *t, int64_t first, int64_t count,
                          float lo, float hi) {
    const size_t es = kva_dtype_size(t->dt);
    for (int64_t i = first; i < first + count; ++i)
        for (int32_t h = 0; h < t->heads; ++h)
            kva_fill_random(rng, (char *)t->host + (size_t)(i * t->h.stride_token + h * t->h.stride_head) * es,
                            t->dt, (size_t)t->D, lo, hi);
    tbuf_reupload(ctx, t);
}

/* Rows [0, same) of two runs must be bit-identical, and rows [same, differ_end) must differ
 * somewhere (else the check could not fail); rows from differ_end on are identical again. */
static void check_same_prefix(const char *what, const unsigned char *a, const unsigned char *b,
                              size_t row_bytes, size_t same, size_t differ_end, size_t total) {
    CHECK_MSG(memcmp(a, b, same * row_bytes) == 0, "%s: an earlier query changed", what);
    CHECK_MSG(memcmp(a + same * row_bytes, b + same * row_bytes, (differ_end - same) * row_bytes) != 0,
              "%s: the later queries did not change: the check cannot fail", what);
    CHECK_MSG(memcmp(a + differ_end * row_bytes, b + differ_end * row_bytes,
                     (total - differ_end) * row_bytes) == 0,
              "%s: another request changed", what);
}

KVA_TEST(cuda_prefill_causal_independence) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    for (int di = 0; di < 3; ++di) {
        if (quick() && di == 2) continue;
        /* request 1 is under test: 150 queries after a 50-key prefix (positions 50 .. 199);
         * keys and values after position `pos` change between the runs */
        const int32_t qo[3] = {10, 150, 5}, kv[3] = {20, 200, 10}, pos = 120;
        batch b;
        batch_from(&b, 3, qo, kv);
        prefill_case c = plain_case(dtypes[di], head_dims[di], di);
        c.hq = di == 1 ? 8 : 4;
        c.hk = di == 1 ? 1 : 2;
        c.causal = 1;
        c.with_lse = true;
        c.o_view = VIEW_NHD;
        problem pr;
        if (!problem_make(ctx, &rng, &c, &b, false, &pr)) {
            problem_free(ctx, &pr);
            batch_free(&b);
            break;
        }
        static const char *kinds[3] = {"auto", "split", "no-split"};
        const kva_plan_options opts[3] = {{0, 0, KVA_DECODE_PARTIAL_ROWMAX},
                                          {0, 16, KVA_DECODE_PARTIAL_ROWMAX},
                                          {KVA_PLAN_NO_SPLIT, 0, KVA_DECODE_PARTIAL_ROWMAX}};
        unsigned char *before_o[3] = {0};
        float *before_lse[3] = {0};
        int split_seen = 0;
        for (int round = 0; round < 2; ++round) {
            if (round == 1) {
                const int64_t first = b.kv_indptr[1] + pos + 1, count = b.kv[1] - pos - 1;
                scramble_rows(ctx, &rng, &pr.k, first, count, 20.f, 30.f);
                scramble_rows(ctx, &rng, &pr.v, first, count, -30.f, 30.f);
            }
            for (int k = 0; k < 3; ++k) {
                char what[200];
                snprintf(what, sizeof what, "causal independence %s D=%d heads %d/%d, %s plan",
                         kva_dtype_name(c.dtype), c.head_dim, c.hq, c.hk, kinds[k]);
                run_out r;
                plan_and_run(ctx, &pr, &opts[k], what, &r);
                if (r.ok) {
                    if (k == 1) split_seen |= r.split;
                    unsigned char *o = packed_rows(&r.o);
                    if (round == 0) {
                        before_o[k] = o;
                        before_lse[k] = r.lse;
                        r.lse = NULL;
                    } else if (before_o[k]) {
                        /* rows of request 0, then request 1's queries at positions <= pos */
                        const size_t same = (size_t)b.qo_indptr[1] + (pos - (b.kv[1] - b.qo[1])) + 1;
                        const size_t end = (size_t)b.qo_indptr[2], total = (size_t)b.total_qo;
                        const size_t hrow = (size_t)c.head_dim * kva_dtype_size(c.dtype);
                        check_same_prefix(what, before_o[k], o, hrow * c.hq, same, end, total);
                        CHECK_MSG(memcmp(before_lse[k], r.lse, sizeof(float) * same * c.hq) == 0,
                                  "%s: an earlier query's LSE changed", what);
                        free(o);
                    } else {
                        free(o);
                    }
                }
                run_out_free(ctx, &r);
            }
        }
        CHECK_MSG(split_seen, "causal independence %s: the forced-split plan did not split",
                  kva_dtype_name(c.dtype));
        for (int k = 0; k < 3; ++k) {
            free(before_o[k]);
            free(before_lse[k]);
        }
        problem_free(ctx, &pr);
        batch_free(&b);

        /* the same through kva_attention: 160 queries over 160 keys, keys after 77 change */
        const int32_t n = 160, dpos = 77;
        dense_case d = {dtypes[di], head_dims[di], c.hq, c.hk, n, n, 1, -1, 0.f, 0.f,
                        VIEW_NHD, true};
        tbuf q = {0}, k = {0}, v = {0};
        if (tbuf_input(ctx, &rng, &q, d.dt, VIEW_NHD, n, d.hq, d.D, -2.f, 2.f) &&
            tbuf_input(ctx, &rng, &k, d.dt, VIEW_HND, n, d.hk, d.D, -1.f, 1.f) &&
            tbuf_input(ctx, &rng, &v, d.dt, v_view_for(VIEW_HND, VIEW_NHD), n, d.hk, d.D, -1.f, 1.f)) {
            void *o1 = NULL, *o2 = NULL;
            float *l1 = NULL, *l2 = NULL;
            check_dense(ctx, &rng, &d, &q, &k, &v, false, &o1, &l1);
            scramble_rows(ctx, &rng, &k, dpos + 1, n - dpos - 1, 20.f, 30.f);
            scramble_rows(ctx, &rng, &v, dpos + 1, n - dpos - 1, -30.f, 30.f);
            check_dense(ctx, &rng, &d, &q, &k, &v, false, &o2, &l2);
            if (o1 && o2 && l1 && l2) {
                const size_t hrow = (size_t)d.D * kva_dtype_size(d.dt);
                check_same_prefix("causal independence, dense", o1, o2, hrow * d.hq,
                                  (size_t)dpos + 1, (size_t)n, (size_t)n);
                CHECK_MSG(memcmp(l1, l2, sizeof(float) * (size_t)(dpos + 1) * d.hq) == 0,
                          "causal independence, dense: an earlier query's LSE changed");
            }
            free(o1);
            free(o2);
            free(l1);
            free(l2);
        }
        tbuf_free(ctx, &q);
        tbuf_free(ctx, &k);
        tbuf_free(ctx, &v);
    }
    kva_context_destroy(ctx);
}

/* ---- CUDA graphs ----------------------------------------------------------------------------- */

/* The capture side, CUDA builds only; on a CPU context the test runs the plans directly. */
typedef struct graph_state {
    void *stream, *graph, *exec;
} graph_state;

#if KVA_HAVE_CUDA
static bool cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) kva_test_fail(__FILE__, __LINE__, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}
static bool graph_open(kva_context *ctx, graph_state *g) {
    cudaStream_t s = NULL;
    if (!cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream")) return false;
    g->stream = s;
    CHECK_OK(kva_context_set_stream(ctx, s));
    return true;
}
static bool graph_begin(graph_state *g) {
    return cuda_ok(cudaStreamBeginCapture((cudaStream_t)g->stream, cudaStreamCaptureModeThreadLocal),
                   "begin capture");
}
static bool graph_end(graph_state *g) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    bool ok = cuda_ok(cudaStreamEndCapture((cudaStream_t)g->stream, &graph), "end capture");
    g->graph = graph;
    ok = ok && cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    g->exec = exec;
    return ok;
}
static bool graph_launch(graph_state *g) {
    return cuda_ok(cudaGraphLaunch((cudaGraphExec_t)g->exec, (cudaStream_t)g->stream), "launch");
}
static void graph_close(kva_context *ctx, graph_state *g) {
    if (g->exec) cudaGraphExecDestroy((cudaGraphExec_t)g->exec);
    if (g->graph) cudaGraphDestroy((cudaGraph_t)g->graph);
    if (g->stream) {
        kva_context_set_stream(ctx, NULL);
        cudaStreamDestroy((cudaStream_t)g->stream);
    }
    memset(g, 0, sizeof *g);
}
#else
static bool graph_open(kva_context *ctx, graph_state *g) { (void)ctx; (void)g; return false; }
static bool graph_begin(graph_state *g) { (void)g; return false; }
static bool graph_end(graph_state *g) { (void)g; return false; }
static bool graph_launch(graph_state *g) { (void)g; return false; }
static void graph_close(kva_context *ctx, graph_state *g) { (void)ctx; (void)g; }
#endif

/* One replay: batch lengths and plan options (always with KVA_PLAN_GRAPH). */
typedef struct graph_batch {
    int32_t n;
    int32_t qo[8], kv[8]; /* up to MAXB of the graph test */
    int32_t fixed_chunk;
    uint32_t flags;
} graph_batch;

/* The batch's CSR page table over the shared pool: consecutive entries of a shuffled list of
 * all pages, so every replay reads other physical pages. */
static void graph_table(kva_rng *rng, const batch *b, int32_t page_size, int32_t num_pages,
                        int32_t *indptr, int32_t *indices, int32_t *last, kva_page_table *t) {
    int32_t *perm = kva_test_alloc(sizeof(int32_t) * (size_t)num_pages);
    for (int32_t i = 0; i < num_pages; ++i) perm[i] = i;
    kva_rng_shuffle_i32(rng, perm, num_pages);
    indptr[0] = 0;
    for (int32_t i = 0; i < b->n; ++i) {
        int32_t np = (b->kv[i] + page_size - 1) / page_size;
        indptr[i + 1] = indptr[i] + np;
        last[i] = np ? b->kv[i] - (np - 1) * page_size : 0;
    }
    CHECK(indptr[b->n] <= num_pages);
    memcpy(indices, perm, sizeof(int32_t) * (size_t)indptr[b->n]);
    free(perm);
    t->batch_size = b->n;
    t->indptr = indptr;
    t->indices = indices;
    t->last_page_len = last;
}

KVA_TEST(cuda_prefill_graph_replay) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    const bool capture = kva_context_device(ctx) == KVA_DEVICE_CUDA;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dt = KVA_BF16;
    enum { MAXB = 8, Hq = 8, Hk = 2, D = 128, PS = 16, PAGES = 200, MAXQO = 640 };
    /* captured first: eight mixed requests; then an empty request, a causal request with more
     * queries than keys and a forced split; one long request; eight decode-like requests */
    const graph_batch gb[4] = {
        {8, {64, 1, 17, 129, 2, 33, 80, 15}, {64, 90, 300, 129, 51, 33, 211, 15}, 0, 0},
        {3, {0, 200, 33}, {0, 90, 500}, 32, 0},
        {1, {quick() ? 300 : 600}, {1500}, 0, 0},
        {8, {1, 1, 1, 1, 1, 1, 1, 1}, {1, 300, 17, 250, 99, 3, 160, 64}, 0, KVA_PLAN_NO_SPLIT},
    };
    graph_state g = {0};
    kva_workspace ws = {0};
    tbuf q = {0}, o = {0};
    float *lse_dev = NULL;
    void *pool_host = NULL, *pool_dev = NULL;
    if (capture && !graph_open(ctx, &g)) goto out;

    /* one interleaved pool, random everywhere; each replay's table picks other pages of it */
    kva_kv_pages hp = kva_kv_pages_interleaved(NULL, dt, PAGES, PS, Hk, D, KVA_LAYOUT_NHD);
    const size_t pool_elems = (size_t)PAGES * hp.stride_page, es = kva_dtype_size(dt);
    pool_host = kva_test_alloc(pool_elems * es);
    kva_fill_random(&rng, pool_host, dt, pool_elems, -1.f, 1.f);
    if (!(pool_dev = cuda_test_upload(ctx, pool_host, pool_elems * es))) goto out;
    hp = kva_kv_pages_interleaved(pool_host, dt, PAGES, PS, Hk, D, KVA_LAYOUT_NHD);
    kva_kv_pages dp = kva_kv_pages_interleaved(pool_dev, dt, PAGES, PS, Hk, D, KVA_LAYOUT_NHD);

    kva_plan_limits lim = {MAXB, PAGES, (int64_t)PAGES * PS, MAXQO, Hq, Hk, D, PS, 0};
    if (!workspace_make(ctx, &lim, &ws)) goto out;
    /* q, o, lse at fixed addresses (the graph bakes them in), MAXQO rows */
    if (!tbuf_input(ctx, &rng, &q, dt, VIEW_NHD, MAXQO, Hq, D, -2.f, 2.f)) goto out;
    if (!tbuf_output(ctx, &o, dt, VIEW_NHD, MAXQO, Hq, D)) goto out;
    const size_t lse_bytes = sizeof(float) * ((size_t)MAXQO * Hq + LSE_GUARD);
    if (!(lse_dev = cuda_test_poisoned(ctx, lse_bytes))) goto out;
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D);
    p.causal = 1;

    for (int i = 0; i < 4; ++i) {
        batch b;
        batch_from(&b, gb[i].n, gb[i].qo, gb[i].kv);
        int32_t indptr[MAXB + 1], indices[PAGES], last[MAXB];
        kva_page_table table;
        graph_table(&rng, &b, PS, PAGES, indptr, indices, last, &table);
        /* fresh queries in the used rows; outputs and partial states poisoned */
        scramble_rows(ctx, &rng, &q, 0, b.total_qo, -2.f, 2.f);
        tbuf_poison(ctx, &o);
        poison_device(ctx, lse_dev, lse_bytes);
        poison_device(ctx, ws.device, ws.device_bytes);

        kva_plan_options opt = {KVA_PLAN_GRAPH | gb[i].flags, gb[i].fixed_chunk,
                                KVA_DECODE_PARTIAL_ROWMAX};
        kva_plan plan;
        kva_status st;
        for (;;) { /* forced split: coarsen until the workspace holds it */
            st = kva_prefill_plan(ctx, &lim, b.n, b.qo_indptr, NULL, &table, PAGES, &opt, ws, &plan);
            if (st != KVA_ERR_WORKSPACE_TOO_SMALL || opt.fixed_chunk_size <= 0 ||
                opt.fixed_chunk_size > b.total_kv)
                break;
            opt.fixed_chunk_size *= 2;
        }
        CHECK_MSG(st == KVA_OK, "replay %d: plan: %s (%s)", i, kva_status_str(st), kva_last_error());
        if (st != KVA_OK) {
            batch_free(&b);
            goto out;
        }
        CHECK(plan.padded_work >= plan.num_work);
        if (capture) {
            if (i == 0) {
                CHECK_OK(kva_synchronize(ctx));
                if (!graph_begin(&g)) {
                    batch_free(&b);
                    goto out;
                }
                st = kva_prefill_run_paged(ctx, &plan, &p, q.d, &dp, o.d, lse_dev);
                bool ended = graph_end(&g);
                CHECK_MSG(st == KVA_OK, "captured run: %s (%s)", kva_status_str(st), kva_last_error());
                if (!ended || st != KVA_OK) {
                    batch_free(&b);
                    goto out;
                }
            }
            if (!graph_launch(&g)) {
                batch_free(&b);
                goto out;
            }
        } else {
            st = kva_prefill_run_paged(ctx, &plan, &p, q.d, &dp, o.d, lse_dev);
            CHECK_MSG(st == KVA_OK, "replay %d: run: %s (%s)", i, kva_status_str(st), kva_last_error());
        }
        CHECK_OK(kva_synchronize(ctx));

        /* reference over the host pool, only the batch's rows; the rest must stay poison */
        const size_t rows = (size_t)b.total_qo * Hq;
        double *o_ref = kva_test_alloc(sizeof(double) * (rows * D + 1));
        double *lse_ref = kva_test_alloc(sizeof(double) * (rows + 1));
        double *qd = kva_test_alloc(sizeof(double) * (rows * D + 1));
        double *kd = kva_test_alloc(sizeof(double) * (size_t)PAGES * PS * Hk * D);
        double *vd = kva_test_alloc(sizeof(double) * (size_t)PAGES * PS * Hk * D);
        for (int32_t r = 0; r < b.n; ++r) {
            kva_ref_read_tensor(q.h, b.qo_indptr[r], b.qo[r], Hq, D, qd);
            kva_ref_read_paged(&hp, &table, r, kd, vd);
            kva_ref_attention(&p, b.qo[r], b.kv[r], qd, kd, vd, o_ref + (size_t)b.qo_indptr[r] * Hq * D,
                              lse_ref + (size_t)b.qo_indptr[r] * Hq);
        }
        tbuf o_used = o;
        o_used.host = NULL;
        tbuf_fetch(ctx, &o_used);
        o_used.tokens = b.total_qo; /* rows past the batch count as guard */
        float *lse = cuda_test_download(ctx, lse_dev, lse_bytes);
        char what[96];
        snprintf(what, sizeof what, "graph replay %d (batch %d, %s)", i, b.n,
                 capture ? "captured" : "CPU, no capture");
        const int f0 = kva_test_failures;
        kva_compare_tensor(what, o_used.h, b.total_qo, Hq, D, o_ref, kva_tol_for(dt), NULL);
        check_untouched(what, &o_used);
        kva_compare_lse(what, lse, lse_ref, rows, dt, NULL);
        check_lse_guard(what, lse, rows);
        for (size_t r = rows; r < (size_t)MAXQO * Hq; ++r)
            if (((uint32_t *)lse)[r] != 0xFFFFFFFFu) {
                CHECK_MSG(0, "%s: LSE row %zu past the batch was written", what, r);
                break;
            }
        if (kva_test_failures != f0) {
            printf("    %s: chunk %d, tile %d, %d work items (padded %d), split %d\n", what,
                   plan.kv_chunk_size, plan.qo_tile_size, plan.num_work, plan.padded_work,
                   plan.split_kv);
            print_lens(&b);
        }
        free(o_used.host);
        free(lse);
        free(o_ref);
        free(lse_ref);
        free(qd);
        free(kd);
        free(vd);
        batch_free(&b);
        if (kva_test_failures > 20) break;
    }
out:
    if (capture) CHECK_OK(kva_synchronize(ctx));
    graph_close(ctx, &g);
    free(pool_host);
    kva_free(ctx, pool_dev);
    kva_free(ctx, lse_dev);
    tbuf_free(ctx, &q);
    tbuf_free(ctx, &o);
    workspace_free(ctx, &ws);
    kva_context_destroy(ctx);
}

/* ---- a small subset for racecheck --------------------------------------------------------- */

KVA_TEST(cuda_prefill_quick) {
    kva_context *ctx = prefill_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    splits_seen = 0;
    for (int i = 0; i < 3; ++i) {
        /* ragged: each dtype, one head dim each, GQA 4 / 3 / 8 */
        prefill_case c = plain_case(dtypes[i], head_dims[(i + 1) % 3], i);
        c.hq = i == 1 ? 6 : i == 0 ? 8 : 16;
        c.hk = 2;
        c.causal = 1;
        batch b;
        batch_random(&b, &rng, 5, 70, 80, true);
        check_case(ctx, &rng, &c, &b);
        batch_free(&b);
        /* paged, chunked */
        c.page_size = i == 0 ? 16 : i == 1 ? 3 : 64;
        c.pool_layout = i + 1;
        batch_random(&b, &rng, 4, 40, 100, false);
        check_case(ctx, &rng, &c, &b);
        batch_free(&b);
    }
    CHECK_MSG(splits_seen > 0, "no forced-split plan split: the merge path went untested");
    {
        /* 16-bit d64, d128, d256 and d192 with the persistent grid capped at 3 blocks, so that
         * every block walks many work items: the Hopper kernel's item boundary (at d64 and d128 the next
         * item's first Q K^T issued with this one's last P V, from another Q buffer; at d128
         * with the epilogue staged in this item's Q buffer) runs under the sanitizers too.
         * Causal and full, both dtypes at d128, GQA 4, ragged then paged. At d128 each case
         * also on the build the per-call choice does not pick for it (KVA_PREFILL_TURNS: the
         * consumers' ping-pong turns, chosen for short causal items): both builds meet both
         * masks here and under racecheck. Then d256 and d192 (its layout, three of four column
         * blocks stored), whose O goes through each warpgroup's ring of shared-memory slots,
         * which runs on across a block's items (G::ORING). */
        kva_test_env env, turns;
        kva_test_env_set(&env, "KVA_PREFILL_PERSISTENT", "3");
        for (int i = 0; i < 8; ++i) {
            kva_test_env_set(&turns, "KVA_PREFILL_TURNS", i < 4 || i >= 6 ? NULL : i % 2 ? "1" : "0");
            prefill_case c = plain_case(i % 2 ? KVA_F16 : KVA_BF16, i == 7 ? 192 : i == 6 ? 256 : i >= 2 ? 128 : 64, i);
            c.hq = 8;
            c.hk = 2;
            c.causal = i % 2 == 0;
            batch b;
            batch_random(&b, &rng, 5, 70, 90, true);
            check_case(ctx, &rng, &c, &b);
            batch_free(&b);
            c.page_size = i == 0 ? 16 : 3;
            c.pool_layout = i % CUDA_TEST_NUM_LAYOUTS;
            batch_random(&b, &rng, 4, 40, 100, false);
            check_case(ctx, &rng, &c, &b);
            batch_free(&b);
            kva_test_env_restore(&turns);
        }
        kva_test_env_restore(&env);
    }
    {
        /* padded head dims (d96 on the d128 kernel, d160 on d256 with a block wholly past the
         * dim), ragged and paged, split plans included */
        for (int i = 0; i < 2; ++i) {
            prefill_case c = plain_case(i ? KVA_F16 : KVA_BF16, i ? 160 : 96, i + 5);
            c.hq = 8;
            c.hk = 2;
            c.o_view = VIEW_NHD;
            batch b;
            batch_random(&b, &rng, 3, 70, 90, true);
            check_case(ctx, &rng, &c, &b);
            batch_free(&b);
            c.page_size = i ? 3 : 16;
            c.pool_layout = i % CUDA_TEST_NUM_LAYOUTS;
            batch_random(&b, &rng, 4, 40, 100, false);
            check_case(ctx, &rng, &c, &b);
            batch_free(&b);
        }
    }
    const dense_case d = {KVA_BF16, 128, 4, 1, 40, 25, 1, -1, 0.f, 0.f, VIEW_NHD, true};
    check_dense(ctx, &rng, &d, NULL, NULL, NULL, true, NULL, NULL);
    const dense_case d80 = {KVA_BF16, 80, 4, 1, 40, 25, 1, -1, 0.f, 0.f, VIEW_HND, true};
    check_dense(ctx, &rng, &d80, NULL, NULL, NULL, true, NULL, NULL);
    kva_context_destroy(ctx);
}
