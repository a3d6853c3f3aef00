/*
 * test_cpu_prefill.c -- kva_prefill_plan + kva_prefill_run_ragged / _paged on the CPU against
 * the float64 reference: batches of 1, 7 and 37 requests with random query / key lengths
 * (including 0 and 1), automatic, forced-split (fixed_chunk_size) and unsplit (KVA_PLAN_NO_SPLIT)
 * plans that must agree, chunked prefill over a cached prefix in a paged pool (page sizes
 * 1/3/16/64, shuffled physical pages, separate and interleaved pools, NHD and HND), variants
 * through split plans, a plan reused for a second layer, and causal-mask independence through
 * the split-and-merge path, K and V tensors in different layouts, and split requests of whole
 * query tiles, a score modifier that ignores its input (the masks apply after it), and
 * non-causal requests with more queries than keys under a window of INT32_MAX. Outputs, LSE
 * and the workspace's partial-state area are poisoned before each run.
 * KVA_TEST_QUICK=1 shrinks the sweep.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int quick(void) {
    const char *e = getenv("KVA_TEST_QUICK");
    return e && *e && *e != '0';
}

/* ---- a random batch -----------------------------------------------------------------------------
 */

typedef struct batch {
    int32_t n;
    int32_t *qo_len, *kv_len;
    int32_t *qo_indptr, *kv_indptr; /* [n + 1] */
    int32_t total_qo, total_kv;
} batch;

/* Lengths that hit the edges: 0, 1, around the 64-token tile, odd. Keys = cached prefix + the
 * new queries, so causal requests always have qo_len <= kv_len. */
static void make_batch(batch *b, kva_rng *rng, int32_t n, int32_t max_qo, int32_t max_prefix) {
    b->n = n;
    b->qo_len = malloc(sizeof(int32_t) * (size_t)n);
    b->kv_len = malloc(sizeof(int32_t) * (size_t)n);
    b->qo_indptr = malloc(sizeof(int32_t) * (size_t)(n + 1));
    b->kv_indptr = malloc(sizeof(int32_t) * (size_t)(n + 1));
    b->qo_indptr[0] = b->kv_indptr[0] = 0;
    for (int32_t i = 0; i < n; ++i) {
        int32_t qo, prefix;
        switch (kva_rng_int(rng, 0, 5)) {
        case 0: qo = n > 1 ? 0 : 1; break;
        case 1: qo = 1; break;
        case 2: qo = max_qo >= 65 ? 65 : max_qo; break;
        default: qo = kva_rng_int(rng, 2, max_qo); break;
        }
        switch (kva_rng_int(rng, 0, 3)) {
        case 0: prefix = 0; break;
        case 1: prefix = 1; break;
        default: prefix = kva_rng_int(rng, 2, max_prefix); break;
        }
        b->qo_len[i] = qo;
        b->kv_len[i] = qo + prefix;
        b->qo_indptr[i + 1] = b->qo_indptr[i] + qo;
        b->kv_indptr[i + 1] = b->kv_indptr[i] + qo + prefix;
    }
    b->total_qo = b->qo_indptr[n];
    b->total_kv = b->kv_indptr[n];
}

static void free_batch(batch *b) {
    free(b->qo_len);
    free(b->kv_len);
    free(b->qo_indptr);
    free(b->kv_indptr);
}

/* A packed [tokens, heads, D] tensor in NHD or HND. */
static kva_tensor make_tensor(void *data, kva_dtype dt, int64_t tokens, int32_t heads, int32_t D,
                              int hnd) {
    return hnd ? kva_tensor_hnd(data, dt, tokens > 0 ? tokens : 1, D)
               : kva_tensor_nhd(data, dt, heads, D);
}

/* ---- paged pool -------------------------------------------------------------------------------
 */

typedef struct pool {
    void *k, *v; /* v NULL for an interleaved pool */
    int32_t *indptr, *indices, *last;
    kva_kv_pages pages;
    kva_page_table table;
} pool;

/* Each request's kv_len keys on shuffled physical pages of a pool with spare pages; the whole
 * pool is random so stale slots past a request's length hold real-looking data. */
static void make_pool(pool *pl, kva_rng *rng, const batch *b, kva_dtype dt, int32_t hk, int32_t D,
                      int32_t page_size, kva_layout layout, int interleaved) {
    memset(pl, 0, sizeof *pl);
    pl->indptr = malloc(sizeof(int32_t) * (size_t)(b->n + 1));
    pl->last = malloc(sizeof(int32_t) * (size_t)b->n);
    pl->indptr[0] = 0;
    for (int32_t i = 0; i < b->n; ++i) {
        int32_t np = (b->kv_len[i] + page_size - 1) / page_size;
        pl->indptr[i + 1] = pl->indptr[i] + np;
        pl->last[i] = np ? b->kv_len[i] - (np - 1) * page_size : 0;
    }
    int32_t used = pl->indptr[b->n], num_pages = used + 5;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)num_pages);
    for (int32_t i = 0; i < num_pages; ++i)
        perm[i] = i;
    kva_rng_shuffle_i32(rng, perm, num_pages);
    pl->indices = malloc(sizeof(int32_t) * (size_t)(used + 1));
    memcpy(pl->indices, perm, sizeof(int32_t) * (size_t)used);
    free(perm);
    size_t elems = (size_t)num_pages * page_size * hk * D;
    if (interleaved) {
        pl->k = kva_test_alloc(2 * elems * kva_dtype_size(dt));
        kva_fill_random(rng, pl->k, dt, 2 * elems, -1.0f, 1.0f);
        pl->pages = kva_kv_pages_interleaved(pl->k, dt, num_pages, page_size, hk, D, layout);
    } else {
        pl->k = kva_test_alloc(elems * kva_dtype_size(dt));
        pl->v = kva_test_alloc(elems * kva_dtype_size(dt));
        kva_fill_random(rng, pl->k, dt, elems, -1.0f, 1.0f);
        kva_fill_random(rng, pl->v, dt, elems, -1.0f, 1.0f);
        pl->pages = kva_kv_pages_separate(pl->k, pl->v, dt, num_pages, page_size, hk, D, layout);
    }
    pl->table.batch_size = b->n;
    pl->table.indptr = pl->indptr;
    pl->table.indices = pl->indices;
    pl->table.last_page_len = pl->last;
}

static void free_pool(pool *pl) {
    free(pl->k);
    free(pl->v);
    free(pl->indptr);
    free(pl->indices);
    free(pl->last);
}

/* ---- reference ----------------------------------------------------------------------------------
 */

/* Expected o [total_qo][Hq][D] and lse [total_qo][Hq]; keys from k / v tensors (pl NULL) or pool.
 */
static void reference(const kva_attn_params *p, const batch *b, kva_tensor q, kva_tensor k,
                      kva_tensor v, const pool *pl, double *o, double *lse) {
    const int32_t Hq = p->num_qo_heads, Hk = p->num_kv_heads, D = p->head_dim;
    int32_t max_qo = 1, max_kv = 1;
    for (int32_t i = 0; i < b->n; ++i) {
        if (b->qo_len[i] > max_qo) max_qo = b->qo_len[i];
        if (b->kv_len[i] > max_kv) max_kv = b->kv_len[i];
    }
    double *qd = malloc(sizeof(double) * (size_t)max_qo * Hq * D);
    double *kd = malloc(sizeof(double) * (size_t)max_kv * Hk * D);
    double *vd = malloc(sizeof(double) * (size_t)max_kv * Hk * D);
    for (int32_t i = 0; i < b->n; ++i) {
        int32_t row = b->qo_indptr[i];
        kva_ref_read_tensor(q, row, b->qo_len[i], Hq, D, qd);
        if (pl) {
            kva_ref_read_paged(&pl->pages, &pl->table, i, kd, vd);
        } else {
            kva_ref_read_tensor(k, b->kv_indptr[i], b->kv_len[i], Hk, D, kd);
            kva_ref_read_tensor(v, b->kv_indptr[i], b->kv_len[i], Hk, D, vd);
        }
        kva_ref_attention(p, b->qo_len[i], b->kv_len[i], qd, kd, vd, o + (size_t)row * Hq * D,
                          lse + (size_t)row * Hq);
    }
    free(qd);
    free(kd);
    free(vd);
}

/* ---- plan + run -------------------------------------------------------------------------------
 */

typedef struct run_result {
    void *o;    /* total_qo x Hq x D, packed NHD */
    float *lse; /* total_qo x Hq */
    int ok;
    int32_t split;  /* plan.split_kv */
    uint64_t order; /* a hash of the plan's work order (request, query tile, key chunk per item) */
} run_result;

/* Plans the batch. A fixed chunk size that needs more partial states than the workspace holds
 * (the CPU keeps room for about 4 split work items per core) is doubled until it fits, so forced
 * splits stay as fine as the workspace allows. */
static kva_status make_plan(kva_context *ctx, const kva_plan_limits *lim, const batch *b,
                            const pool *pl, const kva_plan_options *opt, kva_workspace ws,
                            kva_plan *plan) {
    kva_plan_options o = *opt;
    for (;;) {
        kva_status st = pl ? kva_prefill_plan(ctx, lim, b->n, b->qo_indptr, NULL, &pl->table,
                                              pl->pages.num_pages, &o, ws, plan)
                           : kva_prefill_plan(ctx, lim, b->n, b->qo_indptr, b->kv_indptr, NULL, 0,
                                              &o, ws, plan);
        if (st != KVA_ERR_WORKSPACE_TOO_SMALL || o.fixed_chunk_size <= 0 ||
            o.fixed_chunk_size > b->total_kv)
            return st;
        o.fixed_chunk_size *= 2;
    }
}

/* Plans (with options) and runs the batch into fresh poisoned o / lse; the workspace's device
 * part is poisoned too, so partial states are never assumed to start at zero. */
static run_result plan_and_run(kva_context *ctx, const kva_attn_params *p, const batch *b,
                               kva_tensor q, kva_tensor k, kva_tensor v, const pool *pl,
                               const kva_plan_options *opt, const char *what) {
    run_result r = {0};
    const int32_t Hq = p->num_qo_heads, D = p->head_dim;
    kva_plan_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.max_batch = b->n;
    lim.max_total_qo = b->total_qo;
    lim.max_total_kv = b->total_kv;
    lim.num_qo_heads = Hq;
    lim.num_kv_heads = p->num_kv_heads;
    lim.head_dim = D;
    lim.page_size = 1; /* sizing covers paged plans too, so it needs a page size */
    if (pl) {
        lim.page_size = pl->pages.page_size;
        lim.max_total_pages = pl->indptr[b->n];
    }
    /* a forced split: the workspace holds its chunks, so it splits (the doubling in make_plan
     * once made some seeds' forced plans unsplit; no keys: max_total_kv 0 means "unbounded",
     * which min_fixed_chunk refuses) */
    if (opt->fixed_chunk_size > 0 && b->total_kv > 0) lim.min_fixed_chunk = opt->fixed_chunk_size;
    size_t dev = 0, host = 0;
    CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &dev, &host));
    kva_workspace ws = {NULL, dev, NULL, host};
    CHECK_OK(kva_malloc(ctx, dev, &ws.device));
    CHECK_OK(kva_host_alloc(ctx, host, &ws.host));
    kva_poison(ws.device, dev);
    size_t es = kva_dtype_size(q.dtype), on = (size_t)b->total_qo * Hq;
    r.o = kva_test_alloc(on * D * es + 64);
    r.lse = kva_test_alloc(sizeof(float) * (on + 16));
    kva_poison(r.o, on * D * es + 64);
    kva_poison(r.lse, sizeof(float) * (on + 16));
    kva_tensor o = kva_tensor_nhd(r.o, q.dtype, Hq, D);
    kva_plan plan;
    kva_status st = make_plan(ctx, &lim, b, pl, opt, ws, &plan);
    CHECK_MSG(st == KVA_OK, "%s: plan returned %s (%s)", what, kva_status_str(st),
              kva_last_error());
    if (st == KVA_OK) {
        st = pl ? kva_prefill_run_paged(ctx, &plan, p, q, &pl->pages, o, r.lse)
                : kva_prefill_run_ragged(ctx, &plan, p, q, k, v, o, r.lse);
        CHECK_MSG(st == KVA_OK, "%s: run returned %s (%s)", what, kva_status_str(st),
                  kva_last_error());
        r.ok = st == KVA_OK;
        r.split = plan.split_kv;
        r.order = 1469598103934665603ull;
        for (int32_t i = 0; i < plan.num_work; ++i)
            r.order = (r.order ^ (uint64_t)(plan.request_indices[i] * 1000003 + plan.qo_tile_indices[i] * 101 +
                                            plan.kv_tile_indices[i])) * 1099511628211ull;
        const unsigned char *tail_o = (const unsigned char *)r.o + on * D * es;
        const unsigned char *tail_l = (const unsigned char *)(r.lse + on);
        for (int i = 0; i < 64; ++i)
            CHECK_MSG(tail_o[i] == 0xFF, "%s: wrote past o", what);
        for (int i = 0; i < 64; ++i)
            CHECK_MSG(tail_l[i] == 0xFF, "%s: wrote past lse", what);
    }
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    return r;
}

static void free_result(run_result *r) {
    free(r->o);
    free(r->lse);
}

/* Forced-split plans that really split, so tests can insist the merge path ran; automatic
 * plans whose work order the causal last-wave order changed. */
static int splits_seen, reorders_seen;

/* Runs the batch with an automatic, a forced-split and an unsplit plan; each must match the
 * reference, and the split results must match the unsplit one. And the automatic and the
 * forced-split plan once more with KVA_PLAN_FULL_ATTENTION, which keeps the work in plan order
 * (the CPU has no last-wave cut): the same chunks in another order must give the same bits
 * (prefill_balance.h). */
static void check_plans(kva_context *ctx, kva_rng *rng, const kva_attn_params *p, const batch *b,
                        kva_tensor q, kva_tensor k, kva_tensor v, const pool *pl,
                        const char *what) {
    const int32_t Hq = p->num_qo_heads, D = p->head_dim;
    size_t on = (size_t)b->total_qo * Hq;
    double *eo = malloc(sizeof(double) * (on * D + 1)), *el = malloc(sizeof(double) * (on + 1));
    reference(p, b, q, k, v, pl, eo, el);
    const int32_t forced = kva_rng_int(rng, 5, 40);
    kva_plan_options opts[5] = {{0, 0, KVA_DECODE_PARTIAL_ROWMAX},
                                {0, forced, KVA_DECODE_PARTIAL_ROWMAX},
                                {KVA_PLAN_NO_SPLIT, 0, KVA_DECODE_PARTIAL_ROWMAX},
                                {KVA_PLAN_FULL_ATTENTION, 0, KVA_DECODE_PARTIAL_ROWMAX},
                                {KVA_PLAN_FULL_ATTENTION, forced, KVA_DECODE_PARTIAL_ROWMAX}};
    const char *names[5] = {"auto", "split", "no-split", "auto, plan order", "split, plan order"};
    run_result res[5];
    for (int i = 0; i < 5; ++i) {
        char w[320];
        snprintf(w, sizeof w, "%s [%s plan, chunk %d]", what, names[i], opts[i].fixed_chunk_size);
        res[i] = plan_and_run(ctx, p, b, q, k, v, pl, &opts[i], w);
        if (!res[i].ok) continue;
        if (i == 1 && res[i].split) ++splits_seen;
        kva_compare(w, res[i].o, q.dtype, eo, on * D, kva_tol_for(q.dtype), NULL);
        kva_compare_lse(w, res[i].lse, el, on, q.dtype, NULL);
    }
    /* the no-split result as the reference for the split one */
    if (res[1].ok && res[2].ok) {
        char w[320];
        snprintf(w, sizeof w, "%s [split vs no-split]", what);
        double *ns = malloc(sizeof(double) * (on * D + 1));
        kva_ref_read_tensor(kva_tensor_nhd(res[2].o, q.dtype, Hq, D), 0, b->total_qo, Hq, D, ns);
        kva_compare(w, res[1].o, q.dtype, ns, on * D, kva_tol_for(q.dtype), NULL);
        free(ns);
    }
    for (int i = 0; i < 2; ++i)
        if (res[i].ok && res[3 + i].ok) {
            reorders_seen += res[i].order != res[3 + i].order;
            CHECK_MSG(memcmp(res[i].o, res[3 + i].o, on * D * kva_dtype_size(q.dtype)) == 0 &&
                          memcmp(res[i].lse, res[3 + i].lse, on * sizeof(float)) == 0,
                      "%s: the %s plan's results differ in causal order and plan order", what, names[i]);
        }
    for (int i = 0; i < 5; ++i)
        free_result(&res[i]);
    free(eo);
    free(el);
}

static kva_context *cpu_context(void) {
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    return ctx;
}

/* ---- ragged -----------------------------------------------------------------------------------
 */

/* check_plans over fresh random ragged q / k / v of the batch (k, v in NHD or HND as asked). */
static void check_ragged_random(kva_context *ctx, kva_rng *rng, const kva_attn_params *p, const batch *b,
                                kva_dtype dt, int k_hnd, int v_hnd, const char *what) {
    const int32_t hq = p->num_qo_heads, hk = p->num_kv_heads, D = p->head_dim;
    const size_t es = kva_dtype_size(dt), qn = (size_t)b->total_qo * hq * D, kn = (size_t)b->total_kv * hk * D;
    void *qb = kva_test_alloc(qn * es + 64), *kb = kva_test_alloc(kn * es + 64), *vb = kva_test_alloc(kn * es + 64);
    kva_fill_random(rng, qb, dt, qn, -2.0f, 2.0f);
    kva_fill_random(rng, kb, dt, kn, -1.0f, 1.0f);
    kva_fill_random(rng, vb, dt, kn, -1.0f, 1.0f);
    check_plans(ctx, rng, p, b, kva_tensor_nhd(qb, dt, hq, D), make_tensor(kb, dt, b->total_kv, hk, D, k_hnd),
                make_tensor(vb, dt, b->total_kv, hk, D, v_hnd), NULL, what);
    free(qb);
    free(kb);
    free(vb);
}

static void check_ragged_case(kva_context *ctx, kva_rng *rng, int32_t n, kva_dtype dt, int32_t hq,
                              int32_t hk, int32_t D, int causal, int hnd, int32_t window, float cap,
                              kva_score_mod_fn mod) {
    batch b;
    make_batch(&b, rng, n, quick() ? 40 : 70, quick() ? 40 : 90);
    size_t es = kva_dtype_size(dt);
    size_t qn = (size_t)b.total_qo * hq * D, kn = (size_t)b.total_kv * hk * D;
    void *qb = kva_test_alloc(qn * es + 64), *kb = kva_test_alloc(kn * es + 64),
         *vb = kva_test_alloc(kn * es + 64);
    kva_fill_random(rng, qb, dt, qn, -2.0f, 2.0f);
    kva_fill_random(rng, kb, dt, kn, -1.0f, 1.0f);
    kva_fill_random(rng, vb, dt, kn, -1.0f, 1.0f);
    kva_tensor q = make_tensor(qb, dt, b.total_qo, hq, D, hnd);
    kva_tensor k = make_tensor(kb, dt, b.total_kv, hk, D, hnd);
    kva_tensor v = make_tensor(vb, dt, b.total_kv, hk, D, hnd);
    kva_attn_params p = kva_attn_params_default(hq, hk, D);
    p.causal = causal;
    p.window_left = window;
    p.logits_soft_cap = cap;
    p.score_mod = mod;
    char what[256];
    snprintf(what, sizeof what,
             "ragged batch %d %s Hq=%d Hk=%d D=%d causal=%d %s window=%d cap=%g mod=%d", n,
             kva_dtype_name(dt), hq, hk, D, causal, hnd ? "HND" : "NHD", window, (double)cap,
             mod != NULL);
    check_plans(ctx, rng, &p, &b, q, k, v, NULL, what);
    free(qb);
    free(kb);
    free(vb);
    free_batch(&b);
}

KVA_TEST_CPU_VARIANTS(cpu_prefill_ragged_batches) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t sizes[3] = {1, 7, 37};
    const kva_dtype dts[3] = {KVA_F32, KVA_F16, KVA_BF16};
    const int32_t dims[3] = {64, 128, 80};
    const int32_t ratios[4] = {1, 2, 4, 8};
    splits_seen = 0;
    for (int si = 0; si < 3; ++si)
        for (int causal = 0; causal <= 1; ++causal) {
            if (quick() && si == 2 && causal == 0) continue;
            int32_t hk = kva_rng_int(&rng, 1, 2), ratio = ratios[kva_rng_int(&rng, 0, 3)];
            check_ragged_case(ctx, &rng, sizes[si], dts[kva_rng_int(&rng, 0, 2)], hk * ratio, hk,
                              dims[kva_rng_int(&rng, 0, 2)], causal, kva_rng_int(&rng, 0, 1), -1,
                              0.0f, NULL);
        }
    CHECK_MSG(splits_seen > 0, "no forced-split plan split: the merge path went untested");
    kva_context_destroy(ctx);
}

/* Causal batches whose plans the last-wave order changes (requests of several query tiles whose
 * tiles see 1 to 3 key tiles, some splitting): against the reference, and bit for bit against the
 * same plan in plan order (check_plans). */
KVA_TEST_CPU_VARIANTS(cpu_prefill_causal_order) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    reorders_seen = 0;
    for (int c = 0; c < (quick() ? 2 : 4); ++c) {
        batch b;
        const int32_t n = 3 + c;
        make_batch(&b, &rng, n, 2, 2); /* (lengths replaced below) */
        b.qo_indptr[0] = b.kv_indptr[0] = 0;
        for (int32_t i = 0; i < n; ++i) {
            b.qo_len[i] = kva_rng_int(&rng, 150, 330);
            b.kv_len[i] = b.qo_len[i] + (c % 2 ? kva_rng_int(&rng, 0, 20) : 0);
            b.qo_indptr[i + 1] = b.qo_indptr[i] + b.qo_len[i];
            b.kv_indptr[i + 1] = b.kv_indptr[i] + b.kv_len[i];
        }
        b.total_qo = b.qo_indptr[n];
        b.total_kv = b.kv_indptr[n];
        const kva_dtype dt = c % 2 ? KVA_BF16 : KVA_F32;
        const int32_t hq = 4, hk = 2, D = 64;
        kva_attn_params p = kva_attn_params_default(hq, hk, D);
        p.causal = 1;
        char what[128];
        snprintf(what, sizeof what, "causal order case %d (%d requests, %s)", c, n, kva_dtype_name(dt));
        check_ragged_random(ctx, &rng, &p, &b, dt, 0, 0, what);
        free_batch(&b);
    }
    CHECK_MSG(reorders_seen > 0, "no automatic plan was reordered: the causal order went untested");
    kva_context_destroy(ctx);
}

/* A per-request sparse mask, to carry score_mod through split plans. */
static float stripes_mod(float s, int32_t q_pos, int32_t kv_pos, int32_t head, void *user) {
    (void)user;
    if ((kv_pos + head) % 4 == 1) return -INFINITY;
    return s + 0.01f * (float)(q_pos % 5);
}

/* A modifier that ignores the score it is given (a pure position/head bias), so a masked key
 * stays masked only if the causal / window masks are applied after it, as kvattn.h defines:
 * an implementation (or reference) that masks first and then calls the modifier would unmask. */
static float replace_mod(float s, int32_t q_pos, int32_t kv_pos, int32_t head, void *user) {
    (void)s;
    (void)user;
    return 0.1f * (float)((q_pos * 7 + kv_pos * 3 + head * 5) % 13) - 0.6f;
}

KVA_TEST_CPU_VARIANTS(cpu_prefill_ragged_variants) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    check_ragged_case(ctx, &rng, 7, KVA_F32, 8, 2, 64, 1, 0, 13, 0.0f, NULL);
    check_ragged_case(ctx, &rng, 7, KVA_F16, 4, 4, 64, 0, 1, 30, 0.0f, NULL);
    check_ragged_case(ctx, &rng, 7, KVA_BF16, 8, 4, 64, 1, 0, -1, 3.0f, NULL);
    check_ragged_case(ctx, &rng, 7, KVA_F32, 4, 2, 64, 1, 1, 25, 0.0f, stripes_mod);
    check_ragged_case(ctx, &rng, 7, KVA_F32, 4, 2, 64, 1, 0, 17, 0.0f, replace_mod);
    kva_context_destroy(ctx);
}

/* Non-causal requests with more queries than keys (negative query positions, down to -69) and
 * the widest window, INT32_MAX: q_pos - window_left must not wrap in 32 bits, so every row sees
 * every key; and a small window, which for negative positions masks nothing either. */
KVA_TEST_CPU_VARIANTS(cpu_prefill_wide_window_negative_positions) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t windows[2] = {INT32_MAX, 2};
    for (int c = 0; c < 2; ++c) {
        batch b;
        const int32_t n = 4;
        make_batch(&b, &rng, n, 2, 2); /* (lengths replaced below) */
        const int32_t qo[4] = {9, 72, 5, 3}, kv[4] = {4, 3, 5, 0};
        b.qo_indptr[0] = b.kv_indptr[0] = 0;
        for (int32_t i = 0; i < n; ++i) {
            b.qo_len[i] = qo[i] + kva_rng_int(&rng, 0, 3);
            b.kv_len[i] = kv[i];
            b.qo_indptr[i + 1] = b.qo_indptr[i] + b.qo_len[i];
            b.kv_indptr[i + 1] = b.kv_indptr[i] + b.kv_len[i];
        }
        b.total_qo = b.qo_indptr[n];
        b.total_kv = b.kv_indptr[n];
        const kva_dtype dt = c ? KVA_BF16 : KVA_F32;
        const int32_t hq = 4, hk = 2, D = 64;
        kva_attn_params p = kva_attn_params_default(hq, hk, D);
        p.causal = 0;
        p.window_left = windows[c];
        char what[128];
        snprintf(what, sizeof what, "wide window case %d (window %d, %s)", c, (int)windows[c],
                 kva_dtype_name(dt));
        check_ragged_random(ctx, &rng, &p, &b, dt, 0, 0, what);
        free_batch(&b);
    }
    kva_context_destroy(ctx);
}

/* ---- paged --------------------------------------------------------------------------------------
 */

KVA_TEST_CPU_VARIANTS(cpu_prefill_paged_chunked) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t page_sizes[4] = {1, 3, 16, 64};
    const kva_dtype dts[3] = {KVA_F32, KVA_F16, KVA_BF16};
    splits_seen = 0;
    for (int pi = 0; pi < 4; ++pi)
        for (int pool_kind = 0; pool_kind < 4; ++pool_kind) {
            if (quick() && (pool_kind + pi) % 2) continue;
            const int interleaved = pool_kind / 2;
            const kva_layout layout = pool_kind % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
            const kva_dtype dt = dts[kva_rng_int(&rng, 0, 2)];
            const int32_t hk = kva_rng_int(&rng, 1, 2), hq = hk * (1 << kva_rng_int(&rng, 0, 2));
            const int32_t D = kva_rng_int(&rng, 0, 1) ? 64 : 48;
            batch b;
            make_batch(&b, &rng, pi == 3 ? 4 : 7, quick() ? 30 : 60, quick() ? 60 : 150);
            pool pl;
            make_pool(&pl, &rng, &b, dt, hk, D, page_sizes[pi], layout, interleaved);
            size_t es = kva_dtype_size(dt), qn = (size_t)b.total_qo * hq * D;
            void *qb = kva_test_alloc(qn * es + 64);
            kva_fill_random(&rng, qb, dt, qn, -2.0f, 2.0f);
            kva_tensor q = kva_tensor_nhd(qb, dt, hq, D);
            kva_tensor none = {NULL, dt, 0, 0};
            kva_attn_params p = kva_attn_params_default(hq, hk, D);
            p.causal = kva_rng_int(&rng, 0, 3) != 0;
            char what[256];
            snprintf(what, sizeof what, "paged %s page %d %s %s Hq=%d Hk=%d D=%d causal=%d",
                     kva_dtype_name(dt), page_sizes[pi], interleaved ? "interleaved" : "separate",
                     layout == KVA_LAYOUT_HND ? "HND" : "NHD", hq, hk, D, p.causal);
            check_plans(ctx, &rng, &p, &b, q, none, none, &pl, what);
            free(qb);
            free_pool(&pl);
            free_batch(&b);
        }
    CHECK_MSG(splits_seen > 0, "no forced-split plan split: the merge path went untested");
    kva_context_destroy(ctx);
}

/* One plan, two layers (different pools of the same geometry): both match the reference. */
KVA_TEST(cpu_prefill_plan_reused_across_layers) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dt = KVA_BF16;
    const int32_t hq = 8, hk = 2, D = 64, ps = 16;
    batch b;
    make_batch(&b, &rng, 5, 50, 100);
    pool layers[2];
    make_pool(&layers[0], &rng, &b, dt, hk, D, ps, KVA_LAYOUT_NHD, 1);
    /* layer 1: same page table and pool geometry, different data */
    layers[1] = layers[0];
    size_t pool_elems = 2 * (size_t)layers[0].pages.num_pages * ps * hk * D;
    layers[1].k = kva_test_alloc(pool_elems * kva_dtype_size(dt));
    kva_fill_random(&rng, layers[1].k, dt, pool_elems, -1.0f, 1.0f);
    layers[1].pages = kva_kv_pages_interleaved(layers[1].k, dt, layers[0].pages.num_pages, ps, hk,
                                               D, KVA_LAYOUT_NHD);
    kva_plan_limits lim = {b.n, layers[0].indptr[b.n], b.total_kv, b.total_qo, hq, hk, D, ps, 0};
    size_t dev = 0, host = 0;
    CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &dev, &host));
    kva_workspace ws = {NULL, dev, NULL, host};
    CHECK_OK(kva_malloc(ctx, dev, &ws.device));
    CHECK_OK(kva_host_alloc(ctx, host, &ws.host));
    kva_plan_options opt = {0, 24, KVA_DECODE_PARTIAL_ROWMAX};
    kva_plan plan;
    CHECK_OK(make_plan(ctx, &lim, &b, &layers[0], &opt, ws, &plan));
    size_t es = kva_dtype_size(dt), on = (size_t)b.total_qo * hq;
    void *qb = kva_test_alloc(on * D * es + 64), *ob = kva_test_alloc(on * D * es + 64);
    float *lse = kva_test_alloc(sizeof(float) * (on + 1));
    double *eo = malloc(sizeof(double) * (on * D + 1)), *el = malloc(sizeof(double) * (on + 1));
    kva_fill_random(&rng, qb, dt, on * D, -2.0f, 2.0f);
    kva_tensor q = kva_tensor_nhd(qb, dt, hq, D), o = kva_tensor_nhd(ob, dt, hq, D);
    kva_tensor none = {NULL, dt, 0, 0};
    kva_attn_params p = kva_attn_params_default(hq, hk, D);
    p.causal = 1;
    for (int l = 0; l < 2; ++l) {
        kva_poison(ob, on * D * es);
        kva_poison(lse, sizeof(float) * on);
        CHECK_OK(kva_prefill_run_paged(ctx, &plan, &p, q, &layers[l].pages, o, lse));
        reference(&p, &b, q, none, none, &layers[l], eo, el);
        kva_compare(l ? "layer 1" : "layer 0", ob, dt, eo, on * D, kva_tol_for(dt), NULL);
        kva_compare_lse(l ? "layer 1" : "layer 0", lse, el, on, dt, NULL);
    }
    free(qb);
    free(ob);
    free(lse);
    free(eo);
    free(el);
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    free(layers[1].k);
    free_pool(&layers[0]);
    free_batch(&b);
    kva_context_destroy(ctx);
}

/* Through a forced split (partial states + merge): changing one request's keys and values
 * after position pos leaves its queries at positions <= pos, and every other request,
 * bit-identical. */
KVA_TEST(cpu_prefill_causal_independence_split) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dt = KVA_F16;
    const int32_t hq = 4, hk = 1, D = 64, n = 3;
    /* request 1 is under test: 50 queries after a 30-key prefix; with 16-key chunks the three
     * requests make 2 + 5 + 1 work items, within the workspace's partial states */
    const int32_t qo[3] = {10, 50, 5}, kv[3] = {20, 80, 10};
    batch b;
    make_batch(&b, &rng, n, 60, 80);
    for (int32_t i = 0; i < n; ++i) {
        b.qo_len[i] = qo[i];
        b.kv_len[i] = kv[i];
        b.qo_indptr[i + 1] = b.qo_indptr[i] + b.qo_len[i];
        b.kv_indptr[i + 1] = b.kv_indptr[i] + b.kv_len[i];
    }
    b.total_qo = b.qo_indptr[n];
    b.total_kv = b.kv_indptr[n];
    size_t es = kva_dtype_size(dt), qn = (size_t)b.total_qo * hq * D,
           kn = (size_t)b.total_kv * hk * D;
    void *qb = kva_test_alloc(qn * es), *kb = kva_test_alloc(kn * es),
         *vb = kva_test_alloc(kn * es);
    kva_fill_random(&rng, qb, dt, qn, -2.0f, 2.0f);
    kva_fill_random(&rng, kb, dt, kn, -1.0f, 1.0f);
    kva_fill_random(&rng, vb, dt, kn, -1.0f, 1.0f);
    kva_tensor q = kva_tensor_nhd(qb, dt, hq, D), k = kva_tensor_nhd(kb, dt, hk, D);
    kva_tensor v = kva_tensor_nhd(vb, dt, hk, D);
    kva_attn_params p = kva_attn_params_default(hq, hk, D);
    p.causal = 1;
    kva_plan_options opt = {0, 16, KVA_DECODE_PARTIAL_ROWMAX};
    run_result r1 = plan_and_run(ctx, &p, &b, q, k, v, NULL, &opt, "before");
    const int32_t pos = 55; /* key position in request 1; its query i sits at 30 + i */
    size_t row = (size_t)hk * D, first = (size_t)b.kv_indptr[1] + pos + 1;
    kva_fill_random(&rng, (char *)kb + first * row * es, dt, (size_t)(b.kv_len[1] - pos - 1) * row,
                    20.0f, 30.0f);
    kva_fill_random(&rng, (char *)vb + first * row * es, dt, (size_t)(b.kv_len[1] - pos - 1) * row,
                    -30.0f, 30.0f);
    run_result r2 = plan_and_run(ctx, &p, &b, q, k, v, NULL, &opt, "after");
    if (r1.ok && r2.ok) {
        CHECK(r1.split);
        /* unchanged rows: everything up to request 1's query at position pos (index pos - 30) */
        size_t same = ((size_t)b.qo_indptr[1] + (pos - 30) + 1) * hq;
        size_t tail = ((size_t)b.qo_indptr[2]) * hq; /* request 2 starts here */
        CHECK_MSG(memcmp(r1.o, r2.o, same * D * es) == 0, "queries <= %d changed", pos);
        CHECK_MSG(memcmp(r1.lse, r2.lse, same * sizeof(float)) == 0, "LSE of queries <= %d changed",
                  pos);
        CHECK_MSG(memcmp((char *)r1.o + tail * D * es, (char *)r2.o + tail * D * es,
                         (qn - tail * D) * es) == 0,
                  "another request changed");
        CHECK_MSG(memcmp((char *)r1.o + same * D * es, (char *)r2.o + same * D * es,
                         (tail - same) * D * es) != 0,
                  "later queries did not change: the check cannot fail");
    }
    free_result(&r1);
    free_result(&r2);
    free(qb);
    free(kb);
    free(vb);
    free_batch(&b);
    kva_context_destroy(ctx);
}

/* K and V are separate tensors, each read through its own strides: V in the other layout than K,
 * through automatic, forced-split and unsplit plans. */
KVA_TEST_CPU_VARIANTS(cpu_prefill_ragged_k_and_v_views_differ) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    for (int k_hnd = 0; k_hnd <= 1; ++k_hnd) {
        const kva_dtype dt = k_hnd ? KVA_BF16 : KVA_F32;
        const int32_t hq = 4, hk = 2, D = 64;
        batch b;
        make_batch(&b, &rng, 5, 70, 60);
        kva_attn_params p = kva_attn_params_default(hq, hk, D);
        p.causal = kva_rng_int(&rng, 0, 1);
        char what[128];
        snprintf(what, sizeof what, "ragged %s k %s, v %s causal=%d", kva_dtype_name(dt), k_hnd ? "HND" : "NHD",
                 k_hnd ? "NHD" : "HND", p.causal);
        check_ragged_random(ctx, &rng, &p, &b, dt, k_hnd, !k_hnd, what);
        free_batch(&b);
    }
    kva_context_destroy(ctx);
}

/* Requests whose query counts are whole query tiles (64 tokens here: 8 query heads per KV head),
 * every tile's keys split: the merge covers the last token of every tile, the plan's last
 * included. */
KVA_TEST(cpu_prefill_split_whole_query_tiles) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    splits_seen = 0;
    for (int c = 0; c < 3; ++c) {
        const int32_t n = 1 + c;
        batch b;
        make_batch(&b, &rng, n, 2, 2); /* (lengths replaced below) */
        for (int32_t i = 0; i < n; ++i) {
            b.qo_len[i] = 64 * kva_rng_int(&rng, 1, 3);
            b.kv_len[i] = b.qo_len[i] + kva_rng_int(&rng, 150, 300);
            b.qo_indptr[i + 1] = b.qo_indptr[i] + b.qo_len[i];
            b.kv_indptr[i + 1] = b.kv_indptr[i] + b.kv_len[i];
        }
        b.total_qo = b.qo_indptr[n];
        b.total_kv = b.kv_indptr[n];
        const kva_dtype dt = c == 1 ? KVA_F16 : KVA_F32;
        const int32_t hq = 8, hk = 1, D = 64;
        kva_attn_params p = kva_attn_params_default(hq, hk, D);
        p.causal = c != 2;
        char what[128];
        snprintf(what, sizeof what, "whole tiles case %d (%d requests, %s, causal=%d)", c, n, kva_dtype_name(dt),
                 p.causal);
        check_ragged_random(ctx, &rng, &p, &b, dt, 0, 0, what);
        free_batch(&b);
    }
    CHECK_MSG(splits_seen == 3, "%d of 3 forced-split plans split: the merge went untested", splits_seen);
    kva_context_destroy(ctx);
}
