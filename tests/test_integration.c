/*
 * test_integration.c -- the pieces together, as seed 001 asks: chunked prefill into the paged
 * cache followed by 1000 single-token decode steps (reserve, append, plan, run at every step)
 * must equal full causal attention at every step; the cache must account every page exactly
 * and give all of them back; the plain dense kva_attention keeps working next to the cache;
 * and the serving simulation of `kvattn run` (tools/serve_sim.c) verifies clean, with and
 * without preemption. KVA_TEST_QUICK=1 (the ASan run) shortens the decode to 200 steps.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/reference/reference.h"
#include "../tools/serve_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { NUM_SEQS = 3, HQ = 4, HK = 2, D = 64, CHUNK = 29 };

static int quick(void) {
    const char *e = getenv("KVA_TEST_QUICK");
    return e && e[0] == '1';
}

/* One request: every position's Q, K, V (dtype and double), and the output the incremental
 * path produced for it. */
typedef struct seq_data {
    int32_t id;      /* cache sequence */
    int32_t prompt;
    int32_t len;     /* tokens in the cache */
    unsigned char *q, *k, *v, *out;
    double *qd, *kd, *vd;
} seq_data;

static void seq_init(seq_data *s, kva_rng *rng, kva_dtype dt, int32_t prompt, int32_t cap) {
    size_t es = kva_dtype_size(dt);
    memset(s, 0, sizeof *s);
    s->prompt = prompt;
    s->q = kva_test_alloc((size_t)cap * HQ * D * es);
    s->out = kva_test_alloc((size_t)cap * HQ * D * es);
    s->k = kva_test_alloc((size_t)cap * HK * D * es);
    s->v = kva_test_alloc((size_t)cap * HK * D * es);
    s->qd = kva_test_alloc(sizeof(double) * (size_t)cap * HQ * D);
    s->kd = kva_test_alloc(sizeof(double) * (size_t)cap * HK * D);
    s->vd = kva_test_alloc(sizeof(double) * (size_t)cap * HK * D);
    kva_fill_random(rng, s->q, dt, (size_t)cap * HQ * D, -2.0f, 2.0f);
    kva_fill_random(rng, s->k, dt, (size_t)cap * HK * D, -1.0f, 1.0f);
    kva_fill_random(rng, s->v, dt, (size_t)cap * HK * D, -1.0f, 1.0f);
    kva_poison(s->out, (size_t)cap * HQ * D * es);
    kva_ref_read_tensor(kva_tensor_nhd(s->q, dt, HQ, D), 0, cap, HQ, D, s->qd);
    kva_ref_read_tensor(kva_tensor_nhd(s->k, dt, HK, D), 0, cap, HK, D, s->kd);
    kva_ref_read_tensor(kva_tensor_nhd(s->v, dt, HK, D), 0, cap, HK, D, s->vd);
}

static void seq_free(seq_data *s) {
    free(s->q); free(s->out); free(s->k); free(s->v);
    free(s->qd); free(s->kd); free(s->vd);
}

/* Copies rows [pos, pos+n) of a [cap][heads][D] array into dst (dtype). */
static size_t copy_rows(unsigned char *dst, const unsigned char *src, int32_t pos, int32_t n,
                        int32_t heads, size_t es) {
    size_t bytes = (size_t)n * heads * D * es;
    memcpy(dst, src + (size_t)pos * heads * D * es, bytes);
    return bytes;
}

/* The cache holds exactly ceil(len / page) pages per sequence and sum(len) tokens. */
static void check_accounting(kva_cache *cache, const seq_data *seqs, int32_t page_size) {
    kva_cache_stats st;
    CHECK_OK(kva_cache_get_stats(cache, &st));
    int32_t pages = 0;
    int64_t tokens = 0;
    for (int i = 0; i < NUM_SEQS; ++i) {
        pages += (seqs[i].len + page_size - 1) / page_size;
        tokens += seqs[i].len;
    }
    CHECK_MSG(st.used_pages == pages && st.free_pages == st.num_pages - pages,
              "used %d / free %d pages, expected %d used of %d", st.used_pages, st.free_pages,
              pages, st.num_pages);
    CHECK(st.num_tokens == tokens);
    CHECK(st.num_sequences == NUM_SEQS);
}

/* Appends rows [len, len+n_i) of every sequence (n[i] may be 0 for some) to layer 0. */
static kva_status reserve_and_append(kva_cache *cache, seq_data *seqs, const int32_t *n,
                                     unsigned char *stage_k, unsigned char *stage_v, kva_dtype dt) {
    const size_t es = kva_dtype_size(dt);
    int32_t ids[NUM_SEQS], counts[NUM_SEQS], m = 0;
    size_t off = 0;
    for (int i = 0; i < NUM_SEQS; ++i) {
        if (n[i] == 0) continue;
        ids[m] = seqs[i].id;
        counts[m++] = n[i];
        copy_rows(stage_k + off, seqs[i].k, seqs[i].len, n[i], HK, es);
        off += copy_rows(stage_v + off, seqs[i].v, seqs[i].len, n[i], HK, es);
    }
    kva_status st = kva_cache_reserve(cache, m, ids, counts);
    if (st != KVA_OK) return st;
    return kva_cache_append(cache, 0, m, ids, counts, kva_tensor_nhd(stage_k, dt, HK, D),
                            kva_tensor_nhd(stage_v, dt, HK, D));
}

static void incremental_equals_full(kva_dtype dt, int32_t page_size) {
    const int32_t steps = quick() ? 200 : 1000;
    const int32_t prompts[NUM_SEQS] = {1, 37, 150};
    const size_t es = kva_dtype_size(dt);
    const kva_tol tol = kva_tol_for(dt);
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());

    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    /* One worker: each of the ~10k calls below is microseconds of work that threads would not
     * speed up (under OpenMP, on a shared machine, its team barriers made this 0.4 s vs 11 s).
     * Threaded kernels are covered by their own tests and by the simulation tests below. */
    CHECK_OK(kva_context_set_threads(ctx, 1));
    int32_t cap = 0, pool = 5;
    for (int i = 0; i < NUM_SEQS; ++i) {
        int32_t total = prompts[i] + steps;
        if (total > cap) cap = total;
        pool += (total + page_size - 1) / page_size;
    }
    kva_cache_config cc = {1, HK, D, page_size, pool, dt, KVA_LAYOUT_NHD, NUM_SEQS, NUM_SEQS * CHUNK};
    kva_cache *cache = NULL;
    REQUIRE_OK(kva_cache_create(ctx, &cc, &cache));

    seq_data seqs[NUM_SEQS];
    for (int i = 0; i < NUM_SEQS; ++i) {
        seq_init(&seqs[i], &rng, dt, prompts[i], cap);
        CHECK_OK(kva_cache_add_sequence(cache, &seqs[i].id));
    }
    unsigned char *stage_k = kva_test_alloc((size_t)NUM_SEQS * CHUNK * HK * D * es);
    unsigned char *stage_v = kva_test_alloc((size_t)NUM_SEQS * CHUNK * HK * D * es);
    unsigned char *stage_q = kva_test_alloc((size_t)NUM_SEQS * CHUNK * HQ * D * es);
    unsigned char *stage_o = kva_test_alloc((size_t)NUM_SEQS * CHUNK * HQ * D * es);
    unsigned char *dense_o = kva_test_alloc((size_t)cap * HQ * D * es);
    double *ref_o = kva_test_alloc(sizeof(double) * (size_t)cap * HQ * D);
    int32_t ids[NUM_SEQS], indptr[NUM_SEQS + 1], last[NUM_SEQS], qo_indptr[NUM_SEQS + 1];
    int32_t *indices = kva_test_alloc(sizeof(int32_t) * (size_t)pool);
    for (int i = 0; i < NUM_SEQS; ++i) ids[i] = seqs[i].id;

    kva_plan_limits lim = {NUM_SEQS, pool, (int64_t)pool * page_size, NUM_SEQS * CHUNK,
                           HQ, HK, D, page_size, 0};
    kva_workspace dws, pws;
    CHECK_OK(kva_decode_workspace_size(ctx, &lim, &dws.device_bytes, &dws.host_bytes));
    CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &pws.device_bytes, &pws.host_bytes));
    CHECK_OK(kva_malloc(ctx, dws.device_bytes, &dws.device));
    CHECK_OK(kva_host_alloc(ctx, dws.host_bytes, &dws.host));
    CHECK_OK(kva_malloc(ctx, pws.device_bytes, &pws.device));
    CHECK_OK(kva_host_alloc(ctx, pws.host_bytes, &pws.host));
    kva_attn_params p = kva_attn_params_default(HQ, HK, D);
    p.causal = 1;
    kva_kv_pages pages;
    CHECK_OK(kva_cache_layer_pages(cache, 0, &pages));
    kva_plan plan;
    double max_err = 0;

    /* Chunked prefill of every prompt: chunks of up to CHUNK tokens, all sequences batched. */
    while (kva_test_failures == 0) {
        int32_t n[NUM_SEQS], m = 0, pids[NUM_SEQS], pidx[NUM_SEQS];
        qo_indptr[0] = 0;
        size_t qoff = 0;
        for (int i = 0; i < NUM_SEQS; ++i) {
            int32_t left = seqs[i].prompt - seqs[i].len;
            n[i] = left < CHUNK ? left : CHUNK;
            if (n[i] == 0) continue;
            pids[m] = seqs[i].id;
            pidx[m] = i;
            qoff += copy_rows(stage_q + qoff, seqs[i].q, seqs[i].len, n[i], HQ, es);
            qo_indptr[m + 1] = qo_indptr[m] + n[i];
            ++m;
        }
        if (m == 0) break;
        CHECK_OK(reserve_and_append(cache, seqs, n, stage_k, stage_v, dt));
        kva_page_table pt;
        CHECK_OK(kva_cache_page_table(cache, m, pids, indptr, indices, pool, last, &pt));
        CHECK_OK(kva_prefill_plan(ctx, &lim, m, qo_indptr, NULL, &pt, pool, NULL, pws, &plan));
        kva_poison(stage_o, qoff);
        CHECK_OK(kva_prefill_run_paged(ctx, &plan, &p, kva_tensor_nhd(stage_q, dt, HQ, D), &pages,
                                       kva_tensor_nhd(stage_o, dt, HQ, D), NULL));
        for (int j = 0; j < m; ++j) {
            seq_data *s = &seqs[pidx[j]];
            int32_t c = n[pidx[j]], kv = s->len + c;
            kva_ref_attention(&p, c, kv, s->qd + (size_t)s->len * HQ * D, s->kd, s->vd, ref_o, NULL);
            const unsigned char *rows = stage_o + (size_t)qo_indptr[j] * HQ * D * es;
            kva_compare_tensor("prefill chunk vs reference", kva_tensor_nhd((void *)rows, dt, HQ, D),
                               c, HQ, D, ref_o, tol, &max_err);
            memcpy(s->out + (size_t)s->len * HQ * D * es, rows, (size_t)c * HQ * D * es);
        }
        for (int i = 0; i < NUM_SEQS; ++i) seqs[i].len += n[i];
        check_accounting(cache, seqs, page_size);
    }

    /* Decode: every step appends one token per sequence and attends over all of them. */
    const int32_t ones[NUM_SEQS] = {1, 1, 1};
    for (int32_t step = 0; step < steps && kva_test_failures == 0; ++step) {
        size_t qoff = 0;
        for (int i = 0; i < NUM_SEQS; ++i)
            qoff += copy_rows(stage_q + qoff, seqs[i].q, seqs[i].len, 1, HQ, es);
        CHECK_OK(reserve_and_append(cache, seqs, ones, stage_k, stage_v, dt));
        for (int i = 0; i < NUM_SEQS; ++i) ++seqs[i].len;
        kva_page_table pt;
        CHECK_OK(kva_cache_page_table(cache, NUM_SEQS, ids, indptr, indices, pool, last, &pt));
        CHECK_OK(kva_decode_plan(ctx, &lim, &pt, pool, NULL, dws, &plan));
        kva_poison(stage_o, qoff);
        CHECK_OK(kva_decode_run(ctx, &plan, &p, kva_tensor_nhd(stage_q, dt, HQ, D), &pages,
                                kva_tensor_nhd(stage_o, dt, HQ, D), NULL));
        for (int i = 0; i < NUM_SEQS; ++i) {
            seq_data *s = &seqs[i];
            const int32_t pos = s->len - 1;
            const unsigned char *row = stage_o + (size_t)i * HQ * D * es;
            /* The last row of full causal attention over the sequence so far, dense kernel... */
            kva_poison(dense_o, (size_t)HQ * D * es);
            CHECK_OK(kva_attention(ctx, &p, 1, s->len,
                                   kva_tensor_nhd(s->q + (size_t)pos * HQ * D * es, dt, HQ, D),
                                   kva_tensor_nhd(s->k, dt, HK, D), kva_tensor_nhd(s->v, dt, HK, D),
                                   kva_tensor_nhd(dense_o, dt, HQ, D), NULL));
            double dense_ref[HQ * D];
            kva_ref_read_tensor(kva_tensor_nhd(dense_o, dt, HQ, D), 0, 1, HQ, D, dense_ref);
            kva_compare_tensor("decode vs dense kva_attention", kva_tensor_nhd((void *)row, dt, HQ, D),
                               1, HQ, D, dense_ref, tol, NULL);
            /* ...and the float64 reference. */
            kva_ref_attention(&p, 1, s->len, s->qd + (size_t)pos * HQ * D, s->kd, s->vd, ref_o, NULL);
            kva_compare_tensor("decode vs reference", kva_tensor_nhd((void *)row, dt, HQ, D), 1, HQ, D,
                               ref_o, tol, &max_err);
            memcpy(s->out + (size_t)pos * HQ * D * es, row, (size_t)HQ * D * es);
        }
        check_accounting(cache, seqs, page_size);
    }

    /* Full causal attention over each whole sequence, dense: every row equals the output the
     * incremental path produced for that position, and its last rows match the reference. */
    for (int i = 0; i < NUM_SEQS && kva_test_failures == 0; ++i) {
        seq_data *s = &seqs[i];
        kva_poison(dense_o, (size_t)s->len * HQ * D * es);
        CHECK_OK(kva_attention(ctx, &p, s->len, s->len, kva_tensor_nhd(s->q, dt, HQ, D),
                               kva_tensor_nhd(s->k, dt, HK, D), kva_tensor_nhd(s->v, dt, HK, D),
                               kva_tensor_nhd(dense_o, dt, HQ, D), NULL));
        double *inc = kva_test_alloc(sizeof(double) * (size_t)s->len * HQ * D);
        kva_ref_read_tensor(kva_tensor_nhd(s->out, dt, HQ, D), 0, s->len, HQ, D, inc);
        kva_compare_tensor("full causal vs incremental", kva_tensor_nhd(dense_o, dt, HQ, D), s->len,
                           HQ, D, inc, tol, NULL);
        free(inc);
        const int32_t tail = s->len < 16 ? s->len : 16;
        kva_ref_attention(&p, tail, s->len, s->qd + (size_t)(s->len - tail) * HQ * D, s->kd, s->vd,
                          ref_o, NULL);
        kva_compare_tensor("full causal (last rows) vs reference",
                           kva_tensor_nhd(dense_o + (size_t)(s->len - tail) * HQ * D * es, dt, HQ, D),
                           tail, HQ, D, ref_o, tol, &max_err);
    }

    /* Every page comes back. */
    for (int i = 0; i < NUM_SEQS; ++i) CHECK_OK(kva_cache_free_sequence(cache, seqs[i].id));
    kva_cache_stats st;
    CHECK_OK(kva_cache_get_stats(cache, &st));
    CHECK_MSG(st.free_pages == st.num_pages && st.used_pages == 0 && st.num_sequences == 0 &&
                  st.num_tokens == 0,
              "after freeing: %d free of %d, %d used, %d sequences, %lld tokens", st.free_pages,
              st.num_pages, st.used_pages, st.num_sequences, (long long)st.num_tokens);

    kva_free(ctx, dws.device); kva_host_free(ctx, dws.host);
    kva_free(ctx, pws.device); kva_host_free(ctx, pws.host);
    for (int i = 0; i < NUM_SEQS; ++i) seq_free(&seqs[i]);
    free(stage_k); free(stage_v); free(stage_q); free(stage_o); free(dense_o); free(ref_o);
    free(indices);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
}

KVA_TEST(integration_incremental_decode_equals_full_causal_bf16_page16) {
    incremental_equals_full(KVA_BF16, 16);
}

KVA_TEST(integration_incremental_decode_equals_full_causal_f32_page3) {
    incremental_equals_full(KVA_F32, 3);
}

/* ---- the serving simulation's core loop ---------------------------------------------------- */

static void small_sim(sim_config *cfg) {
    sim_config_default(cfg);
    cfg->num_requests = quick() ? 8 : 14;
    cfg->seed = kva_test_seed();
    cfg->num_layers = 2;
    cfg->num_qo_heads = 4;
    cfg->num_kv_heads = 2;
    cfg->head_dim = 32;
    cfg->page_size = 5;
    cfg->token_budget = 40;
    cfg->max_batch = 5;
    cfg->prompt_len[0] = 1;
    cfg->prompt_len[1] = 70;
    cfg->output_len[0] = 0;
    cfg->output_len[1] = 30;
    cfg->verify_every = 1;
    cfg->verify_requests = 3;
}

static void check_clean(const sim_config *cfg, const sim_result *r) {
    CHECK_MSG(r->requests_finished == cfg->num_requests, "%d of %d requests finished",
              r->requests_finished, cfg->num_requests);
    CHECK(r->verified_steps == r->steps);
    CHECK(r->verified_rows > 0);
    CHECK_MSG(r->verify_failures == 0, "%lld rows off the reference (max |err| %g)",
              (long long)r->verify_failures, r->max_abs_err);
    CHECK_MSG(r->cache_mismatches == 0, "%lld K/V values read back differ from what was appended",
              (long long)r->cache_mismatches);
    CHECK_MSG(r->leaked_pages == 0, "%d pages or sequences left after the run", r->leaked_pages);
    CHECK(r->peak_pages <= r->num_pages);
    CHECK(r->decode_tokens > 0 && r->prefill_tokens > 0);
    /* Every position is computed once, plus the re-prefill of preempted requests. */
    CHECK_MSG(r->prefill_tokens + r->decode_tokens ==
                  r->prompt_tokens + r->output_tokens + r->recomputed_tokens,
              "prefill %lld + decode %lld != prompt %lld + output %lld + recomputed %lld",
              (long long)r->prefill_tokens, (long long)r->decode_tokens,
              (long long)r->prompt_tokens, (long long)r->output_tokens,
              (long long)r->recomputed_tokens);
    CHECK(r->decode_tokens <= r->output_tokens);
}

KVA_TEST(integration_serving_sim_verifies_clean) {
    sim_config cfg;
    small_sim(&cfg);
    cfg.dtype = KVA_BF16;
    cfg.num_pages = 400; /* roomy: no preemption expected */
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    sim_result r;
    kva_status st = sim_run(ctx, &cfg, &r);
    CHECK_MSG(st == KVA_OK, "sim_run: %s (%s)", kva_status_str(st), r.error);
    if (st == KVA_OK) {
        check_clean(&cfg, &r);
        CHECK(r.preemptions == 0);
        /* Every prompt token went through prefill exactly once and every output token decoded. */
        CHECK(r.recomputed_tokens == 0);
        CHECK(r.prefill_tokens == r.prompt_tokens && r.decode_tokens == r.output_tokens);
    }
    kva_context_destroy(ctx);
}

KVA_TEST(integration_serving_sim_preempts_on_tiny_pool) {
    sim_config cfg;
    small_sim(&cfg);
    cfg.dtype = KVA_F32;
    cfg.layout = KVA_LAYOUT_HND;
    /* Every request ends with 70..100 tokens (14..20 pages of 5) and the pool has 22 pages, so
     * as soon as two run together (the second is admitted with the budget the first one's
     * prefill leaves) one must be preempted, whatever the seed. */
    cfg.prompt_len[0] = 50;
    cfg.output_len[0] = 20;
    cfg.num_pages = 22;
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    sim_result r;
    kva_status st = sim_run(ctx, &cfg, &r);
    CHECK_MSG(st == KVA_OK, "sim_run: %s (%s)", kva_status_str(st), r.error);
    if (st == KVA_OK) {
        check_clean(&cfg, &r);
        CHECK_MSG(r.preemptions > 0, "no preemption with a %d-page pool", cfg.num_pages);
        CHECK(r.recomputed_tokens > 0);
    }
    /* A pool too small for the longest request is refused up front, not run forever. */
    cfg.num_pages = 19;
    st = sim_run(ctx, &cfg, &r);
    CHECK(st == KVA_ERR_INVALID_ARG);
    kva_context_destroy(ctx);
}
