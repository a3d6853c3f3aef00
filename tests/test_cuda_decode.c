/*
 * test_cuda_decode.c -- GPU batched paged decode against the float64 reference, through the
 * public API: every dtype x head dim x page size (1, 3, 16, 64) x batch (1, 7, 37), with lengths
 * 0 / 1 / odd / long, shuffled physical pages, all pool layouts, GQA groups 1..16, the attention
 * variants (sliding window, soft cap -- also far above the scores --, custom scale), split and
 * unsplit plans, LSE, and poisoned outputs that must be fully written. Then head dims between
 * the built ones (32..256, multiples of 16, run on the next built kernel), GQA groups above 16
 * (sub-groups: 17, 48, 64, 71, 128), the global-rowmax algorithm (two launches, plain-sum
 * merge), the two-level merge of requests split into more than 16 chunks, and the shared merge
 * (its withdrawal path too), and peaked scores (sm_scale 2..8: the running max jumps mid-unit).
 * KVA_TEST_QUICK=1 (sanitizer runs) shrinks every sweep.
 */
#include "harness.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "../src/cuda/cuda_backend.h"
#include "../src/plan/workspace_layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct decode_case {
    kva_dtype dtype;
    int32_t head_dim, page_size, batch, num_qo_heads, num_kv_heads, layout, max_len;
    int variant;   /* 0 plain, 1 sliding window, 2 soft cap, 3 causal + custom scale, 4 a soft cap
                    * far above the scores (1e4 .. 1e6: tanh(x) ~ x, which a cancelling tanh loses),
                    * 5 peaked scores (sm_scale 2 .. 8: the running max jumps by tens of log2 units) */
    int plan_mode; /* 0 split by the planner, 1 KVA_PLAN_NO_SPLIT, 2 fixed chunk of 37 keys,
                    * 3 fixed_chunk keys, the workspace sized for it */
    bool with_lse;
    kva_decode_algo algo; /* 0 (partial rowmax) unless set */
    int32_t fixed_chunk;  /* plan_mode 3 */
} decode_case;

static const char *variant_name(int v) {
    static const char *n[] = {"plain", "window", "softcap", "causal+scale", "large-softcap", "peaked"};
    return v >= 0 && v <= 5 ? n[v] : "?";
}

static bool quick(void) {
    const char *e = getenv("KVA_TEST_QUICK");
    return e && e[0] == '1';
}

/* Plans and runs one case; compares o (and lse) against the reference. */
static void run_case(kva_context *ctx, kva_rng *rng, const decode_case *c, const int32_t *lens_in) {
    const int failures_before = kva_test_failures;
    const int32_t B = c->batch, Hq = c->num_qo_heads, Hk = c->num_kv_heads, D = c->head_dim;
    int32_t *lens = kva_test_alloc(sizeof(int32_t) * (size_t)(B > 0 ? B : 1));
    for (int32_t b = 0; b < B; ++b) lens[b] = lens_in ? lens_in[b] : cuda_test_pick_len(rng, c->max_len);

    cuda_paged_batch pb;
    cuda_test_workspace w = {0};
    void *q_dev = NULL, *o_dev = NULL, *q_host = NULL, *o_host = NULL;
    float *lse_dev = NULL, *lse_host = NULL;
    double *o_ref = NULL, *lse_ref = NULL;
    if (!cuda_paged_batch_make(ctx, rng, c->dtype, B, lens, Hk, D, c->page_size, c->layout, &pb))
        goto done;

    kva_attn_params p = kva_attn_params_default(Hq, Hk, D);
    if (c->variant == 1) p.window_left = kva_rng_int(rng, 0, c->max_len);
    if (c->variant == 2) p.logits_soft_cap = kva_rng_uniform(rng, 0.5f, 3.0f);
    if (c->variant == 4) p.logits_soft_cap = powf(10.0f, kva_rng_uniform(rng, 4.0f, 6.0f));
    if (c->variant == 5) p.sm_scale = kva_rng_uniform(rng, 2.0f, 8.0f);
    if (c->variant == 3) {
        p.causal = 1;
        p.sm_scale = kva_rng_uniform(rng, 0.05f, 0.4f);
    }

    kva_plan_limits lim = {0};
    lim.max_batch = B + 2;
    lim.max_total_pages = pb.indptr[B] + 5;
    lim.num_qo_heads = Hq;
    lim.num_kv_heads = Hk;
    lim.head_dim = D;
    lim.page_size = c->page_size;
    if (c->plan_mode == 3) lim.min_fixed_chunk = c->fixed_chunk;
    if (!cuda_test_workspace_make(ctx, &lim, &w)) goto done;

    const size_t es = kva_dtype_size(c->dtype);
    const size_t q_elems = (size_t)(B > 0 ? B : 1) * Hq * D;
    q_host = kva_test_alloc(q_elems * es);
    kva_fill_random(rng, q_host, c->dtype, q_elems, -1.f, 1.f);
    q_dev = cuda_test_upload(ctx, q_host, q_elems * es);
    /* Padded layouts also get a padded output view. */
    const int32_t o_pad = c->layout == CUDA_TEST_PADDED ? 8 : 0;
    const size_t o_elems = (size_t)(B > 0 ? B : 1) * Hq * (D + o_pad);
    o_dev = cuda_test_poisoned(ctx, o_elems * es);
    if (c->with_lse) lse_dev = cuda_test_poisoned(ctx, sizeof(float) * (size_t)(B > 0 ? B : 1) * Hq);
    if (!q_dev || !o_dev || (c->with_lse && !lse_dev)) goto done;
    kva_tensor qt = kva_tensor_nhd(q_dev, c->dtype, Hq, D);
    kva_tensor ot = {o_dev, c->dtype, (int64_t)Hq * (D + o_pad), D + o_pad};

    kva_plan_options opt = {0, 0, c->algo};
    if (c->plan_mode == 1) opt.flags = KVA_PLAN_NO_SPLIT;
    if (c->plan_mode == 2) opt.fixed_chunk_size = 37;
    if (c->plan_mode == 3) opt.fixed_chunk_size = c->fixed_chunk;
    kva_plan plan;
    if (getenv("KVA_TEST_TRACE"))
        printf("    run: %s D=%d page=%d batch=%d heads=%d/%d %s %s plan_mode=%d\n", kva_dtype_name(c->dtype), D,
               c->page_size, B, Hq, Hk, cuda_test_layout_name(c->layout), variant_name(c->variant), c->plan_mode);
    fflush(stdout);
    kva_status st = kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, &opt, w.ws, &plan);
    if (st == KVA_ERR_WORKSPACE_TOO_SMALL && c->plan_mode == 2) {
        /* More fixed chunks than the workspace holds (it is sized for the device's budget):
         * documented; fall back to the planner's own split. */
        opt.fixed_chunk_size = 0;
        st = kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, &opt, w.ws, &plan);
    }
    CHECK_MSG(st == KVA_OK, "plan: %s (%s)", kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto done;
    st = kva_decode_run(ctx, &plan, &p, qt, &pb.dev_pages, ot, lse_dev);
    CHECK_MSG(st == KVA_OK, "run: %s (%s)", kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto done;
    CHECK_OK(kva_synchronize(ctx));

    o_host = cuda_test_download(ctx, o_dev, o_elems * es);
    o_ref = kva_test_alloc(sizeof(double) * q_elems);
    lse_ref = kva_test_alloc(sizeof(double) * (size_t)(B > 0 ? B : 1) * Hq);
    cuda_ref_decode(&pb, &p, q_host, o_ref, lse_ref);
    kva_tensor oh = {o_host, c->dtype, ot.stride_token, ot.stride_head};
    kva_compare_tensor("decode o", oh, B, Hq, D, o_ref, kva_tol_for(c->dtype), NULL);
    if (c->with_lse) {
        lse_host = cuda_test_download(ctx, lse_dev, sizeof(float) * (size_t)(B > 0 ? B : 1) * Hq);
        kva_compare_lse("decode lse", lse_host, lse_ref, (size_t)B * Hq, c->dtype, NULL);
    }
    if (kva_test_failures != failures_before)
        printf("    case: %s D=%d page=%d batch=%d heads=%d/%d %s %s plan_mode=%d chunk=%d work=%d "
               "split=%d algo=%s\n",
               kva_dtype_name(c->dtype), D, c->page_size, B, Hq, Hk, cuda_test_layout_name(c->layout),
               variant_name(c->variant), c->plan_mode, plan.kv_chunk_size, plan.num_work,
               plan.split_kv, c->algo == KVA_DECODE_GLOBAL_ROWMAX ? "global" : "partial");

done:
    free(lens);
    free(q_host);
    free(o_host);
    free(lse_host);
    free(o_ref);
    free(lse_ref);
    kva_free(ctx, q_dev);
    kva_free(ctx, o_dev);
    kva_free(ctx, lse_dev);
    cuda_test_workspace_free(ctx, &w);
    cuda_paged_batch_free(ctx, &pb);
}

static const int32_t head_pairs[][2] = {{4, 4},  {8, 2},  {16, 2}, {16, 1}, {6, 2},
                                        {10, 2}, {12, 1}, {32, 8}, {5, 1}};

KVA_TEST(cuda_decode_sweep_matches_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dtypes[] = {KVA_BF16, KVA_F16, KVA_F32};
    const int32_t dims[] = {64, 128, 256}, pages[] = {1, 3, 16, 64}, batches[] = {1, 7, 37};
    int idx = 0;
    for (int di = 0; di < 3; ++di)
        for (int hi = 0; hi < 3; ++hi)
            for (int pi = 0; pi < 4; ++pi)
                for (int bi = 0; bi < 3; ++bi, ++idx) {
                    if (quick() && (dims[hi] != 128 || (pages[pi] != 3 && pages[pi] != 16) || batches[bi] == 37))
                        continue;
                    decode_case c = {0};
                    c.dtype = dtypes[di];
                    c.head_dim = dims[hi];
                    c.page_size = pages[pi];
                    c.batch = batches[bi];
                    const int32_t *hp = head_pairs[idx % 9];
                    c.num_qo_heads = hp[0];
                    c.num_kv_heads = hp[1];
                    c.layout = idx % CUDA_TEST_NUM_LAYOUTS;
                    c.max_len = c.batch == 1 ? (idx % 2 ? 1000 : 301) : c.batch == 7 ? 200 : 90;
                    c.variant = (idx / 5) % 4;
                    c.plan_mode = c.batch <= 7 ? (idx / 3) % 3 : (idx / 3) % 2;
                    c.with_lse = idx % 3 != 2;
                    run_case(ctx, &rng, &c, NULL);
                    if (kva_test_failures > 20) goto out;
                }
out:
    kva_context_destroy(ctx);
}

/* Long contexts split into many chunks (fused merge across ~30 blocks per KV head). */
KVA_TEST(cuda_decode_long_context_split_matches_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t lens[] = {quick() ? 3001 : 30001, 4097, 0};
    const kva_dtype dtypes[] = {KVA_BF16, KVA_F32};
    for (int i = 0; i < 2; ++i) {
        decode_case c = {dtypes[i], 128, 16, 3, 32, 8, i ? CUDA_TEST_HND : CUDA_TEST_NHD, 0, 0, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
        run_case(ctx, &rng, &c, lens);
    }
    kva_context_destroy(ctx);
}

/* Every dtype x built head dim (KVA_TEST_QUICK: quick_dim only), `per_dim` cases each: case idx
 * alternates a one-request batch on page size 3 (up to long_len keys, q_heads query heads; 32
 * takes the two-N-tile kernels) and a seven-request batch on page 16 (up to 200 keys, 8 query
 * heads), 2 KV heads, the layouts in turn, about a third of the plans unsplit, with LSE. */
static void run_dtype_dim_cases(int variant, int32_t quick_dim, int per_dim, int32_t long_len, int32_t q_heads) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dtypes[] = {KVA_BF16, KVA_F16, KVA_F32};
    const int32_t dims[] = {64, 128, 256};
    int idx = 0;
    for (int di = 0; di < 3; ++di)
        for (int hi = 0; hi < 3; ++hi)
            for (int k = 0; k < per_dim; ++k, ++idx) {
                if (quick() && dims[hi] != quick_dim) continue;
                decode_case c = {0};
                c.dtype = dtypes[di];
                c.head_dim = dims[hi];
                c.page_size = idx % 2 ? 16 : 3;
                c.batch = idx % 2 ? 7 : 1;
                c.num_qo_heads = idx % 2 ? 8 : q_heads;
                c.num_kv_heads = 2;
                c.layout = idx % CUDA_TEST_NUM_LAYOUTS;
                c.max_len = c.batch == 1 ? long_len : 200;
                c.variant = variant;
                c.plan_mode = (idx + di) % 3 == 2 ? 1 : 0; /* (quick runs get unsplit plans too) */
                c.with_lse = true;
                run_case(ctx, &rng, &c, NULL);
                if (kva_test_failures > 20) goto out;
            }
out:
    kva_context_destroy(ctx);
}

/* A soft cap far above the scores (1e4 .. 1e6) changes them by a relative ~1e-9 at most, so the
 * results are the uncapped ones to each dtype's precision: the kernels' tanh must keep small
 * arguments' digits (1 - 2 / (e^2x + 1) alone moved a score by up to cap * 6e-8). */
KVA_TEST(cuda_decode_large_soft_cap_matches_reference) { run_dtype_dim_cases(4, 128, 1, 1000, 8); }

/* Peaked scores (sm_scale 2 .. 8, scores spread over tens of log2 units): a unit's running max
 * keeps jumping by many log2 units long after its first tile, so the state's rescale of O and l
 * by tiny factors runs mid-unit, where scores near 1 settle the max within a unit's first tiles.
 * A rescale that stops short (a lazy max with a slack, say) fails it: a mutant clamping the
 * factor at 2^-8 failed here in f16 and passed the other decode tests (bench/NOTES.md). */
KVA_TEST(cuda_decode_peaked_scores_match_reference) { run_dtype_dim_cases(5, 64, 2, 3000, 32); }

/* A batch whose requests are all empty: o = 0, lse = -inf, no NaN; an empty batch is a no-op. */
KVA_TEST(cuda_decode_empty_requests_give_zero_and_neg_inf) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t lens[] = {0, 0, 0, 0, 0};
    decode_case c = {KVA_F16, 64, 16, 5, 8, 2, CUDA_TEST_NHD, 0, 0, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
    run_case(ctx, &rng, &c, lens);
    decode_case e = {KVA_BF16, 128, 16, 0, 8, 2, CUDA_TEST_NHD, 0, 0, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
    run_case(ctx, &rng, &e, lens);
    kva_context_destroy(ctx);
}

/* One plan serves several layers (pools) and repeated runs give identical results, so the
 * fused merge's counters are back at zero after every run (after both launches of global
 * rowmax; checked directly, in the workspace): runs alternate two query sets, each compared
 * with its own first run. window_left >= 0 (a sliding window) leaves the long request's early
 * chunks empty: under KVA_DECODE_MERGE_WAIT_NS=0 their blocks arrive first and withdraw, so the
 * shared merge's claim path runs and resets its words (withdrawals: the context's count read
 * back, which must grow). */
static void repeated_runs(kva_decode_algo algo, int32_t Hq, int32_t Hk, int32_t fixed_chunk, int32_t window_left,
                          bool expect_withdrawals) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t B = 4, D = 128, ps = 16;
    int32_t lens[4] = {2000, 17, 0, 999};
    cuda_paged_batch pb;
    cuda_test_workspace w = {0};
    if (!cuda_paged_batch_make(ctx, &rng, KVA_BF16, B, lens, Hk, D, ps, CUDA_TEST_NHD, &pb)) goto out;
    kva_plan_limits lim = {B, pb.indptr[B], 0, 0, Hq, Hk, D, ps, 0};
    lim.min_fixed_chunk = fixed_chunk;
    if (!cuda_test_workspace_make(ctx, &lim, &w)) goto out;
    size_t n = (size_t)B * Hq * D * 2;
    /* two query sets in turns (a, b, a, b, ...): a run whose merge read a state left over from
     * the run before (the other set's) differs from the first run of its own set */
    void *qh = kva_test_alloc(2 * n);
    kva_fill_random(&rng, qh, KVA_BF16, (size_t)2 * B * Hq * D, -1.f, 1.f);
    void *q = cuda_test_upload(ctx, qh, 2 * n);
    kva_plan plan;
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D);
    p.window_left = window_left;
    kva_plan_options opt = {0, fixed_chunk, algo};
    CHECK_OK(kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, &opt, w.ws, &plan));
    CHECK(plan.split_kv == 1);
    void *first[2] = {NULL, NULL};
    for (int rep = 0; rep < 6; ++rep) {
        /* a fresh poisoned output each run: a run that leaves a merge undone cannot pass on the
         * previous run's values */
        void *o = cuda_test_poisoned(ctx, n);
        void *qs = (char *)q + (size_t)(rep % 2) * n;
        CHECK_OK(kva_decode_run(ctx, &plan, &p, kva_tensor_nhd(qs, KVA_BF16, Hq, D), &pb.dev_pages,
                                kva_tensor_nhd(o, KVA_BF16, Hq, D), NULL));
        void *got = cuda_test_download(ctx, o, n);
        kva_free(ctx, o);
        /* the merge counters (per request, and the merge tree's and shared merge's per work
         * item) are back at zero, where the next run or a graph replay needs them */
        const kva__plan_header *h = kva__plan_header_of(plan.workspace.host);
        const size_t cb = (size_t)(h->off_run_lse - h->off_counters);
        unsigned char *cnt = cuda_test_download(ctx, (char *)plan.workspace.device + h->off_counters, cb);
        size_t nonzero = 0;
        for (size_t i = 0; cnt && i < cb; ++i) nonzero += cnt[i] != 0;
        CHECK_MSG(cnt && nonzero == 0, "run %d left %zu counter bytes non-zero", rep, nonzero);
        free(cnt);
        if (!first[rep % 2]) first[rep % 2] = got;
        else {
            CHECK_MSG(memcmp(first[rep % 2], got, n) == 0, "run %d differs from run %d", rep, rep % 2);
            free(got);
        }
    }
    free(first[0]);
    free(first[1]);
    free(qh);
    kva_free(ctx, q);
    if (expect_withdrawals) {
        /* (only where the long request merges shared: every unit of the plan a block's only one
         * -- the grid holds them all, as on an H200 -- and the shared merge not switched off) */
        const kva__plan_header *h = kva__plan_header_of(plan.workspace.host);
        const int per_sm = kva__cuda_decode_blocks_per_sm(ctx, KVA_BF16, D, Hq / Hk, NULL);
        const char *off = getenv("KVA_DECODE_SHARED_MERGE");
        kva_device_info info;
        CHECK_OK(kva_context_info(ctx, &info));
        if ((int64_t)h->num_work * Hk <= (int64_t)per_sm * info.num_sms && !(off && strcmp(off, "0") == 0)) {
            uint64_t withdrawals = 0;
            CHECK_OK(kva__cuda_decode_merge_withdrawals(ctx, &withdrawals));
            CHECK_MSG(withdrawals > 0, "no block withdrew from the shared merge in 6 runs (%d/%d heads)", Hq, Hk);
        }
    }
out:
    cuda_test_workspace_free(ctx, &w);
    cuda_paged_batch_free(ctx, &pb);
    kva_context_destroy(ctx);
}

KVA_TEST(cuda_decode_repeated_runs_are_identical) {
    repeated_runs(KVA_DECODE_PARTIAL_ROWMAX, 16, 4, 0, -1, false);
    repeated_runs(KVA_DECODE_PARTIAL_ROWMAX, 16, 4, 100, -1, false); /* 20 chunks: the shared merge's counters */
}

/* The shared merge (decode_kernel.cuh: a split request whose chunk blocks have no next unit
 * merges on all of them) with KVA_DECODE_MERGE_WAIT_NS=0: every block that arrives before the
 * request's last chunk withdraws at once unless the others are already there, so the remaining
 * participants claim slices from a counter -- the path a GPU shared with other work takes. One
 * KV head and 8 KV heads, 16 .. 125 chunks (the shared merge's minimum is 16; batch 1, so each
 * request's chunks are their blocks' only units), every dtype, head dims 64 / 96 / 256, sliding
 * windows that leave chunks empty, a 48-head group on sub-groups; a ragged batch; then
 * repeated runs of one plan whose 20-chunk request merges shared and 10-chunk one on its last
 * block (the counters back at zero, results bitwise equal whoever merged). */
/* A ragged multi-round batch: one request of 20 chunks first in the plan's order, 60 short
 * requests after it, 8 KV heads (480+ units, more than the grid has blocks on most GPUs): blocks
 * walk their units last to first (non-graph plans), so the long request's chunks end their blocks
 * and merge shared while the short units ran before them; bf16 and f32, head dims 128 and 64. */
static void shared_merge_ragged(kva_context *ctx, kva_rng *rng) {
    int32_t lens[61];
    lens[0] = 20 * 128 - 5;
    for (int i = 1; i < 61; ++i) lens[i] = 1 + (int32_t)kva_rng_int(rng, 0, 127);
    const kva_dtype dts[2] = {KVA_BF16, KVA_F32};
    for (int i = 0; i < 2; ++i) {
        decode_case c = {dts[i], i ? 64 : 128, 16, 61, 32, 8, i % CUDA_TEST_NUM_LAYOUTS, 0, 0, 3, true,
                         KVA_DECODE_PARTIAL_ROWMAX, 128};
        run_case(ctx, rng, &c, lens);
    }
}

KVA_TEST(cuda_decode_shared_merge_ragged_matches_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    shared_merge_ragged(ctx, &rng);
    kva_context_destroy(ctx);
}

KVA_TEST(cuda_decode_shared_merge_withdrawals_match_reference) {
    kva_test_env env;
    kva_test_env_set(&env, "KVA_DECODE_MERGE_WAIT_NS", "0");
    kva_context *ctx = cuda_test_context();
    if (!ctx) {
        kva_test_env_restore(&env);
        return;
    }
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* variant 1: a sliding window over the request (0 .. len keys), so chunks before it are
     * empty (LSE -inf) in the merge; f32 48/1 runs the sub-group kernel (nsub = 3 units per
     * chunk, each merging its own heads) */
    const struct {
        kva_dtype dt;
        int32_t d, hq, hk, chunk, len, variant;
    } cases[] = {{KVA_BF16, 128, 8, 1, 64, 125 * 64 - 3, 0}, {KVA_F16, 64, 32, 8, 100, 1601, 0},
                 {KVA_F32, 128, 4, 1, 37, 20 * 37, 2},        {KVA_BF16, 96, 28, 4, 256, 8192, 1},
                 {KVA_BF16, 256, 16, 8, 512, 8000, 0},        {KVA_F32, 256, 8, 2, 300, 5100, 2},
                 {KVA_F32, 128, 48, 1, 64, 20 * 64, 0},       {KVA_BF16, 128, 8, 1, 64, 40 * 64, 1}};
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); ++i) {
        if (quick() && i % 2) continue;
        decode_case c = {cases[i].dt, cases[i].d, 16, 1, cases[i].hq, cases[i].hk, i % CUDA_TEST_NUM_LAYOUTS,
                         cases[i].len, cases[i].variant, 3, true, KVA_DECODE_PARTIAL_ROWMAX, cases[i].chunk};
        const int32_t lens[1] = {cases[i].len};
        run_case(ctx, &rng, &c, lens);
        if (kva_test_failures > 20) break;
    }
    shared_merge_ragged(ctx, &rng);
    kva_context_destroy(ctx);
    repeated_runs(KVA_DECODE_PARTIAL_ROWMAX, 16, 4, 100, -1, false);
    repeated_runs(KVA_DECODE_PARTIAL_ROWMAX, 8, 1, 100, -1, false);
    /* 2000 keys, a window of 451: chunks 0 .. 14 of 20 are empty and withdraw */
    repeated_runs(KVA_DECODE_PARTIAL_ROWMAX, 16, 4, 100, 450, true);
    repeated_runs(KVA_DECODE_PARTIAL_ROWMAX, 8, 1, 100, 450, true);
    kva_test_env_restore(&env);
}

KVA_TEST(cuda_decode_global_rowmax_repeated_runs_are_identical) {
    repeated_runs(KVA_DECODE_GLOBAL_ROWMAX, 16, 4, 0, -1, false);
    repeated_runs(KVA_DECODE_GLOBAL_ROWMAX, 48, 1, 0, -1, false); /* three sub-groups share one counter */
}

/* Head dims between the built kernels (64, 128, 256): each runs on the next built one with
 * zero-filled loads of q, K, V past the real dim and stores of o only inside it (o is poisoned:
 * a missing store fails; with dense o a store past the dim would clobber the next head). */
KVA_TEST(cuda_decode_head_dims_match_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dtypes[] = {KVA_BF16, KVA_F16, KVA_F32};
    const int32_t dims[] = {32, 48, 80, 96, 112, 144, 160, 192, 208, 240};
    const int32_t quick_dims[] = {32, 80, 192};
    const int nd = quick() ? 3 : 10;
    int idx = 0;
    for (int di = 0; di < 3; ++di)
        for (int k = 0; k < nd; ++k)
            for (int rep = 0; rep < 2; ++rep, ++idx) {
                if (quick() && dtypes[di] == KVA_F16) continue;
                decode_case c = {0};
                c.dtype = dtypes[di];
                c.head_dim = quick() ? quick_dims[k] : dims[k];
                c.page_size = rep ? 16 : 3;
                c.batch = rep ? 7 : 1;
                const int32_t *hp = head_pairs[idx % 9];
                c.num_qo_heads = hp[0];
                c.num_kv_heads = hp[1];
                c.layout = idx % CUDA_TEST_NUM_LAYOUTS;
                c.max_len = c.batch == 1 ? 700 : 150;
                c.variant = idx % 4;
                c.plan_mode = (idx / 2) % 3;
                c.with_lse = idx % 3 != 2;
                run_case(ctx, &rng, &c, NULL);
                if (kva_test_failures > 20) goto out;
            }
out:
    kva_context_destroy(ctx);
}

/* Paired KV heads (kva__decode_pair_for): where one head's K/V row is not whole 128-byte lines
 * but two adjacent heads' rows are (f16 / bf16 d32 and d96) and the pool keeps a token's heads
 * adjacent (NHD), one unit serves two KV heads with block-diagonal query rows and keeps its own
 * half of each output row. By default only plans that split no request pair; under
 * KVA_DECODE_PAIR_HEADS=1 every plan does (as a graph captured unsplit replays a split plan):
 * there every such dtype and dim, groups 1 .. 4 (a pair of up to 8 rows: one N tile), pages 1 / 3 /
 * 16, batches 1 / 7 / 37, planned, unsplit, fixed-37 and 32-key plans (28+ chunks: the shared
 * merge, the tree), both algorithms, the attention variants; then the default context on
 * unsplit plans. The chooser must take the pair in each case (else it would test the unpaired
 * path again); HND pools, f32, odd head counts, groups above 4 and split plans by default it must
 * not pair. */
static void paired_case(kva_context *ctx, kva_rng *rng, int idx, kva_dtype dtype, int32_t dim, bool hnd,
                        int plan_mode, int split_expected) {
    static const int32_t heads[][2] = {{2, 2}, {8, 4}, {16, 4}, {32, 8}, {32, 32}, {6, 2}};
    const int32_t pages[] = {1, 3, 16}, batches[] = {1, 7, 37};
    decode_case c = {0};
    c.dtype = dtype;
    c.head_dim = dim;
    /* (picks by co-prime strides of idx, so heads, pages, batch, plan and algorithm vary apart) */
    c.num_qo_heads = heads[idx % 6][0];
    c.num_kv_heads = heads[idx % 6][1];
    c.page_size = hnd ? 16 : pages[(idx / 2) % 3]; /* (HND pages of 1 token keep heads adjacent) */
    c.batch = batches[(idx / 5) % 3];
    c.layout = hnd ? CUDA_TEST_HND : (idx / 3) % 2 ? CUDA_TEST_NHD_INTERLEAVED : CUDA_TEST_NHD;
    c.variant = idx % 5;
    c.plan_mode = plan_mode >= 0 ? plan_mode : (idx / 7) % 4;
    /* 32-key chunks of up to 900 keys: 28 chunks; at batch 37 more units than blocks, so some
     * requests merge as a tree, the others shared */
    c.max_len = c.plan_mode == 3 || c.batch == 1 ? 900 : c.batch == 7 ? 300 : 100;
    c.fixed_chunk = 32;
    c.with_lse = (idx / 4) % 4 != 1;
    c.algo = (idx / 3) % 3 == 2 ? KVA_DECODE_GLOBAL_ROWMAX : KVA_DECODE_PARTIAL_ROWMAX;
    const int64_t stride_head = hnd ? (int64_t)c.page_size * dim : dim;
    const bool pairs = kva__cuda_decode_pairs_heads(ctx, dtype, dim, c.num_qo_heads / c.num_kv_heads, c.num_kv_heads,
                                                    stride_head, split_expected);
    CHECK_MSG(pairs == !hnd, "%s d%d %d/%d heads %s split %d: paired %d", kva_dtype_name(dtype), dim,
              c.num_qo_heads, c.num_kv_heads, cuda_test_layout_name(c.layout), split_expected, (int)pairs);
    run_case(ctx, rng, &c, NULL);
}

KVA_TEST(cuda_decode_paired_heads_match_reference) {
    static const struct { kva_dtype dtype; int32_t dim; } shapes[] = {
        {KVA_BF16, 96}, {KVA_F16, 96}, {KVA_BF16, 32}, {KVA_F16, 32}};
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int ns = quick() ? 2 : 4, per_shape = quick() ? 4 : 12;
    /* every plan paired */
    kva_test_env env, group_env;
    kva_test_env_set(&group_env, "KVA_DECODE_GROUP_PATH", NULL); /* (read per call by the chooser) */
    kva_test_env_set(&env, "KVA_DECODE_PAIR_HEADS", "1");
    kva_context *ctx = cuda_test_context();
    kva_test_env_restore(&env);
    kva_test_env_set(&env, "KVA_DECODE_PAIR_HEADS", NULL); /* (the default, for the second context) */
    if (!ctx) goto out;
    int idx = 0;
    for (int si = 0; si < ns; ++si) {
        const int s = quick() ? si * 2 : si; /* quick: bf16 d96 and d32 */
        for (int k = 0; k <= per_shape && kva_test_failures <= 20; ++k, ++idx)
            paired_case(ctx, &rng, idx, shapes[s].dtype, shapes[s].dim, k == per_shape, -1, 1);
    }
    kva_context_destroy(ctx);
    /* by default: unsplit plans only, never f32 */
    ctx = cuda_test_context();
    if (!ctx) goto out;
    for (int si = 0; si < ns && kva_test_failures <= 20; ++si, ++idx) {
        const int s = quick() ? si * 2 : si;
        paired_case(ctx, &rng, idx, shapes[s].dtype, shapes[s].dim, false, 1, 0);
        CHECK(!kva__cuda_decode_pairs_heads(ctx, shapes[s].dtype, shapes[s].dim, 1, 2, shapes[s].dim, 1));
    }
    CHECK(!kva__cuda_decode_pairs_heads(ctx, KVA_F32, 48, 1, 2, 48, 0));
    CHECK(!kva__cuda_decode_pairs_heads(ctx, KVA_BF16, 128, 1, 2, 128, 0)); /* (whole lines already) */
    CHECK(!kva__cuda_decode_pairs_heads(ctx, KVA_BF16, 96, 1, 3, 96, 0));   /* (an odd head left) */
    CHECK(!kva__cuda_decode_pairs_heads(ctx, KVA_BF16, 96, 8, 4, 96, 0));   /* (16 rows: two N tiles) */
    kva_context_destroy(ctx);
out:
    kva_test_env_restore(&env);
    kva_test_env_restore(&group_env);
}

/* GQA groups above 16: on a device with the warp-specialised prefill kernel, groups of 17..128
 * heads (bf16, f16; padded head dims too, on the next built prefill kernel) run the decode plan on it (the whole group in one
 * 128-row tile, the prefill merge); otherwise, and under KVA_DECODE_GROUP_PATH=subgroups, they are
 * served in sub-groups of <= 16 query heads (one unit each). Groups up to 16 keep one unit. Split
 * (fused merge over all sub-groups of a KV head) and unsplit plans, padded and built head dims,
 * both paths. */
static void large_groups(kva_context *ctx);

KVA_TEST(cuda_decode_large_groups_match_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    large_groups(ctx);
    kva_context_destroy(ctx);
}

/* The same on the prefill kernel for every plan (its long split beside empty and short requests
 * is otherwise planned onto the sub-group kernel, cuda_decode_large_groups_take_subgroups_...) */
KVA_TEST(cuda_decode_large_groups_prefill_path_matches_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_test_env env;
    kva_test_env_set(&env, "KVA_DECODE_GROUP_PATH", "prefill");
    large_groups(ctx);
    kva_test_env_restore(&env);
    kva_context_destroy(ctx);
}

KVA_TEST(cuda_decode_large_groups_subgroup_path_matches_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    setenv("KVA_DECODE_GROUP_PATH", "subgroups", 1);
    large_groups(ctx);
    unsetenv("KVA_DECODE_GROUP_PATH");
    kva_context_destroy(ctx);
}

static void large_groups(kva_context *ctx) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    static const int32_t groups[][2] = {{1, 1},  {3, 1},  {7, 2},  {16, 1}, {17, 1},  {48, 1},
                                        {64, 1}, {71, 1}, {34, 2}, {96, 2}, {128, 1}, {40, 4}};
    const kva_dtype dtypes[] = {KVA_BF16, KVA_F16, KVA_F32};
    const int32_t dims[] = {64, 80, 128, 192, 256};
    int idx = 0;
    for (int gi = 0; gi < 12; ++gi)
        for (int di = 0; di < 3; ++di, ++idx) {
            const int32_t g = groups[gi][0];
            if (quick() && ((g != 17 && g != 48 && g != 71) || dtypes[di] == KVA_F16)) continue;
            decode_case c = {0};
            c.dtype = dtypes[di];
            c.head_dim = dims[idx % 5];
            c.page_size = idx % 2 ? 16 : 7;
            c.batch = idx % 2 ? 1 : 5;
            c.num_qo_heads = groups[gi][0] * groups[gi][1];
            c.num_kv_heads = groups[gi][1];
            c.layout = idx % CUDA_TEST_NUM_LAYOUTS;
            c.max_len = c.batch == 1 ? 900 : 200;
            c.variant = idx % 4;
            c.plan_mode = idx % 3;
            c.with_lse = idx % 4 != 3;
            run_case(ctx, &rng, &c, NULL);
            if (kva_test_failures > 20) goto out;
        }
    {
        /* MQA with 71 heads over a long split context, and 64 heads on one KV head. */
        const int32_t lens[] = {quick() ? 2500 : 12001, 0, 33};
        decode_case c = {KVA_BF16, 64, 16, 3, 71, 1, CUDA_TEST_NHD, 0, 0, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
        run_case(ctx, &rng, &c, lens);
        decode_case d = {KVA_F32, 128, 16, 3, 64, 1, CUDA_TEST_HND, 0, 0, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
        run_case(ctx, &rng, &d, lens);
        decode_case e = {KVA_F16, 128, 16, 3, 96, 2, CUDA_TEST_NHD, 0, 2, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
        run_case(ctx, &rng, &e, lens);
        /* a request split into more chunks than the decode kernel's merge tree's first level */
        decode_case f = {KVA_BF16, 128, 3, 3, 48, 1, CUDA_TEST_HND, 0, 1, 3, true, KVA_DECODE_PARTIAL_ROWMAX, 128};
        run_case(ctx, &rng, &f, lens);
    }
out:
    return;
}

/* A CUDA context where GQA groups above 16 take the prefill kernel -- an sm_90a build on an sm_90
 * device, KVA_PREFILL_PATH unset or hopper, KVA_DECODE_GROUP_PATH not subgroups -- with its SM
 * count, or NULL (the test skipped: elsewhere the sub-group decode kernel runs them, planned by
 * its own policy, which its merge tree marks). */
static kva_context *large_groups_on_prefill_kernel(int32_t *sms, kva__workspace_layout *layout) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return NULL;
    const kva_plan_limits probe = {1, 1, 0, 0, 71, 1, 64, 16, 0};
    const kva_status st = kva__compute_layout(ctx, &probe, KVA__PLAN_DECODE, layout);
    CHECK_OK(st);
    kva_device_info info;
    const kva_status si = kva_context_info(ctx, &info);
    CHECK_OK(si);
    if (st != KVA_OK || si != KVA_OK || layout->policy.merge_tree) {
        if (st == KVA_OK && si == KVA_OK) kva_test_skip("GQA groups above 16 run on the sub-group decode kernel here");
        kva_context_destroy(ctx);
        return NULL;
    }
    *sms = info.num_sms;
    return ctx;
}

/* The work items of a decode plan of B requests of L keys (pages of 16 in order, one KV head) at Hq
 * query heads and head dim D, with algorithm algo and plan flags; its chunk in *chunk and, where
 * subgroups is not NULL, kva__plan_header.decode_subgroups in *subgroups. -1 on failure. */
static int64_t plan_one_kv_head_with(kva_context *ctx, int32_t B, int32_t L, int32_t Hq, int32_t D, kva_decode_algo algo,
                                     uint32_t flags, int32_t *chunk, int32_t *subgroups) {
    const int32_t ps = 16, pages = (L + ps - 1) / ps;
    int32_t *indptr = (int32_t *)kva_test_alloc(sizeof(int32_t) * (B + 1));
    int32_t *indices = (int32_t *)kva_test_alloc(sizeof(int32_t) * (size_t)B * pages);
    int32_t *last = (int32_t *)kva_test_alloc(sizeof(int32_t) * B);
    for (int32_t b = 0; b <= B; ++b) indptr[b] = b * pages;
    for (int64_t i = 0; i < (int64_t)B * pages; ++i) indices[i] = (int32_t)i;
    for (int32_t b = 0; b < B; ++b) last[b] = L - (pages - 1) * ps;
    const kva_page_table table = {B, indptr, indices, last};
    kva_plan_limits lim = {B, (int64_t)B * pages, 0, 0, Hq, 1, D, ps, 0};
    cuda_test_workspace w = {0};
    int64_t units = -1;
    if (cuda_test_workspace_make(ctx, &lim, &w)) {
        kva_plan plan;
        kva_plan_options opt = {flags, 0, algo};
        const kva_status st = kva_decode_plan(ctx, &lim, &table, (int64_t)B * pages, &opt, w.ws, &plan);
        CHECK_OK(st);
        if (st == KVA_OK) {
            units = plan.num_work;
            *chunk = plan.kv_chunk_size;
            if (subgroups) *subgroups = kva__plan_header_of(plan.workspace.host)->decode_subgroups;
        }
        cuda_test_workspace_free(ctx, &w);
    }
    free(indptr);
    free(indices);
    free(last);
    return units;
}

static int64_t plan_one_kv_head(kva_context *ctx, int32_t B, int32_t L, int32_t Hq, int32_t D, kva_decode_algo algo,
                                int32_t *chunk) {
    return plan_one_kv_head_with(ctx, B, L, Hq, D, algo, 0, chunk, NULL);
}

/* Decode of groups above 16 runs on the prefill kernel's persistent grid (one block per SM), where
 * a block's second chunk and the merge launch of a split plan cost more than streaming the keys
 * (H200: Falcon-7B 71/1 d64, 64 x 4096 in 2 chunks of 2048 39.5 us, in 4 of 1024 45.5, no split
 * 52.9; bench/NOTES.md). So the plans keep every block at one chunk: a batch whose requests
 * alone fill over half of the SMs stays unsplit, a smaller one is split within one round. (Plans
 * only; the large-group tests above run such plans against the reference. KVA_DECODE_GROUP_PATH=
 * prefill: a lone long request would otherwise be planned onto the sub-group kernel, below.) */
KVA_TEST(cuda_decode_large_group_plans_fill_one_round) {
    int32_t sms = 0;
    kva__workspace_layout layout;
    kva_context *ctx = large_groups_on_prefill_kernel(&sms, &layout);
    if (!ctx) return;
    kva_test_env env;
    kva_test_env_set(&env, "KVA_DECODE_GROUP_PATH", "prefill");
    const int32_t shapes[][2] = {{sms / 2, 4096}, {sms - 1, 1024}, {sms / 2 + 1, 2048}, {sms / 4, 3000}, {1, 8192}};
    for (int si = 0; si < 5; ++si)
        for (int gi = 0; gi < 2; ++gi) {
            const int32_t B = shapes[si][0] > 0 ? shapes[si][0] : 1, L = shapes[si][1];
            const int32_t Hq = gi ? 48 : 71, D = gi ? 128 : 64;
            int32_t chunk = 0;
            /* (one KV head: a unit per work item) */
            const int64_t units = plan_one_kv_head(ctx, B, L, Hq, D, KVA_DECODE_PARTIAL_ROWMAX, &chunk);
            if (units < 0) continue;
            printf("    %d/1 d%d %d x %d on %d SMs: chunk %d, %lld work items\n", Hq, D, B, L, sms, chunk,
                   (long long)units);
            CHECK_MSG(units <= sms, "%d/1 %d x %d: %lld work items on %d SMs", Hq, B, L, (long long)units, sms);
            if (2 * B > sms) CHECK_MSG(units == B, "%d/1 %d x %d split (chunk %d)", Hq, B, L, chunk);
            else CHECK_MSG(units > B, "%d/1 %d x %d unsplit on %d SMs", Hq, B, L, sms);
        }
    kva_test_env_restore(&env);
    kva_context_destroy(ctx);
}

/* ... except where a plan on the sub-group decode kernel fits one round of its grid (the blocks it
 * keeps resident: 3 per SM at d64) with every split request in 16+ chunks
 * (kva__split_policy.subgroup_blocks) and a batch of few keys x sub-groups x head dim
 * (subgroup_max_keys; subgroup_long_max_keys where the requests average 16384+ keys): there its
 * chunk blocks merge together (the shared merge), and such a plan runs on that kernel (H200:
 * Falcon-7B and StarCoder-15B at 1 x 8192 16.5 / 15.8 -> 12.0 / 13.0 us, Falcon 4 x 4096 19.2 ->
 * 15.1, 1 x 32768 21.5 -> 20.0). A lone request of 8192 keys takes it at d64, d128 and d256, and
 * the long requests of 1 x 32768 at d64 and d128 and 2 x 16384 at d64; 1 x 8192 at d192 (4
 * sub-groups of the d256 kernel), 4 x 8192 at d64 (short requests), 8 x 4096 and a batch of half
 * the SMs' count hold too many keys; 6 x 2048 at d64 is searched but cannot split each request in
 * 16 chunks within one round (79 blocks); nor a graph plan (its capture holds one path), nor any
 * plan with KVA_DECODE_SHARED_MERGE=0. Then such batches run
 * against the float64 reference (run_case plans them the same way). */
KVA_TEST(cuda_decode_large_groups_take_subgroups_where_they_merge_shared) {
    const char *forced = getenv("KVA_DECODE_GROUP_PATH");
    if (forced && *forced) {
        kva_test_skip("KVA_DECODE_GROUP_PATH forces one path");
        return;
    }
    int32_t sms = 0;
    kva__workspace_layout layout;
    kva_context *ctx = large_groups_on_prefill_kernel(&sms, &layout);
    if (!ctx) return;
    const struct {
        int32_t B, L, Hq, D;
        uint32_t flags;
        int want;
    } cases[] = {{1, 8192, 71, 64, 0, 1},  {1, 8192, 48, 128, 0, 1},        {1, 8192, 32, 256, 0, 1},
                 {1, 32768, 48, 128, 0, 1}, {1, 32768, 71, 64, 0, 1},        {2, 16384, 71, 64, 0, 1},
                 {4, 4096, 71, 64, 0, 2},   {1, 8192, 64, 192, 0, 0},        {4, 8192, 71, 64, 0, 0},
                 {8, 4096, 71, 64, 0, 0},   {6, 2048, 71, 64, 0, 2},
                 {sms / 2, 4096, 48, 128, 0, 0}, {1, 8192, 71, 64, KVA_PLAN_GRAPH, 0},
                 /* requests of 8192-16384 keys on average: on the line between the two keys bounds */
                 {2, 10240, 71, 64, 0, 1},  {2, 12288, 48, 128, 0, 1},       {1, 12288, 71, 96, 0, 1},
                 {3, 10240, 71, 64, 0, 0},  {2, 10240, 71, 96, 0, 0},        {2, 10240, 32, 256, 0, 0}};
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); ++i) {
        const kva_plan_limits probe = {1, 1, 0, 0, cases[i].Hq, 1, cases[i].D, 16, 0};
        kva__workspace_layout gl;
        CHECK_OK(kva__compute_layout(ctx, &probe, KVA__PLAN_DECODE, &gl));
        int32_t chunk = 0, sub = -1;
        const int64_t units = plan_one_kv_head_with(ctx, cases[i].B, cases[i].L, cases[i].Hq, cases[i].D,
                                                    KVA_DECODE_PARTIAL_ROWMAX, cases[i].flags, &chunk, &sub);
        if (units < 0) continue;
        printf("    %d/1 d%d %d x %d%s: %s, chunk %d, %lld work items (sub-group budget %lld)\n", cases[i].Hq,
               cases[i].D, cases[i].B, cases[i].L, cases[i].flags ? " (graph)" : "",
               sub ? "sub-group kernel" : "prefill kernel", chunk, (long long)units,
               (long long)gl.policy.subgroup_blocks);
        /* (want 2: on the sub-groups iff this GPU's round holds 16 chunks per request -- 79 blocks
         * at d64 on a 132-SM H200, whose kernel keeps 3 per SM) */
        const int want = cases[i].want == 2 ? gl.policy.subgroup_blocks >= 16 * (int64_t)cases[i].B : cases[i].want;
        /* the round is every block the sub-group kernel keeps resident, not the split budget's
         * cap of 2 per SM (3 per SM at d64: 79 blocks of 5 sub-groups on a 132-SM H200) */
        int32_t nsub = 0;
        const int per_sm = kva__cuda_decode_blocks_per_sm(ctx, KVA_BF16, cases[i].D, cases[i].Hq, &nsub);
        if (per_sm > 0 && nsub > 1 && !cases[i].flags) {
            const int64_t round = (int64_t)sms * per_sm / nsub > 0 ? (int64_t)sms * per_sm / nsub : 1;
            CHECK_MSG(gl.policy.subgroup_blocks == round,
                      "%d/1 d%d: sub-group round %lld blocks, expected %d SMs x %d resident / %d sub-groups = %lld",
                      cases[i].Hq, cases[i].D, (long long)gl.policy.subgroup_blocks, sms, per_sm, nsub,
                      (long long)round);
        }
        CHECK_MSG(sub == want, "%d/1 %d x %d: decode_subgroups %d, expected %d", cases[i].Hq, cases[i].B,
                  cases[i].L, sub, want);
        if (sub == 1)
            CHECK_MSG(units <= gl.policy.subgroup_blocks && units / cases[i].B >= 16,
                      "%d/1 %d x %d: %lld work items (budget %lld)", cases[i].Hq, cases[i].B, cases[i].L,
                      (long long)units, (long long)gl.policy.subgroup_blocks);
    }
    kva_context_destroy(ctx);
    /* the shared merge off: every plan stays on the prefill kernel */
    kva_test_env env;
    kva_test_env_set(&env, "KVA_DECODE_SHARED_MERGE", "0");
    ctx = cuda_test_context();
    kva_test_env_restore(&env);
    if (ctx) {
        int32_t chunk = 0, sub = -1;
        if (plan_one_kv_head_with(ctx, 1, 8192, 71, 64, KVA_DECODE_PARTIAL_ROWMAX, 0, &chunk, &sub) >= 0)
            CHECK_MSG(sub == 0, "KVA_DECODE_SHARED_MERGE=0: 71/1 1 x 8192 on the sub-group kernel");
        kva_context_destroy(ctx);
    }
    /* the sub-group plans against the reference: a lone request (every dtype the prefill kernel
     * takes, paged HND and NHD, soft cap on one), and a batch with one long request beside short
     * unsplit ones */
    ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t one[1] = {8192 - 5}, mixed[3] = {9000, 7, 0}, long_pair[2] = {16384 + 5, 16384 - 3};
    decode_case a = {KVA_BF16, 64, 16, 1, 71, 1, CUDA_TEST_NHD, 0, 0, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
    run_case(ctx, &rng, &a, one);
    decode_case b = {KVA_F16, 128, 16, 1, 48, 1, CUDA_TEST_HND, 0, 2, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
    run_case(ctx, &rng, &b, one);
    decode_case c = {KVA_BF16, 80, 3, 3, 71, 1, CUDA_TEST_HND, 0, 0, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
    run_case(ctx, &rng, &c, mixed);
    /* two long requests (a mean of 16385 keys, 10.5 M keys x sub-groups x dim): a plan only the
     * long-request bound admits (as 2 x 16384 above) */
    decode_case d = {KVA_BF16, 64, 16, 2, 71, 1, CUDA_TEST_NHD, 0, 0, 0, true, KVA_DECODE_PARTIAL_ROWMAX, 0};
    run_case(ctx, &rng, &d, long_pair);
    kva_context_destroy(ctx);
}

/* Global rowmax of groups above 16 runs on the sub-group decode kernel, not the prefill one that
 * partial rowmax takes there, so its plans search that kernel's grid (SMs x blocks / sub-groups)
 * at its own costs, a split request's units at 1.85x their keys (pass 1 repeats the Q K^T):
 * batches of half and of three quarters the SMs' count at 4096 keys stay unsplit (H200,
 * StarCoder-15B 48/1 64 x 4096: unsplit 108.9 us, the prefill policy's two chunks 202.0; 100 x
 * 4096 at a 1.5x price: 640-key chunks, 310 us against 197 unsplit), 8 x 4096 splits into no more
 * units than that grid holds (the prefill kernel's grid took 128), and a lone request still
 * splits. */
KVA_TEST(cuda_decode_large_group_global_rowmax_plans) {
    int32_t sms = 0;
    kva__workspace_layout layout;
    kva_context *ctx = large_groups_on_prefill_kernel(&sms, &layout);
    if (!ctx) return;
    CHECK_MSG(layout.policy.global_search_blocks > 0, "no global-rowmax budget in the prefill-path policy");
    const int32_t shapes[][2] = {{sms / 2, 4096}, {sms * 3 / 4, 4096}, {8, 4096}, {1, 8192}};
    for (int si = 0; si < 4; ++si)
        for (int gi = 0; gi < 2; ++gi) {
            const int32_t B = shapes[si][0] > 0 ? shapes[si][0] : 1, L = shapes[si][1];
            const int32_t Hq = gi ? 48 : 71, D = gi ? 128 : 64;
            const kva_plan_limits group_probe = {1, 1, 0, 0, Hq, 1, D, 16, 0};
            kva__workspace_layout gl;
            CHECK_OK(kva__compute_layout(ctx, &group_probe, KVA__PLAN_DECODE, &gl));
            int32_t chunk = 0;
            const int64_t units = plan_one_kv_head(ctx, B, L, Hq, D, KVA_DECODE_GLOBAL_ROWMAX, &chunk);
            if (units < 0) continue;
            printf("    global rowmax %d/1 d%d %d x %d on %d SMs: chunk %d, %lld work items (budget %lld)\n", Hq, D,
                   B, L, sms, chunk, (long long)units, (long long)gl.policy.global_search_blocks);
            if (B > 8) CHECK_MSG(units == B, "%d/1 %d x %d split (chunk %d)", Hq, B, L, chunk);
            else CHECK_MSG(units > B && units <= (B > 1 ? gl.policy.global_search_blocks : units),
                           "%d/1 %d x %d: %lld work items (budget %lld)", Hq, B, L, (long long)units,
                           (long long)gl.policy.global_search_blocks);
        }
    kva_context_destroy(ctx);
}

/* Seed 002's global-rowmax algorithm on CUDA: pass 1 writes each chunk's row max and the last
 * block of a request reduces them; pass 2 exponentiates against the request's max and merges by
 * a plain sum. Split by the planner, unsplit, fixed small chunks; every dtype; built and padded
 * head dims; groups up to 48; all variants; LSE. */
KVA_TEST(cuda_decode_global_rowmax_matches_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    static const int32_t pairs[][2] = {{4, 4}, {8, 2}, {32, 8}, {7, 1}, {16, 2}, {48, 1}, {6, 2}};
    const kva_dtype dtypes[] = {KVA_BF16, KVA_F16, KVA_F32};
    const int32_t dims[] = {64, 80, 128, 256}, batches[] = {1, 7, 37};
    int idx = 0;
    for (int di = 0; di < 3; ++di)
        for (int hi = 0; hi < 4; ++hi)
            for (int bi = 0; bi < 3; ++bi)
                for (int mode = 0; mode < 3; ++mode, ++idx) {
                    if (quick() && (dtypes[di] == KVA_F16 || hi % 2 == 1 || bi == 2)) continue;
                    decode_case c = {0};
                    c.dtype = dtypes[di];
                    c.head_dim = dims[hi];
                    c.page_size = idx % 2 ? 16 : 3;
                    c.batch = batches[bi];
                    const int32_t *hp = pairs[idx % 7];
                    c.num_qo_heads = hp[0];
                    c.num_kv_heads = hp[1];
                    c.layout = idx % CUDA_TEST_NUM_LAYOUTS;
                    c.max_len = c.batch == 1 ? (idx % 2 ? 1000 : 301) : c.batch == 7 ? 200 : 90;
                    c.variant = (idx / 5) % 4;
                    c.plan_mode = mode;
                    c.with_lse = idx % 3 != 2;
                    c.algo = KVA_DECODE_GLOBAL_ROWMAX;
                    run_case(ctx, &rng, &c, NULL);
                    if (kva_test_failures > 20) goto out;
                }
    {
        /* Long contexts split into many chunks, an empty request beside them. */
        const int32_t lens[] = {quick() ? 3001 : 30001, 4097, 0};
        const kva_dtype dts[] = {KVA_BF16, KVA_F32};
        for (int i = 0; i < 2; ++i) {
            decode_case c = {dts[i], 128, 16, 3, 32, 8, i ? CUDA_TEST_HND : CUDA_TEST_NHD, 0, 0, 0, true,
                             KVA_DECODE_GLOBAL_ROWMAX, 0};
            run_case(ctx, &rng, &c, lens);
        }
        const int32_t empty[] = {0, 0, 0};
        decode_case e = {KVA_F16, 96, 16, 3, 8, 2, CUDA_TEST_NHD, 0, 0, 0, true, KVA_DECODE_GLOBAL_ROWMAX, 0};
        run_case(ctx, &rng, &e, empty);
    }
out:
    kva_context_destroy(ctx);
}

/* The two-level merge of a request split into more than KVA__MERGE_RUN (16) chunks: runs of 16
 * merged into their first slot, then the runs merged (decode_kernel.cuh). Chunk counts 16 (one
 * level), 17 (a last run of one state), 33 and 125, beside short and empty requests; one KV head
 * (one merging block per run), 8 KV heads, a 71-head group (sub-groups merge their own runs),
 * f32, head dims 96 and 256 at 8 KV heads; soft cap on some. KVA_DECODE_SHARED_MERGE=0: where
 * a case's units fit one round of the grid (the one-KV-head rows), its requests of 16+ chunks
 * would take the shared merge instead. */
KVA_TEST(cuda_decode_merge_tree_matches_reference) {
    kva_test_env env;
    kva_test_env_set(&env, "KVA_DECODE_SHARED_MERGE", "0");
    kva_context *ctx = cuda_test_context();
    kva_test_env_restore(&env);
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t chunk = 40;
    const int32_t lens[4][4] = {{16 * chunk, 5, 0, 1},
                                {16 * chunk + 1, 33 * chunk - 7, 2, 0},
                                {125 * chunk, 17 * chunk, 16 * chunk + 39, 100},
                                {33 * chunk, 0, 0, 1}};
    /* 8 KV heads make more units than the grid has blocks, so merging blocks often have a next
     * unit in flight and merge straight from L2 (the path whose run-slot LSE store must wait for
     * every thread's reads); head dims 96 and 256 spread one head's columns over two warps */
    const struct {
        kva_dtype dt;
        int32_t d, hq, hk, layout, variant;
    } heads[6] = {{KVA_BF16, 128, 8, 1, CUDA_TEST_NHD, 0},
                  {KVA_F16, 128, 32, 8, CUDA_TEST_HND, 2},
                  {KVA_BF16, 64, 71, 1, CUDA_TEST_NHD, 0},
                  {KVA_F32, 128, 4, 2, CUDA_TEST_NHD, 2},
                  {KVA_BF16, 96, 32, 8, CUDA_TEST_NHD, 0},
                  {KVA_BF16, 256, 16, 8, CUDA_TEST_HND, 2}};
    for (int h = 0; h < 6; ++h)
        for (int l = 0; l < 4; ++l) {
            decode_case c = {heads[h].dt, heads[h].d, 16, 4, heads[h].hq, heads[h].hk, heads[h].layout,
                             0, heads[h].variant, 3, true, KVA_DECODE_PARTIAL_ROWMAX, chunk};
            run_case(ctx, &rng, &c, lens[l]);
            if (kva_test_failures > 20) goto out;
        }
out:
    kva_context_destroy(ctx);
}
