/*
 * test_cpu_decode.c -- kva_decode_plan + kva_decode_run on the CPU against the float64
 * reference: dtypes, head dims, GQA groups, page sizes, batches, odd and empty lengths,
 * shuffled physical pages, NHD / HND, separate / interleaved pools, variants (window, soft cap,
 * sm_scale, score_mod), both flash-decoding algorithms, split / unsplit / automatic plans, and a
 * plan reused across layers. Outputs and LSE are poisoned before every run; padding around the
 * output rows must stay poisoned. KVA_TEST_QUICK=1 shrinks the sweep.
 * The sweeps run under every CPU kernel variant the machine supports (KVA_TEST_CPU_VARIANTS).
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int quick(void) {
    const char *e = getenv("KVA_TEST_QUICK");
    return e && *e && *e != '0';
}

/* ---- a random paged batch -------------------------------------------------------------------- */

typedef struct paged_batch {
    int32_t batch, page_size, num_pages;
    int32_t *lens, *indptr, *indices, *last;
    void *k, *v; /* v is NULL for an interleaved pool */
    kva_kv_pages pages;
    kva_page_table table;
} paged_batch;

/* Pool of the request's pages plus a few unused ones, physical order shuffled if asked. */
static void make_batch(paged_batch *pb, kva_rng *rng, kva_dtype dt, int32_t Hk, int32_t D,
                       int32_t page_size, int32_t batch, const int32_t *lens, kva_layout layout,
                       int interleaved, int shuffle) {
    memset(pb, 0, sizeof *pb);
    pb->batch = batch;
    pb->page_size = page_size;
    pb->lens = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    pb->indptr = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    pb->last = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    pb->indptr[0] = 0;
    for (int32_t b = 0; b < batch; ++b) {
        pb->lens[b] = lens[b];
        int32_t np = (lens[b] + page_size - 1) / page_size;
        pb->indptr[b + 1] = pb->indptr[b] + np;
        /* with no pages last_page_len is ignored: give it junk to prove it */
        pb->last[b] = np ? lens[b] - (np - 1) * page_size : (b % 2 ? 0 : 7);
    }
    int32_t total = pb->indptr[batch];
    pb->num_pages = total + 3;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)pb->num_pages);
    for (int32_t i = 0; i < pb->num_pages; ++i) perm[i] = i;
    if (shuffle) kva_rng_shuffle_i32(rng, perm, pb->num_pages);
    pb->indices = malloc(sizeof(int32_t) * (size_t)(total + 1));
    for (int32_t i = 0; i < total; ++i) pb->indices[i] = perm[i];
    free(perm);

    size_t es = kva_dtype_size(dt);
    size_t page_elems = (size_t)page_size * (size_t)Hk * (size_t)D;
    size_t n = page_elems * (size_t)pb->num_pages;
    if (interleaved) {
        pb->k = kva_test_alloc(2 * n * es);
        kva_fill_random(rng, pb->k, dt, 2 * n, -1.0f, 1.0f);
        pb->pages = kva_kv_pages_interleaved(pb->k, dt, pb->num_pages, page_size, Hk, D, layout);
    } else {
        pb->k = kva_test_alloc(n * es);
        pb->v = kva_test_alloc(n * es);
        kva_fill_random(rng, pb->k, dt, n, -1.0f, 1.0f);
        kva_fill_random(rng, pb->v, dt, n, -1.0f, 1.0f);
        pb->pages = kva_kv_pages_separate(pb->k, pb->v, dt, pb->num_pages, page_size, Hk, D, layout);
    }
    pb->table.batch_size = batch;
    pb->table.indptr = pb->indptr;
    pb->table.indices = pb->indices;
    pb->table.last_page_len = pb->last;
}

static void free_batch(paged_batch *pb) {
    free(pb->lens);
    free(pb->indptr);
    free(pb->indices);
    free(pb->last);
    free(pb->k);
    free(pb->v);
}

/* Lengths that hit the edges: 0, 1, page +- 1, odd, longer than a chunk. */
static void random_lens(kva_rng *rng, int32_t batch, int32_t page_size, int32_t max_len,
                        int32_t *lens) {
    for (int32_t b = 0; b < batch; ++b) {
        switch (kva_rng_int(rng, 0, 7)) {
        case 0: lens[b] = batch > 1 ? 0 : 1; break;
        case 1: lens[b] = 1; break;
        case 2: lens[b] = page_size + 1; break;
        case 3: lens[b] = page_size > 1 ? page_size - 1 : 2; break;
        default: lens[b] = kva_rng_int(rng, 1, max_len) | 1; break;
        }
        if (lens[b] > max_len) lens[b] = max_len;
    }
}

/* ---- the reference ----------------------------------------------------------------------------- */

typedef struct expected {
    double *o;   /* [batch][Hq][D] */
    double *lse; /* [batch][Hq] */
} expected;

static void reference_decode(const paged_batch *pb, const kva_attn_params *p, kva_tensor q,
                             expected *ex) {
    int32_t Hq = p->num_qo_heads, Hk = p->num_kv_heads, D = p->head_dim, B = pb->batch;
    ex->o = malloc(sizeof(double) * (size_t)B * Hq * D);
    ex->lse = malloc(sizeof(double) * (size_t)B * Hq);
    double *qd = malloc(sizeof(double) * (size_t)Hq * D);
    int32_t maxlen = 1;
    for (int32_t b = 0; b < B; ++b)
        if (pb->lens[b] > maxlen) maxlen = pb->lens[b];
    double *k = malloc(sizeof(double) * (size_t)maxlen * Hk * D);
    double *v = malloc(sizeof(double) * (size_t)maxlen * Hk * D);
    for (int32_t b = 0; b < B; ++b) {
        int32_t len = kva_ref_read_paged(&pb->pages, &pb->table, b, k, v);
        kva_ref_read_tensor(q, b, 1, Hq, D, qd);
        kva_ref_attention(p, 1, len, qd, k, v, ex->o + (size_t)b * Hq * D, ex->lse + (size_t)b * Hq);
    }
    free(qd);
    free(k);
    free(v);
}

static void free_expected(expected *ex) {
    free(ex->o);
    free(ex->lse);
}

/* ---- one plan + run, checked ------------------------------------------------------------------ */

typedef struct run_opts {
    kva_decode_algo algo;
    uint32_t flags;
    int32_t fixed_chunk;
    int with_lse;
    int hnd_output; /* o as [heads, batch, D] instead of padded rows */
} run_opts;

/* Plans and runs one decode of pb with q; compares with ex. Returns 0 if it could not run. */
static int run_and_check(kva_context *ctx, const char *what, const paged_batch *pb,
                         const kva_attn_params *p, kva_tensor q, const expected *ex,
                         const run_opts *ro, int32_t *split_out) {
    int32_t Hq = p->num_qo_heads, D = p->head_dim, B = pb->batch;
    kva_dtype dt = pb->pages.dtype;
    kva_plan_limits lim = {0};
    lim.max_batch = B;
    if (ro->fixed_chunk > 0) { /* room for every chunk as a work item */
        int64_t items = 0;
        for (int32_t b = 0; b < B; ++b)
            items += pb->lens[b] ? (pb->lens[b] + ro->fixed_chunk - 1) / ro->fixed_chunk : 1;
        if (items > lim.max_batch) lim.max_batch = (int32_t)items;
    }
    lim.max_total_pages = pb->indptr[B];
    lim.num_qo_heads = Hq;
    lim.num_kv_heads = p->num_kv_heads;
    lim.head_dim = D;
    lim.page_size = pb->page_size;
    size_t dev_bytes = 0, host_bytes = 0;
    CHECK_OK(kva_decode_workspace_size(ctx, &lim, &dev_bytes, &host_bytes));
    kva_workspace ws = {kva_test_alloc(dev_bytes), dev_bytes, kva_test_alloc(host_bytes), host_bytes};
    kva_plan_options opt = {ro->flags, ro->fixed_chunk, ro->algo};
    kva_plan plan;
    kva_status st = kva_decode_plan(ctx, &lim, &pb->table, pb->num_pages, &opt, ws, &plan);
    CHECK_MSG(st == KVA_OK, "%s: plan: %s (%s)", what, kva_status_str(st), kva_last_error());
    int ok = st == KVA_OK;
    if (ok && split_out) *split_out = plan.split_kv;

    size_t es = kva_dtype_size(dt);
    kva_tensor o;
    size_t o_elems;
    if (ro->hnd_output) {
        o_elems = (size_t)Hq * (size_t)(B + 1) * D;
        o = kva_tensor_hnd(NULL, dt, B + 1, D); /* one spare token per head: padding */
    } else {
        o_elems = (size_t)(B + 1) * ((size_t)Hq * D + 8);
        o = kva_tensor_nhd(NULL, dt, Hq, D);
        o.stride_token = (int64_t)Hq * D + 8; /* 8 elements of padding after every row */
    }
    o.data = kva_test_alloc(o_elems * es);
    kva_poison(o.data, o_elems * es);
    float *lse = ro->with_lse ? kva_test_alloc(sizeof(float) * (size_t)(B * Hq + 1)) : NULL;
    if (lse) kva_poison(lse, sizeof(float) * (size_t)(B * Hq + 1));

    if (ok) {
        st = kva_decode_run(ctx, &plan, p, q, &pb->pages, o, lse);
        CHECK_MSG(st == KVA_OK, "%s: run: %s (%s)", what, kva_status_str(st), kva_last_error());
        ok = st == KVA_OK;
    }
    if (ok) {
        if (kva_compare_tensor(what, o, B, Hq, D, ex->o, kva_tol_for(dt), NULL))
            kva_test_fail(__FILE__, __LINE__, "  ^ in %s", what);
        if (lse && kva_compare_lse(what, lse, ex->lse, (size_t)B * Hq, dt, NULL))
            kva_test_fail(__FILE__, __LINE__, "  ^ LSE in %s", what);
        if (lse) {
            uint32_t bits;
            memcpy(&bits, lse + (size_t)B * Hq, 4);
            CHECK_MSG(bits == 0xFFFFFFFFu, "%s: LSE written past its end", what);
        }
        /* everything outside the B x Hq x D view is still poison */
        size_t poisoned = 0, outside = o_elems - (size_t)B * Hq * D;
        const uint16_t *u16 = o.data;
        const uint32_t *u32 = o.data;
        for (size_t i = 0; i < o_elems; ++i) {
            int64_t tok, head, d;
            if (ro->hnd_output) {
                head = (int64_t)(i / ((size_t)(B + 1) * D));
                tok = (int64_t)(i / D) % (B + 1);
                d = (int64_t)(i % D);
            } else {
                tok = (int64_t)(i / ((size_t)Hq * D + 8));
                int64_t r = (int64_t)(i % ((size_t)Hq * D + 8));
                head = r / D;
                d = r % D;
            }
            (void)d;
            if (tok < B && head < Hq) continue;
            poisoned += es == 2 ? u16[i] == 0xFFFF : u32[i] == 0xFFFFFFFFu;
        }
        CHECK_MSG(poisoned == outside, "%s: %zu of %zu padding elements overwritten", what,
                  outside - poisoned, outside);
    }
    free(o.data);
    free(lse);
    free(ws.device);
    free(ws.host);
    return ok;
}

static kva_tensor random_queries(kva_rng *rng, kva_dtype dt, int32_t B, int32_t Hq, int32_t D) {
    /* padded rows so q's token stride is not Hq * D */
    kva_tensor q = kva_tensor_nhd(NULL, dt, Hq, D);
    q.stride_token = (int64_t)Hq * D + 16;
    size_t n = (size_t)(B > 0 ? B : 1) * (size_t)q.stride_token;
    q.data = kva_test_alloc(n * kva_dtype_size(dt));
    kva_fill_random(rng, q.data, dt, n, -1.0f, 1.0f);
    return q;
}

/* ---- score modifiers --------------------------------------------------------------------------- */

typedef struct mod_user {
    float slope;
    int32_t num_qo_heads;
} mod_user;

/* ALiBi-like bias plus a sparse pattern of masked keys. */
static float alibi_and_holes(float s, int32_t q_pos, int32_t kv_pos, int32_t qo_head, void *user) {
    const mod_user *u = user;
    if ((kv_pos * 7 + qo_head * 3) % 11 == 5) return -INFINITY;
    return s - u->slope * (float)(qo_head + 1) / (float)u->num_qo_heads * (float)(q_pos - kv_pos);
}

/* Masks every key for odd heads: those rows must come out 0 with LSE -inf. */
static float mask_odd_heads(float s, int32_t q_pos, int32_t kv_pos, int32_t qo_head, void *user) {
    (void)q_pos;
    (void)kv_pos;
    (void)user;
    return qo_head % 2 ? -INFINITY : s;
}

/* ---- the sweep --------------------------------------------------------------------------------- */

typedef struct sweep_case {
    kva_dtype dt;
    int32_t Hq, Hk, D, page_size, batch, max_len;
    kva_layout layout;
    int interleaved;
    int variant; /* 0 plain, 1 window, 2 soft cap + sm_scale, 3 score_mod, 4 all */
} sweep_case;

static void describe(char *buf, size_t n, const sweep_case *c, const char *mode) {
    snprintf(buf, n, "%s Hq%d/Hk%d D%d page%d B%d %s %s variant%d %s", kva_dtype_name(c->dt),
             c->Hq, c->Hk, c->D, c->page_size, c->batch, c->layout == KVA_LAYOUT_HND ? "HND" : "NHD",
             c->interleaved ? "interleaved" : "separate", c->variant, mode);
}

/* Runs one case in every mode: both algorithms x (auto, no split, small fixed chunks). */
static void run_case(kva_context *ctx, kva_rng *rng, const sweep_case *c, int all_modes) {
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)c->batch);
    random_lens(rng, c->batch, c->page_size, c->max_len, lens);
    paged_batch pb;
    make_batch(&pb, rng, c->dt, c->Hk, c->D, c->page_size, c->batch, lens, c->layout,
               c->interleaved, 1);
    kva_attn_params p = kva_attn_params_default(c->Hq, c->Hk, c->D);
    mod_user mu = {0.05f, c->Hq};
    if (c->variant == 1 || c->variant == 4) p.window_left = kva_rng_int(rng, 0, c->max_len / 2);
    if (c->variant == 2 || c->variant == 4) {
        p.logits_soft_cap = 1.5f;
        p.sm_scale = 0.4f;
    }
    if (c->variant == 3 || c->variant == 4) {
        p.score_mod = alibi_and_holes;
        p.score_mod_user = &mu;
    }
    p.causal = kva_rng_int(rng, 0, 1); /* a decode query sees every key either way */
    kva_tensor q = random_queries(rng, c->dt, c->batch, c->Hq, c->D);
    expected ex;
    reference_decode(&pb, &p, q, &ex);

    int32_t maxlen = 1;
    for (int32_t b = 0; b < c->batch; ++b)
        if (lens[b] > maxlen) maxlen = lens[b];
    int32_t small_chunk = kva_rng_int(rng, 1, maxlen / 3 + 1) | 1;
    struct { run_opts ro; const char *name; } modes[] = {
        {{KVA_DECODE_PARTIAL_ROWMAX, 0, 0, 1, 0}, "alg1 auto"},
        {{KVA_DECODE_GLOBAL_ROWMAX, 0, 0, 1, 1}, "alg2 auto"},
        {{KVA_DECODE_PARTIAL_ROWMAX, 0, small_chunk, 1, 1}, "alg1 fixed chunk"},
        {{KVA_DECODE_GLOBAL_ROWMAX, 0, small_chunk, 0, 0}, "alg2 fixed chunk"},
        {{KVA_DECODE_PARTIAL_ROWMAX, KVA_PLAN_NO_SPLIT, 0, 1, 0}, "alg1 no split"},
        {{KVA_DECODE_GLOBAL_ROWMAX, KVA_PLAN_NO_SPLIT | KVA_PLAN_GRAPH, 0, 1, 0}, "alg2 no split"},
    };
    int n_modes = all_modes ? 6 : 4;
    for (int m = 0; m < n_modes; ++m) {
        char what[256];
        describe(what, sizeof what, c, modes[m].name);
        int before = kva_test_failures;
        run_and_check(ctx, what, &pb, &p, q, &ex, &modes[m].ro, NULL);
        if (kva_test_failures > before) break;
    }
    free_expected(&ex);
    free(q.data);
    free_batch(&pb);
    free(lens);
}

KVA_TEST_CPU_VARIANTS(decode_sweep_matches_reference) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dts[] = {KVA_F32, KVA_F16, KVA_BF16};
    const int32_t dims[] = {64, 128, 256};
    const int32_t groups[] = {1, 2, 4, 8};
    const int32_t page_sizes[] = {1, 3, 16, 64};
    const int32_t batches[] = {1, 7, 37};
    int n = quick() ? 12 : 36;
    for (int i = 0; i < n && kva_test_failures == 0; ++i) {
        sweep_case c;
        c.dt = dts[i % 3];
        c.D = dims[(i / 3) % 3];
        int32_t group = groups[(i + i / 4) % 4];
        c.Hk = 1 + (i % 2);
        c.Hq = c.Hk * group;
        c.page_size = page_sizes[(i / 2 + i) % 4];
        c.batch = batches[(i / 5 + i) % 3];
        /* keep the float64 reference cheap: long requests only in small batches */
        c.max_len = c.batch == 37 ? 90 : (c.batch == 7 ? 300 : 700);
        if (c.D == 256 && c.batch == 37) c.max_len = 40;
        c.layout = (i / 3) % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.interleaved = (i / 6) % 2;
        c.variant = i % 5;
        run_case(ctx, &rng, &c, i % 4 == 0);
    }
    kva_context_destroy(ctx);
}

/* head_dim % 32 == 16 takes the tail path of the kernels (and the bf16 packing edge). */
KVA_TEST_CPU_VARIANTS(decode_odd_head_dims) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t dims[] = {16, 48, 80, 208};
    for (int i = 0; i < 4; ++i)
        for (int d = 0; d < 3; ++d) {
            sweep_case c = {(kva_dtype)d, 6, 2, dims[i], 5, 3, 200, (kva_layout)(i % 2), i / 2, i};
            run_case(ctx, &rng, &c, 1);
        }
    kva_context_destroy(ctx);
}

/* GQA groups wider than one slice of heads (64) and odd group sizes. */
KVA_TEST_CPU_VARIANTS(decode_wide_and_odd_gqa_groups) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    sweep_case wide = {KVA_BF16, 72, 1, 32, 16, 2, 300, KVA_LAYOUT_NHD, 0, 0};
    run_case(ctx, &rng, &wide, 1);
    sweep_case odd3 = {KVA_F16, 9, 3, 64, 7, 5, 200, KVA_LAYOUT_HND, 1, 3};
    run_case(ctx, &rng, &odd3, 1);
    sweep_case odd7 = {KVA_F32, 7, 1, 32, 4, 3, 150, KVA_LAYOUT_NHD, 0, 1};
    run_case(ctx, &rng, &odd7, 1);
    kva_context_destroy(ctx);
}

/* Empty requests (and an all-empty batch): O = 0, LSE = -inf, no NaN. Heads whose every key is
 * masked by score_mod likewise, in split and unsplit plans of both algorithms. */
KVA_TEST_CPU_VARIANTS(decode_empty_and_fully_masked) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t lens_sets[3][4] = {{0, 0, 0, 0}, {0, 517, 0, 3}, {300, 1, 0, 600}};
    for (int s = 0; s < 3; ++s)
        for (int masked = 0; masked < 2; ++masked) {
            paged_batch pb;
            make_batch(&pb, &rng, KVA_BF16, 2, 64, 16, 4, lens_sets[s], KVA_LAYOUT_NHD, 0, 1);
            kva_attn_params p = kva_attn_params_default(8, 2, 64);
            if (masked) p.score_mod = mask_odd_heads;
            kva_tensor q = random_queries(&rng, KVA_BF16, 4, 8, 64);
            expected ex;
            reference_decode(&pb, &p, q, &ex);
            for (int a = 0; a < 2; ++a)
                for (int f = 0; f < 2; ++f) {
                    run_opts ro = {(kva_decode_algo)a, 0, f ? 100 : 0, 1, f};
                    char what[128];
                    snprintf(what, sizeof what, "lens set %d masked %d alg %d fixed %d", s,
                             masked, a + 1, f);
                    run_and_check(ctx, what, &pb, &p, q, &ex, &ro, NULL);
                }
            free_expected(&ex);
            free(q.data);
            free_batch(&pb);
        }
    kva_context_destroy(ctx);
}

/* Split (small fixed chunks), unsplit and automatic plans, with both algorithms, agree with
 * each other (not just each with the reference) and the automatic plan does split here. */
KVA_TEST_CPU_VARIANTS(decode_split_modes_agree) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* the longer request second: the scheduler lists it first, so work order != request order */
    const int32_t lens[2] = {777, 1500};
    paged_batch pb;
    make_batch(&pb, &rng, KVA_F32, 2, 64, 16, 2, lens, KVA_LAYOUT_HND, 0, 1);
    kva_attn_params p = kva_attn_params_default(8, 2, 64);
    kva_tensor q = random_queries(&rng, KVA_F32, 2, 8, 64);
    expected ex;
    reference_decode(&pb, &p, q, &ex);

    kva_plan_limits lim = {64, pb.indptr[2], 0, 0, 8, 2, 64, 16, 0};
    size_t db, hb;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &db, &hb));
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    const size_t n = 2 * 8 * 64;
    float *outs[6];
    float *lses[6];
    const kva_plan_options opts[6] = {
        {0, 0, KVA_DECODE_PARTIAL_ROWMAX},  {0, 0, KVA_DECODE_GLOBAL_ROWMAX},
        {0, 97, KVA_DECODE_PARTIAL_ROWMAX}, {0, 97, KVA_DECODE_GLOBAL_ROWMAX},
        {KVA_PLAN_NO_SPLIT, 0, KVA_DECODE_PARTIAL_ROWMAX},
        {KVA_PLAN_NO_SPLIT, 0, KVA_DECODE_GLOBAL_ROWMAX}};
    for (int m = 0; m < 6; ++m) {
        kva_plan plan;
        outs[m] = kva_test_alloc(n * 4);
        lses[m] = kva_test_alloc(16 * 4);
        kva_poison(outs[m], n * 4);
        kva_poison(lses[m], 16 * 4);
        REQUIRE_OK(kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, &opts[m], ws, &plan));
        if (m < 4) CHECK_MSG(plan.split_kv, "mode %d did not split", m);
        else CHECK(!plan.split_kv && plan.num_work == 2);
        REQUIRE_OK(kva_decode_run(ctx, &plan, &p, q, &pb.pages,
                                  kva_tensor_nhd(outs[m], KVA_F32, 8, 64), lses[m]));
        kva_compare("split mode vs reference", outs[m], KVA_F32, ex.o, n, kva_tol_for(KVA_F32), NULL);
        kva_compare_lse("split mode LSE", lses[m], ex.lse, 16, KVA_F32, NULL);
    }
    for (int m = 1; m < 6; ++m)
        for (size_t i = 0; i < n; ++i)
            if (fabsf(outs[m][i] - outs[0][i]) > 2e-6f + 2e-6f * fabsf(outs[0][i])) {
                kva_test_fail(__FILE__, __LINE__, "mode %d differs from mode 0 at %zu: %g vs %g",
                              m, i, outs[m][i], outs[0][i]);
                break;
            }
    for (int m = 0; m < 6; ++m) {
        free(outs[m]);
        free(lses[m]);
    }
    free(ws.device);
    free(ws.host);
    free_expected(&ex);
    free(q.data);
    free_batch(&pb);
    kva_context_destroy(ctx);
}

/* One plan, two layers: two pools with the same geometry and page table, run in turn (twice,
 * so state left by one layer's run cannot leak into the next). */
KVA_TEST(decode_plan_reused_across_layers) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    for (int a = 0; a < 2; ++a) {
        const int32_t lens[3] = {900, 31, 412};
        paged_batch l0, l1;
        make_batch(&l0, &rng, KVA_F16, 2, 128, 16, 3, lens, KVA_LAYOUT_NHD, 1, 1);
        make_batch(&l1, &rng, KVA_F16, 2, 128, 16, 3, lens, KVA_LAYOUT_NHD, 1, 0);
        l1.table = l0.table; /* layer 1 is read through layer 0's page table */
        kva_attn_params p = kva_attn_params_default(8, 2, 128);
        kva_tensor q = random_queries(&rng, KVA_F16, 3, 8, 128);
        expected e0, e1;
        reference_decode(&l0, &p, q, &e0);
        reference_decode(&l1, &p, q, &e1);
        kva_plan_limits lim = {3, l0.indptr[3], 0, 0, 8, 2, 128, 16, 0};
        size_t db, hb;
        REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &db, &hb));
        kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
        kva_plan_options opt = {0, 0, (kva_decode_algo)a};
        kva_plan plan;
        REQUIRE_OK(kva_decode_plan(ctx, &lim, &l0.table, l0.num_pages, &opt, ws, &plan));
        CHECK(plan.split_kv);
        uint16_t *o = kva_test_alloc(3 * 8 * 128 * 2);
        float lse[24];
        for (int rep = 0; rep < 2; ++rep)
            for (int layer = 0; layer < 2; ++layer) {
                kva_poison(o, 3 * 8 * 128 * 2);
                kva_poison(lse, sizeof lse);
                REQUIRE_OK(kva_decode_run(ctx, &plan, &p, q, layer ? &l1.pages : &l0.pages,
                                          kva_tensor_nhd(o, KVA_F16, 8, 128), lse));
                const expected *e = layer ? &e1 : &e0;
                kva_compare("layer output", o, KVA_F16, e->o, 3 * 8 * 128, kva_tol_for(KVA_F16), NULL);
                kva_compare_lse("layer LSE", lse, e->lse, 24, KVA_F16, NULL);
            }
        free(o);
        free(ws.device);
        free(ws.host);
        free_expected(&e0);
        free_expected(&e1);
        free(q.data);
        free_batch(&l0);
        free_batch(&l1);
    }
    kva_context_destroy(ctx);
}

/* Thread counts 1 and 3 (more threads than cores) give the reference result too. */
KVA_TEST(decode_thread_counts) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int threads[2] = {1, 3};
    for (int i = 0; i < 2; ++i) {
        REQUIRE_OK(kva_context_set_threads(ctx, threads[i]));
        sweep_case c = {KVA_BF16, 8, 2, 64, 16, 7, 600, KVA_LAYOUT_NHD, 0, i};
        run_case(ctx, &rng, &c, 1);
    }
    kva_context_destroy(ctx);
}

/* KVA_PLAN_GRAPH: re-planning a different batch into the same workspace keeps the launch shape
 * and the new plan runs correctly (the old plan object is then refused, see test_planner.c). */
KVA_TEST(decode_graph_plan_replanned) {
    kva_context *ctx;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t lens_a[2] = {700, 9}, lens_b[5] = {0, 1300, 17, 256, 33};
    paged_batch a, b;
    make_batch(&a, &rng, KVA_BF16, 2, 64, 16, 2, lens_a, KVA_LAYOUT_HND, 0, 1);
    make_batch(&b, &rng, KVA_BF16, 2, 64, 16, 5, lens_b, KVA_LAYOUT_HND, 0, 1);
    kva_attn_params p = kva_attn_params_default(8, 2, 64);
    kva_plan_limits lim = {8, 256, 0, 0, 8, 2, 64, 16, 0};
    size_t db, hb;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &db, &hb));
    kva_workspace ws = {kva_test_alloc(db), db, kva_test_alloc(hb), hb};
    kva_plan_options opt = {KVA_PLAN_GRAPH, 0, KVA_DECODE_PARTIAL_ROWMAX};
    int32_t padded = -1;
    for (int round = 0; round < 2; ++round) {
        const paged_batch *pb = round ? &b : &a;
        kva_tensor q = random_queries(&rng, KVA_BF16, pb->batch, 8, 64);
        expected ex;
        reference_decode(pb, &p, q, &ex);
        kva_plan plan;
        REQUIRE_OK(kva_decode_plan(ctx, &lim, &pb->table, pb->num_pages, &opt, ws, &plan));
        if (padded < 0) padded = plan.padded_work;
        CHECK(plan.padded_work == padded && plan.num_work <= padded);
        size_t n = (size_t)pb->batch * 8 * 64;
        uint16_t *o = kva_test_alloc(n * 2);
        float *lse = kva_test_alloc(sizeof(float) * (size_t)pb->batch * 8);
        kva_poison(o, n * 2);
        kva_poison(lse, sizeof(float) * (size_t)pb->batch * 8);
        REQUIRE_OK(kva_decode_run(ctx, &plan, &p, q, &pb->pages, kva_tensor_nhd(o, KVA_BF16, 8, 64), lse));
        kva_compare("graph plan output", o, KVA_BF16, ex.o, n, kva_tol_for(KVA_BF16), NULL);
        kva_compare_lse("graph plan LSE", lse, ex.lse, (size_t)pb->batch * 8, KVA_BF16, NULL);
        free(o);
        free(lse);
        free(q.data);
        free_expected(&ex);
    }
    free(ws.device);
    free(ws.host);
    free_batch(&a);
    free_batch(&b);
    kva_context_destroy(ctx);
}
