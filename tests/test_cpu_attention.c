/*
 * test_cpu_attention.c -- dense kva_attention on the CPU against the float64 reference: dtypes,
 * head dims (64, 128, 256 and the odd 80), GQA ratios 1/2/4/8, lengths 0, 1 and off the tile
 * sizes, causal (also with more queries than keys), sliding window, soft cap, custom sm_scale,
 * score_mod (an ALiBi-like bias and a mask that hides whole queries), NHD and HND views with
 * padded strides (K and V in different views too), one thread and all. Outputs and LSE are
 * poisoned before each call; padding between rows and past the LSE must stay poisoned. Also:
 * causal-mask independence (changing keys / values after a query's position leaves its output
 * bit-identical).
 * KVA_TEST_QUICK=1 shrinks the sweep.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int quick(void) {
    const char *e = getenv("KVA_TEST_QUICK");
    return e && *e && *e != '0';
}

/* ---- strided views with padding ------------------------------------------------------------- */

/* [tokens, heads, D] in NHD or HND, with `pad` unused heads (NHD) or tokens (HND) after each
 * row group, so strides differ from the packed ones and writes outside the view show. */
typedef struct view_buf {
    void *data;
    size_t elems;
    kva_tensor t;
    int64_t tokens;
    int32_t heads, D, pad, hnd;
} view_buf;

static void view_alloc(view_buf *b, kva_dtype dt, int64_t tokens, int32_t heads, int32_t D, int hnd,
                       int32_t pad) {
    memset(b, 0, sizeof *b);
    b->tokens = tokens;
    b->heads = heads;
    b->D = D;
    b->pad = pad;
    b->hnd = hnd;
    b->elems =
        hnd ? (size_t)heads * (size_t)(tokens + pad) * D : (size_t)tokens * (heads + pad) * D;
    b->data = kva_test_alloc((b->elems + 1) * kva_dtype_size(dt));
    b->t.data = b->data;
    b->t.dtype = dt;
    b->t.stride_token = hnd ? D : (int64_t)(heads + pad) * D;
    b->t.stride_head = hnd ? (tokens + pad) * D : D;
}

static int view_is_real(const view_buf *b, size_t i) {
    if (b->hnd) return (int64_t)(i % ((size_t)(b->tokens + b->pad) * b->D)) < b->tokens * b->D;
    return (int32_t)(i % ((size_t)(b->heads + b->pad) * b->D)) < b->heads * b->D;
}

/* Counts elements outside the view that are no longer the poison pattern. */
static int64_t view_pad_damage(const view_buf *b) {
    size_t es = kva_dtype_size(b->t.dtype);
    int64_t bad = 0;
    for (size_t i = 0; i < b->elems; ++i) {
        if (view_is_real(b, i)) continue;
        const unsigned char *p = (const unsigned char *)b->data + i * es;
        for (size_t j = 0; j < es; ++j)
            bad += p[j] != 0xFF;
    }
    return bad;
}

/* ---- score modifiers --------------------------------------------------------------------------
 */

/* ALiBi-like: a per-head slope (from user data) times the distance. */
static float alibi_mod(float s, int32_t q_pos, int32_t kv_pos, int32_t head, void *user) {
    const float *slopes = user;
    return s - slopes[head] * (float)(q_pos - kv_pos);
}

/* Hides a scattered third of the keys, and every key of queries at positions 3 mod 7. */
static float holes_mod(float s, int32_t q_pos, int32_t kv_pos, int32_t head, void *user) {
    (void)user;
    if (((q_pos % 7) + 7) % 7 == 3) return -INFINITY;
    if ((q_pos + 2 * kv_pos + head) % 3 == 0) return -INFINITY;
    return s;
}

/* ---- one checked call -------------------------------------------------------------------------
 */

typedef struct dense_case {
    kva_dtype dt;
    int32_t hq, hk, d, qo, kv;
    int32_t causal, window;
    float cap, scale;
    kva_score_mod_fn mod;
    int hnd;
    int32_t pad;
    int v_other; /* v in the other layout than k (and padded differently): strides of its own */
} dense_case;

static dense_case base_case(kva_dtype dt, int32_t hq, int32_t hk, int32_t d, int32_t qo,
                            int32_t kv) {
    dense_case c;
    memset(&c, 0, sizeof c);
    c.dt = dt;
    c.hq = hq;
    c.hk = hk;
    c.d = d;
    c.qo = qo;
    c.kv = kv;
    c.window = -1;
    return c;
}

static void describe(const dense_case *c, char *buf, size_t n) {
    snprintf(buf, n,
             "%s Hq=%d Hk=%d D=%d qo=%d kv=%d causal=%d window=%d cap=%g scale=%g mod=%s %s%s",
             kva_dtype_name(c->dt), c->hq, c->hk, c->d, c->qo, c->kv, c->causal, c->window,
             (double)c->cap, (double)c->scale,
             c->mod == alibi_mod   ? "alibi"
             : c->mod == holes_mod ? "holes"
                                   : "none",
             c->hnd ? "HND" : "NHD", c->v_other ? (c->hnd ? ", v NHD" : ", v HND") : "");
}

static void check_dense(kva_context *ctx, kva_rng *rng, const dense_case *c) {
    char what[256];
    describe(c, what, sizeof what);
    view_buf q, k, v, o;
    view_alloc(&q, c->dt, c->qo, c->hq, c->d, c->hnd, c->pad);
    view_alloc(&k, c->dt, c->kv, c->hk, c->d, c->hnd, c->pad);
    view_alloc(&v, c->dt, c->kv, c->hk, c->d, c->v_other ? !c->hnd : c->hnd, c->v_other ? (c->pad ? 0 : 1) : c->pad);
    view_alloc(&o, c->dt, c->qo, c->hq, c->d, c->hnd, c->pad);
    kva_fill_random(rng, q.data, c->dt, q.elems, -2.0f, 2.0f);
    kva_fill_random(rng, k.data, c->dt, k.elems, -1.0f, 1.0f);
    kva_fill_random(rng, v.data, c->dt, v.elems, -1.0f, 1.0f);
    kva_poison(o.data, o.elems * kva_dtype_size(c->dt));
    size_t nlse = (size_t)c->qo * c->hq;
    float *lse = kva_test_alloc(sizeof(float) * (nlse + 4));
    kva_poison(lse, sizeof(float) * (nlse + 4));
    float slopes[64];
    for (int i = 0; i < 64; ++i)
        slopes[i] = 0.03125f * (float)(i % 8 + 1);

    kva_attn_params p = kva_attn_params_default(c->hq, c->hk, c->d);
    p.causal = c->causal;
    p.window_left = c->window;
    p.logits_soft_cap = c->cap;
    p.sm_scale = c->scale;
    p.score_mod = c->mod;
    p.score_mod_user = slopes;
    kva_status st = kva_attention(ctx, &p, c->qo, c->kv, q.t, k.t, v.t, o.t, lse);
    CHECK_MSG(st == KVA_OK, "%s: kva_attention returned %s (%s)", what, kva_status_str(st),
              kva_last_error());
    if (st == KVA_OK) {
        double *qd = malloc(sizeof(double) * ((size_t)c->qo * c->hq * c->d + 1));
        double *kd = malloc(sizeof(double) * ((size_t)c->kv * c->hk * c->d + 1));
        double *vd = malloc(sizeof(double) * ((size_t)c->kv * c->hk * c->d + 1));
        double *od = malloc(sizeof(double) * ((size_t)c->qo * c->hq * c->d + 1));
        double *ld = malloc(sizeof(double) * (nlse + 1));
        kva_ref_read_tensor(q.t, 0, c->qo, c->hq, c->d, qd);
        kva_ref_read_tensor(k.t, 0, c->kv, c->hk, c->d, kd);
        kva_ref_read_tensor(v.t, 0, c->kv, c->hk, c->d, vd);
        kva_ref_attention(&p, c->qo, c->kv, qd, kd, vd, od, ld);
        kva_compare_tensor(what, o.t, c->qo, c->hq, c->d, od, kva_tol_for(c->dt), NULL);
        kva_compare_lse(what, lse, ld, nlse, c->dt, NULL);
        CHECK_MSG(view_pad_damage(&o) == 0, "%s: wrote outside the output view", what);
        const unsigned char *tail = (const unsigned char *)(lse + nlse);
        for (int i = 0; i < 16; ++i)
            CHECK_MSG(tail[i] == 0xFF, "%s: wrote past the LSE", what);
        free(qd);
        free(kd);
        free(vd);
        free(od);
        free(ld);
    }
    free(q.data);
    free(k.data);
    free(v.data);
    free(o.data);
    free(lse);
}

static kva_context *cpu_context(void) {
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    return ctx;
}

/* ---- the tests ----------------------------------------------------------------------------------
 */

/* Every dtype x head dim, random GQA ratio, lengths, mask and layout. */
KVA_TEST_CPU_VARIANTS(cpu_attention_dtypes_and_head_dims) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dts[3] = {KVA_F32, KVA_F16, KVA_BF16};
    const int32_t dims[4] = {64, 128, 256, 80};
    const int32_t ratios[4] = {1, 2, 4, 8};
    for (int di = 0; di < 3; ++di)
        for (int hi = 0; hi < 4; ++hi) {
            int32_t hk = kva_rng_int(&rng, 1, 2), ratio = ratios[kva_rng_int(&rng, 0, 3)];
            int32_t qo = kva_rng_int(&rng, 1, quick() ? 40 : 90);
            int32_t kv = qo + kva_rng_int(&rng, 0, quick() ? 40 : 90);
            dense_case c = base_case(dts[di], hk * ratio, hk, dims[hi], qo, kv);
            c.causal = kva_rng_int(&rng, 0, 1);
            c.hnd = kva_rng_int(&rng, 0, 1);
            c.pad = kva_rng_int(&rng, 0, 1);
            check_dense(ctx, &rng, &c);
        }
    kva_context_destroy(ctx);
}

/* GQA ratios 1/2/4/8 with tile-straddling lengths, causal and not. */
KVA_TEST_CPU_VARIANTS(cpu_attention_gqa_ratios) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t ratios[4] = {1, 2, 4, 8};
    for (int ri = 0; ri < 4; ++ri)
        for (int causal = 0; causal <= 1; ++causal) {
            dense_case c =
                base_case(KVA_F16, 2 * ratios[ri], 2, 64, quick() ? 37 : 67, quick() ? 50 : 131);
            c.causal = causal;
            check_dense(ctx, &rng, &c);
        }
    /* MQA with a group larger than a pass holds (tokens x heads > 256 rows) */
    dense_case c = base_case(KVA_BF16, 32, 1, 64, 70, 90);
    c.causal = 1;
    check_dense(ctx, &rng, &c);
    kva_context_destroy(ctx);
}

/* Empty and one-token sides, lengths around the 16-lane / 64-row / 48-key block edges, and
 * causal with more queries than keys (the first queries see nothing: 0 and -inf). */
KVA_TEST_CPU_VARIANTS(cpu_attention_edge_lengths) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t lens[][2] = {{0, 0},   {0, 5},   {1, 0},    {3, 0},    {1, 1},   {1, 77},
                               {5, 5},   {16, 16}, {17, 49},  {48, 48},  {49, 97}, {63, 64},
                               {64, 64}, {65, 65}, {100, 47}, {129, 130}};
    const int n = (int)(sizeof lens / sizeof lens[0]);
    for (int i = 0; i < n; ++i)
        for (int causal = 0; causal <= 1; ++causal) {
            if (quick() && lens[i][0] > 64) continue;
            dense_case c = base_case(i % 2 ? KVA_F32 : KVA_BF16, 4, 2, 32, lens[i][0], lens[i][1]);
            c.causal = causal;
            check_dense(ctx, &rng, &c);
        }
    kva_context_destroy(ctx);
}

/* Window, soft cap, sm_scale and score_mod, alone and together with the causal mask. */
KVA_TEST_CPU_VARIANTS(cpu_attention_variants) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t windows[5] = {0, 1, 7, 50, 1000};
    for (int causal = 0; causal <= 1; ++causal) {
        for (int w = 0; w < 5; ++w) {
            dense_case c = base_case(KVA_F32, 8, 2, 64, 70, 150);
            c.causal = causal;
            c.window = windows[w];
            check_dense(ctx, &rng, &c);
        }
        dense_case c = base_case(KVA_F16, 8, 4, 128, 60, 110);
        c.causal = causal;
        c.cap = 1.5f;
        check_dense(ctx, &rng, &c);
        c.cap = 30.0f;
        c.scale = 0.5f; /* sharp scores: the running max moves between key blocks */
        check_dense(ctx, &rng, &c);
        c.dt = KVA_F32;
        check_dense(ctx, &rng, &c);
        c.cap = 0;
        c.scale = 0.3f;
        c.mod = alibi_mod;
        check_dense(ctx, &rng, &c);
        c.mod = holes_mod;
        c.window = 20;
        check_dense(ctx, &rng, &c);
        c.dt = KVA_BF16;
        c.cap = 2.0f;
        c.hnd = 1;
        check_dense(ctx, &rng, &c);
    }
    kva_context_destroy(ctx);
}

/* NHD and HND, packed and padded, one thread and the default. */
KVA_TEST(cpu_attention_layouts_and_threads) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    for (int threads = 1; threads >= 0; --threads) {
        CHECK_OK(kva_context_set_threads(ctx, threads));
        for (int hnd = 0; hnd <= 1; ++hnd)
            for (int32_t pad = 0; pad <= 2; pad += 2) {
                dense_case c = base_case(KVA_F16, 6, 3, 96, 45, 81);
                c.causal = 1;
                c.hnd = hnd;
                c.pad = pad;
                check_dense(ctx, &rng, &c);
            }
    }
    kva_context_destroy(ctx);
}

/* K and V are separate views: each is read through its own strides (here V in the other layout,
 * padded differently), one thread and all. */
KVA_TEST_CPU_VARIANTS(cpu_attention_k_and_v_views_differ) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dts[3] = {KVA_F32, KVA_F16, KVA_BF16};
    for (int threads = 1; threads >= 0; --threads) {
        CHECK_OK(kva_context_set_threads(ctx, threads));
        for (int hnd = 0; hnd <= 1; ++hnd)
            for (int32_t pad = 0; pad <= 2; pad += 2) {
                dense_case c = base_case(dts[kva_rng_int(&rng, 0, 2)], 8, 2, 64, kva_rng_int(&rng, 1, 70),
                                         kva_rng_int(&rng, 70, 140));
                c.causal = kva_rng_int(&rng, 0, 1);
                c.hnd = hnd;
                c.pad = pad;
                c.v_other = 1;
                check_dense(ctx, &rng, &c);
            }
    }
    kva_context_destroy(ctx);
}

/* Changing keys and values after position p must leave every query at position <= p
 * bit-identical (seed 003, test 2), while later queries do change (so the check can fail). */
KVA_TEST(cpu_attention_causal_independence) {
    kva_context *ctx = cpu_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dts[3] = {KVA_F32, KVA_F16, KVA_BF16};
    for (int di = 0; di < 3; ++di) {
        const kva_dtype dt = dts[di];
        const int32_t hq = 8, hk = 2, D = 64, n = quick() ? 90 : 150;
        const int32_t window = di == 2 ? 40 : -1;
        const size_t es = kva_dtype_size(dt);
        size_t qn = (size_t)n * hq * D, kn = (size_t)n * hk * D;
        void *q = kva_test_alloc(qn * es), *k = kva_test_alloc(kn * es),
             *v = kva_test_alloc(kn * es);
        void *o1 = kva_test_alloc(qn * es), *o2 = kva_test_alloc(qn * es);
        float *l1 = kva_test_alloc(sizeof(float) * n * hq),
              *l2 = kva_test_alloc(sizeof(float) * n * hq);
        kva_fill_random(&rng, q, dt, qn, -2.0f, 2.0f);
        kva_fill_random(&rng, k, dt, kn, -1.0f, 1.0f);
        kva_fill_random(&rng, v, dt, kn, -1.0f, 1.0f);
        kva_attn_params p = kva_attn_params_default(hq, hk, D);
        p.causal = 1;
        p.window_left = window;
        kva_tensor tq = kva_tensor_nhd(q, dt, hq, D), tk = kva_tensor_nhd(k, dt, hk, D);
        kva_tensor tv = kva_tensor_nhd(v, dt, hk, D);
        CHECK_OK(kva_attention(ctx, &p, n, n, tq, tk, tv, kva_tensor_nhd(o1, dt, hq, D), l1));
        const int32_t pos = kva_rng_int(&rng, n / 3, n - 10);
        size_t row = (size_t)hk * D;
        /* extreme values, as in the seed's test */
        kva_fill_random(&rng, (char *)k + (size_t)(pos + 1) * row * es, dt,
                        (size_t)(n - pos - 1) * row, 20.0f, 30.0f);
        kva_fill_random(&rng, (char *)v + (size_t)(pos + 1) * row * es, dt,
                        (size_t)(n - pos - 1) * row, -30.0f, 30.0f);
        CHECK_OK(kva_attention(ctx, &p, n, n, tq, tk, tv, kva_tensor_nhd(o2, dt, hq, D), l2));
        size_t prefix = (size_t)(pos + 1) * hq;
        CHECK_MSG(memcmp(o1, o2, prefix * D * es) == 0,
                  "%s: outputs of queries <= %d changed with later keys", kva_dtype_name(dt), pos);
        CHECK_MSG(memcmp(l1, l2, prefix * sizeof(float)) == 0,
                  "%s: LSE of queries <= %d changed with later keys", kva_dtype_name(dt), pos);
        CHECK_MSG(memcmp((char *)o1 + prefix * D * es, (char *)o2 + prefix * D * es,
                         (qn - prefix * D) * es) != 0,
                  "%s: later queries did not change: the check cannot fail", kva_dtype_name(dt));
        free(q);
        free(k);
        free(v);
        free(o1);
        free(o2);
        free(l1);
        free(l2);
    }
    kva_context_destroy(ctx);
}
