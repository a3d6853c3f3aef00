/*
 * cmd_check.c -- `kvattn check`: one shape of paged decode (each split-KV algorithm the device
 * has), paged prefill and ragged prefill against the float64 reference, on any device.
 *
 * The pool holds the batch's pages in shuffled physical order; slots past each request's length
 * and unused pages are NaN, so a kernel that reads (and uses) anything outside its pages fails.
 * Outputs are NaN-poisoned before each run, so an unwritten element fails too.
 */
#include "commands.h"

#include "cli.h"
#include "synth.h"
#include "verify.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct check_shape {
    int32_t batch;
    int32_t kv_len[2], qo_len[2];
    int32_t num_qo_heads, num_kv_heads, head_dim, page_size;
    kva_dtype dtype;
    kva_layout layout;
    uint64_t seed;
    int causal;
} check_shape;

/* Everything one check needs, host side and (on CUDA) device side. */
typedef struct check_data {
    kva_context *ctx;
    const check_shape *shape;
    kva_attn_params params;
    size_t es;
    int32_t *kv_len, *qo_len, *qo_indptr, *kv_indptr;
    int32_t *indptr, *indices, *last_page_len;
    int32_t num_pages, total_qo, total_kv;
    kva_page_table table;
    void *k_pool, *v_pool, *q_host, *o_host, *k_ragged, *v_ragged; /* host */
    void *k_pool_d, *v_pool_d, *q_d, *o_d, *k_ragged_d, *v_ragged_d; /* device (= host on CPU) */
    float *lse_host, *lse_d;
    int64_t page_elems;
} check_data;

typedef struct check_outcome {
    double max_err, max_lse_err;
    int64_t bad;
} check_outcome;

static bool on_cpu(const check_data *c) { return kva_context_device(c->ctx) == KVA_DEVICE_CPU; }

static int dev_alloc(check_data *c, void *host, size_t bytes, void **dev) {
    if (on_cpu(c)) {
        *dev = host;
        return 0;
    }
    if (kva_malloc(c->ctx, bytes, dev) != KVA_OK ||
        kva_memcpy(c->ctx, *dev, host, bytes, KVA_COPY_HOST_TO_DEVICE) != KVA_OK) {
        fprintf(stderr, "kvattn check: device memory: %s\n", kva_last_error());
        return -1;
    }
    return 0;
}

static void dev_release(check_data *c, void *host, void *dev) {
    if (dev && dev != host) kva_free(c->ctx, dev);
}

static void *xmalloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

/* Rows of synthetic values, rounded into dtype. */
static void fill_rows(const check_data *c, synth_tensor t, int32_t req, int32_t first_pos,
                      int32_t ntok, int32_t heads, void *dst, float *scratch) {
    const int32_t D = c->shape->head_dim;
    for (int32_t i = 0; i < ntok; ++i) {
        synth_token(c->shape->seed, t, req, first_pos + i, 0, heads, D, scratch);
        kva_convert(scratch, KVA_F32, (char *)dst + (size_t)i * heads * D * c->es,
                    c->shape->dtype, (size_t)heads * D);
    }
}

static int build(check_data *c) {
    const check_shape *s = c->shape;
    const int32_t B = s->batch, Hq = s->num_qo_heads, Hk = s->num_kv_heads, D = s->head_dim;
    synth_rng rng;
    synth_rng_seed(&rng, s->seed);
    c->params = kva_attn_params_default(Hq, Hk, D);
    c->es = kva_dtype_size(s->dtype);
    c->kv_len = calloc((size_t)B, sizeof(int32_t));
    c->qo_len = calloc((size_t)B, sizeof(int32_t));
    c->qo_indptr = calloc((size_t)B + 1, sizeof(int32_t));
    c->kv_indptr = calloc((size_t)B + 1, sizeof(int32_t));
    c->indptr = calloc((size_t)B + 1, sizeof(int32_t));
    c->last_page_len = calloc((size_t)B, sizeof(int32_t));
    if (!c->kv_len || !c->qo_len || !c->qo_indptr || !c->kv_indptr || !c->indptr || !c->last_page_len)
        return -1;
    int32_t used = 0;
    for (int32_t b = 0; b < B; ++b) {
        c->kv_len[b] = synth_rng_int(&rng, s->kv_len[0], s->kv_len[1]);
        int32_t qhi = s->qo_len[1], qlo = s->qo_len[0];
        if (s->causal && qhi > c->kv_len[b]) qhi = c->kv_len[b];
        if (qlo > qhi) qlo = qhi;
        c->qo_len[b] = synth_rng_int(&rng, qlo, qhi);
        int32_t np = (c->kv_len[b] + s->page_size - 1) / s->page_size;
        c->indptr[b + 1] = c->indptr[b] + np;
        c->last_page_len[b] = np ? c->kv_len[b] - (np - 1) * s->page_size : 0;
        c->qo_indptr[b + 1] = c->qo_indptr[b] + c->qo_len[b];
        c->kv_indptr[b + 1] = c->kv_indptr[b] + c->kv_len[b];
        used += np;
    }
    c->total_qo = c->qo_indptr[B];
    c->total_kv = c->kv_indptr[B];
    /* A few spare pages the table never names: they stay NaN. */
    c->num_pages = used + 3;
    int32_t *perm = calloc((size_t)c->num_pages, sizeof(int32_t));
    c->indices = calloc((size_t)(used ? used : 1), sizeof(int32_t));
    if (!perm || !c->indices) return -1;
    for (int32_t i = 0; i < c->num_pages; ++i) perm[i] = i;
    for (int32_t i = c->num_pages - 1; i > 0; --i) {
        int32_t j = synth_rng_int(&rng, 0, i);
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    memcpy(c->indices, perm, sizeof(int32_t) * (size_t)used);
    free(perm);
    c->table.batch_size = B;
    c->table.indptr = c->indptr;
    c->table.indices = c->indices;
    c->table.last_page_len = c->last_page_len;

    c->page_elems = (int64_t)s->page_size * Hk * D;
    size_t pool_bytes = (size_t)c->num_pages * c->page_elems * c->es;
    c->k_pool = xmalloc(pool_bytes);
    c->v_pool = xmalloc(pool_bytes);
    c->q_host = xmalloc((size_t)(c->total_qo > B ? c->total_qo : B) * Hq * D * c->es);
    c->o_host = xmalloc((size_t)(c->total_qo > B ? c->total_qo : B) * Hq * D * c->es);
    c->lse_host = xmalloc(sizeof(float) * (size_t)(c->total_qo > B ? c->total_qo : B) * Hq);
    c->k_ragged = xmalloc((size_t)c->total_kv * Hk * D * c->es);
    c->v_ragged = xmalloc((size_t)c->total_kv * Hk * D * c->es);
    float *row = malloc(sizeof(float) * (size_t)(Hq > Hk ? Hq : Hk) * D);
    if (!c->k_pool || !c->v_pool || !c->q_host || !c->o_host || !c->lse_host || !c->k_ragged ||
        !c->v_ragged || !row)
        return -1;
    memset(c->k_pool, 0xFF, pool_bytes); /* NaN in every dtype */
    memset(c->v_pool, 0xFF, pool_bytes);

    /* Request b's token j: K/V rows from synth (request b, position j), scattered to its pages
     * and copied to the ragged tensors. */
    kva_kv_pages pg = kva_kv_pages_separate(c->k_pool, c->v_pool, s->dtype, c->num_pages,
                                            s->page_size, Hk, D, s->layout);
    for (int32_t b = 0; b < B; ++b)
        for (int32_t j = 0; j < c->kv_len[b]; ++j) {
            char *kr = (char *)c->k_ragged + (size_t)(c->kv_indptr[b] + j) * Hk * D * c->es;
            char *vr = (char *)c->v_ragged + (size_t)(c->kv_indptr[b] + j) * Hk * D * c->es;
            fill_rows(c, SYNTH_K, b, j, 1, Hk, kr, row);
            fill_rows(c, SYNTH_V, b, j, 1, Hk, vr, row);
            int32_t page = c->indices[c->indptr[b] + j / s->page_size], slot = j % s->page_size;
            for (int32_t h = 0; h < Hk; ++h) {
                size_t off = (size_t)(page * pg.stride_page + slot * pg.stride_token +
                                      h * pg.stride_head) * c->es;
                memcpy((char *)c->k_pool + off, kr + (size_t)h * D * c->es, (size_t)D * c->es);
                memcpy((char *)c->v_pool + off, vr + (size_t)h * D * c->es, (size_t)D * c->es);
            }
        }
    free(row);

    size_t q_bytes = (size_t)(c->total_qo > B ? c->total_qo : B) * Hq * D * c->es;
    if (dev_alloc(c, c->k_pool, pool_bytes, &c->k_pool_d) ||
        dev_alloc(c, c->v_pool, pool_bytes, &c->v_pool_d) ||
        dev_alloc(c, c->q_host, q_bytes, &c->q_d) || dev_alloc(c, c->o_host, q_bytes, &c->o_d) ||
        dev_alloc(c, c->lse_host, sizeof(float) * (size_t)(q_bytes / c->es / D), (void **)&c->lse_d) ||
        dev_alloc(c, c->k_ragged, (size_t)c->total_kv * Hk * D * c->es, &c->k_ragged_d) ||
        dev_alloc(c, c->v_ragged, (size_t)c->total_kv * Hk * D * c->es, &c->v_ragged_d))
        return -2;
    return 0;
}

static void release(check_data *c) {
    dev_release(c, c->k_pool, c->k_pool_d);
    dev_release(c, c->v_pool, c->v_pool_d);
    dev_release(c, c->q_host, c->q_d);
    dev_release(c, c->o_host, c->o_d);
    dev_release(c, c->lse_host, c->lse_d);
    dev_release(c, c->k_ragged, c->k_ragged_d);
    dev_release(c, c->v_ragged, c->v_ragged_d);
    void *p[] = {c->kv_len, c->qo_len, c->qo_indptr, c->kv_indptr, c->indptr, c->indices,
                 c->last_page_len, c->k_pool, c->v_pool, c->q_host, c->o_host, c->lse_host,
                 c->k_ragged, c->v_ragged};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) free(p[i]);
}

/* Uploads fresh Q rows (ntok) and poisons the outputs on the device. */
static kva_status prepare_io(check_data *c, int decode, int32_t ntok) {
    const int32_t Hq = c->shape->num_qo_heads, D = c->shape->head_dim;
    float *row = malloc(sizeof(float) * (size_t)Hq * D);
    if (!row) return KVA_ERR_OUT_OF_MEMORY;
    for (int32_t b = 0; b < c->shape->batch; ++b) {
        if (decode) {
            fill_rows(c, SYNTH_Q, b, c->kv_len[b] - 1, 1, Hq, (char *)c->q_host +
                      (size_t)b * Hq * D * c->es, row);
        } else {
            fill_rows(c, SYNTH_Q, b, c->kv_len[b] - c->qo_len[b], c->qo_len[b], Hq,
                      (char *)c->q_host + (size_t)c->qo_indptr[b] * Hq * D * c->es, row);
        }
    }
    free(row);
    size_t bytes = (size_t)ntok * Hq * D * c->es;
    memset(c->o_host, 0xFF, bytes);
    memset(c->lse_host, 0xFF, sizeof(float) * (size_t)ntok * Hq);
    if (on_cpu(c)) return KVA_OK;
    kva_status st = kva_memcpy(c->ctx, c->q_d, c->q_host, bytes, KVA_COPY_HOST_TO_DEVICE);
    if (st == KVA_OK) st = kva_memcpy(c->ctx, c->o_d, c->o_host, bytes, KVA_COPY_HOST_TO_DEVICE);
    if (st == KVA_OK)
        st = kva_memcpy(c->ctx, c->lse_d, c->lse_host, sizeof(float) * (size_t)ntok * Hq,
                        KVA_COPY_HOST_TO_DEVICE);
    return st;
}

static kva_status fetch_outputs(check_data *c, int32_t ntok) {
    if (on_cpu(c)) return KVA_OK;
    const int32_t Hq = c->shape->num_qo_heads, D = c->shape->head_dim;
    kva_status st = kva_memcpy(c->ctx, c->o_host, c->o_d, (size_t)ntok * Hq * D * c->es,
                               KVA_COPY_DEVICE_TO_HOST);
    if (st == KVA_OK)
        st = kva_memcpy(c->ctx, c->lse_host, c->lse_d, sizeof(float) * (size_t)ntok * Hq,
                        KVA_COPY_DEVICE_TO_HOST);
    return st;
}

/* Compares every request's output rows (qo rows starting at row0[b]) with the reference. */
static check_outcome compare(check_data *c, const int32_t *qo_len, const int32_t *row0, int causal) {
    const check_shape *s = c->shape;
    const int32_t Hq = s->num_qo_heads, Hk = s->num_kv_heads, D = s->head_dim;
    check_outcome out = {0, 0, 0};
    kva_kv_pages pg = kva_kv_pages_separate(c->k_pool, c->v_pool, s->dtype, c->num_pages,
                                            s->page_size, Hk, D, s->layout);
    int32_t max_kv = 1, max_qo = 1;
    for (int32_t b = 0; b < s->batch; ++b) {
        if (c->kv_len[b] > max_kv) max_kv = c->kv_len[b];
        if (qo_len[b] > max_qo) max_qo = qo_len[b];
    }
    double *k = malloc(sizeof(double) * (size_t)max_kv * Hk * D);
    double *v = malloc(sizeof(double) * (size_t)max_kv * Hk * D);
    double *q = malloc(sizeof(double) * (size_t)max_qo * Hq * D);
    double *o = malloc(sizeof(double) * (size_t)max_qo * Hq * D);
    double *got = malloc(sizeof(double) * (size_t)max_qo * Hq * D);
    double *lse = malloc(sizeof(double) * (size_t)max_qo * Hq);
    if (!k || !v || !q || !o || !got || !lse) {
        out.bad = -1;
        goto done;
    }
    kva_attn_params p = c->params;
    p.causal = causal;
    verify_tol tol = verify_tol_for(s->dtype), ltol = verify_lse_tol_for(s->dtype);
    kva_tensor qt = kva_tensor_nhd(c->q_host, s->dtype, Hq, D);
    kva_tensor ot = kva_tensor_nhd(c->o_host, s->dtype, Hq, D);
    for (int32_t b = 0; b < s->batch; ++b) {
        int32_t kv = kva_ref_read_paged(&pg, &c->table, b, k, v);
        kva_ref_read_tensor(qt, row0[b], qo_len[b], Hq, D, q);
        kva_ref_read_tensor(ot, row0[b], qo_len[b], Hq, D, got);
        kva_ref_attention(&p, qo_len[b], kv, q, k, v, o, lse);
        size_t n = (size_t)qo_len[b] * Hq * D;
        for (size_t i = 0; i < n; ++i) out.bad += !verify_value(got[i], o[i], tol, &out.max_err);
        for (int32_t i = 0; i < qo_len[b] * Hq; ++i)
            out.bad += !verify_value(c->lse_host[(size_t)row0[b] * Hq + i], lse[i], ltol,
                                     &out.max_lse_err);
    }
done:
    free(k); free(v); free(q); free(o); free(got); free(lse);
    return out;
}

/* Prints one result line; returns 1 for a failure, 0 for pass or skip. */
static int report(const char *what, kva_status st, const check_outcome *o) {
    if (st == KVA_ERR_UNSUPPORTED || st == KVA_ERR_NOT_BUILT) {
        printf("  %-26s SKIP  (%s)\n", what, kva_last_error());
        return 0;
    }
    if (st != KVA_OK) {
        printf("  %-26s FAIL  %s: %s\n", what, kva_status_str(st), kva_last_error());
        return 1;
    }
    printf("  %-26s %s  max |err| %.3g, LSE %.3g, %lld values off\n", what,
           o->bad ? "FAIL" : "PASS", o->max_err, o->max_lse_err, (long long)o->bad);
    return o->bad != 0;
}

static int alloc_workspace(check_data *c, const kva_plan_limits *l, int decode, kva_workspace *ws) {
    size_t dev, host;
    kva_status st = decode ? kva_decode_workspace_size(c->ctx, l, &dev, &host)
                           : kva_prefill_workspace_size(c->ctx, l, &dev, &host);
    if (st != KVA_OK) return -1;
    ws->device_bytes = dev;
    ws->host_bytes = host;
    if (kva_malloc(c->ctx, dev, &ws->device) != KVA_OK ||
        kva_host_alloc(c->ctx, host, &ws->host) != KVA_OK)
        return -1;
    return 0;
}

static void free_workspace(check_data *c, kva_workspace *ws) {
    kva_free(c->ctx, ws->device);
    kva_host_free(c->ctx, ws->host);
}

static int run_checks(check_data *c, int algo_choice) {
    const check_shape *s = c->shape;
    const int32_t Hq = s->num_qo_heads, Hk = s->num_kv_heads, D = s->head_dim, B = s->batch;
    kva_plan_limits l = {0};
    l.max_batch = B;
    l.max_total_pages = c->indptr[B];
    l.max_total_kv = c->total_kv;
    l.max_total_qo = c->total_qo;
    l.num_qo_heads = Hq;
    l.num_kv_heads = Hk;
    l.head_dim = D;
    l.page_size = s->page_size;
    kva_workspace dws = {0}, pws = {0};
    if (alloc_workspace(c, &l, 1, &dws) || alloc_workspace(c, &l, 0, &pws)) {
        fprintf(stderr, "kvattn check: workspace: %s\n", kva_last_error());
        free_workspace(c, &dws);
        free_workspace(c, &pws);
        return 2;
    }
    kva_kv_pages pages = kva_kv_pages_separate(c->k_pool_d, c->v_pool_d, s->dtype, c->num_pages,
                                               s->page_size, Hk, D, s->layout);
    int failures = 0;
    kva_plan plan;
    kva_tensor q = kva_tensor_nhd(c->q_d, s->dtype, Hq, D), o = kva_tensor_nhd(c->o_d, s->dtype, Hq, D);
    int32_t *ones = malloc(sizeof(int32_t) * (size_t)B), *rows = malloc(sizeof(int32_t) * (size_t)B);
    if (!ones || !rows) return 2;
    for (int32_t b = 0; b < B; ++b) {
        ones[b] = 1;
        rows[b] = b;
    }

    static const char *const algo_label[] = {"decode (partial rowmax)", "decode (global rowmax)"};
    for (int a = 0; a < 2; ++a) {
        if (algo_choice != 2 && algo_choice != a) continue;
        check_outcome out = {0, 0, 0};
        kva_plan_options opt = {0, 0, a ? KVA_DECODE_GLOBAL_ROWMAX : KVA_DECODE_PARTIAL_ROWMAX};
        kva_status st = prepare_io(c, 1, B);
        if (st == KVA_OK) st = kva_decode_plan(c->ctx, &l, &c->table, c->num_pages, &opt, dws, &plan);
        if (st == KVA_OK) st = kva_decode_run(c->ctx, &plan, &c->params, q, &pages, o, c->lse_d);
        if (st == KVA_OK) st = kva_synchronize(c->ctx);
        if (st == KVA_OK) st = fetch_outputs(c, B);
        if (st == KVA_OK) out = compare(c, ones, rows, 0);
        failures += report(algo_label[a], st, &out);
    }

    for (int ragged = 0; ragged < 2; ++ragged) {
        check_outcome out = {0, 0, 0};
        kva_attn_params p = c->params;
        p.causal = s->causal;
        kva_status st = prepare_io(c, 0, c->total_qo);
        if (st == KVA_OK)
            st = kva_prefill_plan(c->ctx, &l, B, c->qo_indptr, ragged ? c->kv_indptr : NULL,
                                  ragged ? NULL : &c->table, c->num_pages, NULL, pws, &plan);
        if (st == KVA_OK && ragged)
            st = kva_prefill_run_ragged(c->ctx, &plan, &p, q,
                                        kva_tensor_nhd(c->k_ragged_d, s->dtype, Hk, D),
                                        kva_tensor_nhd(c->v_ragged_d, s->dtype, Hk, D), o, c->lse_d);
        else if (st == KVA_OK)
            st = kva_prefill_run_paged(c->ctx, &plan, &p, q, &pages, o, c->lse_d);
        if (st == KVA_OK) st = kva_synchronize(c->ctx);
        if (st == KVA_OK) st = fetch_outputs(c, c->total_qo);
        if (st == KVA_OK) out = compare(c, c->qo_len, c->qo_indptr, s->causal);
        failures += report(ragged ? "prefill (ragged K/V)" : "prefill (paged K/V)", st, &out);
    }
    free(ones);
    free(rows);
    free_workspace(c, &dws);
    free_workspace(c, &pws);
    return failures ? 1 : 0;
}

int kvattn_cmd_check(int argc, char **argv) {
    check_shape s = {0};
    s.batch = 5;
    s.kv_len[0] = 1;
    s.kv_len[1] = 1200;
    s.qo_len[0] = 1;
    s.qo_len[1] = 40;
    s.num_qo_heads = 32;
    s.num_kv_heads = 8;
    s.head_dim = 128;
    s.page_size = 16;
    s.dtype = KVA_BF16;
    s.seed = 1;
    s.causal = 1;
    cli_device device = CLI_DEVICE_AUTO;
    int32_t threads = 0;
    int layout = 0, algo = 2, non_causal = 0;
    static const char *const layouts[] = {"nhd", "hnd", NULL};
    static const char *const algos[] = {"partial", "global", "both", NULL};
    const cli_option options[] = {
        {"batch", CLI_INT, &s.batch, "requests", NULL, 1},
        {"kv-len", CLI_RANGE, s.kv_len, "cached tokens per request (uniform in range)", NULL, 0},
        {"qo-len", CLI_RANGE, s.qo_len, "prefill query tokens per request (causal: at most "
                                        "its kv-len)", NULL, 0},
        {"heads", CLI_INT, &s.num_qo_heads, "query heads", NULL, 1},
        {"kv-heads", CLI_INT, &s.num_kv_heads, "K/V heads", NULL, 1},
        {"head-dim", CLI_INT, &s.head_dim, "head dimension", NULL, 1},
        {"dtype", CLI_DTYPE, &s.dtype, "element type", NULL, 0},
        {"page-size", CLI_INT, &s.page_size, "tokens per page", NULL, 1},
        {"layout", CLI_CHOICE, &layout, "layout inside a page", layouts, 0},
        {"algo", CLI_CHOICE, &algo, "decode algorithms to check",
         algos, 0},
        {"non-causal", CLI_FLAG, &non_causal, "prefill without the causal mask", NULL, 0},
        {"seed", CLI_U64, &s.seed, "seed of lengths, page order and values", NULL, 0},
        {"threads", CLI_INT, &threads, "CPU worker threads (0 = all cores)", NULL, 0},
        {"device", CLI_DEVICE, &device, "auto = cuda when a GPU is present, else cpu", NULL, 0},
    };
    const char *summary =
        "Runs one shape of paged decode, paged prefill and ragged prefill and compares every\n"
        "output and LSE value with the float64 reference. Prints PASS/FAIL per operation;\n"
        "an operation the device lacks is SKIPped. Exit 0 = all pass, 1 = a failure, 2 = error.";
    int n = (int)(sizeof options / sizeof options[0]);
    cli_parse_result pr = cli_parse("check", summary, options, n, argc, argv, 2);
    if (pr == CLI_HELP_SHOWN) return 0;
    if (pr == CLI_BAD_ARGS) return 2;
    s.layout = layout ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
    s.causal = !non_causal;
    if (s.num_qo_heads % s.num_kv_heads) {
        fprintf(stderr, "kvattn check: --kv-heads must divide --heads\n");
        return 2;
    }

    int code;
    kva_context *ctx = cli_open_context(device, threads, &code);
    if (!ctx) return code;
    kva_device_info info;
    kva_context_info(ctx, &info);
    printf("kvattn check on %s (%s): batch %d, kv %d..%d, qo %d..%d, %d/%d heads, d %d, %s, "
           "page %d %s, seed %llu\n",
           kva_context_device(ctx) == KVA_DEVICE_CUDA ? "cuda" : "cpu", info.name, s.batch,
           s.kv_len[0], s.kv_len[1], s.qo_len[0], s.qo_len[1], s.num_qo_heads, s.num_kv_heads,
           s.head_dim, kva_dtype_name(s.dtype), s.page_size, layout ? "HND" : "NHD",
           (unsigned long long)s.seed);
    check_data c;
    memset(&c, 0, sizeof c);
    c.ctx = ctx;
    c.shape = &s;
    int rc = build(&c);
    if (rc == 0) {
        rc = run_checks(&c, algo);
        printf("%s\n", rc == 0 ? "PASS" : rc == 1 ? "FAIL" : "ERROR");
    } else {
        if (rc == -1) fprintf(stderr, "kvattn check: out of host memory\n");
        rc = 2;
    }
    release(&c);
    kva_context_destroy(ctx);
    return rc;
}
