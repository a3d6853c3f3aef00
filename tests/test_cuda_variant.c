/*
 * test_cuda_variant.c -- GPU attention variants (kva_variant, NVRTC) against the float64
 * reference driven by the equivalent C callback: the four example variants of
 * examples/variant_sources.h (built-in ALiBi, a T5-style bucketed bias read from caller data, a
 * document mask, soft cap as a snippet), each one text compiled for the GPU and expanded as the
 * reference's score_mod, so both sides compute the same modifier.
 *
 *   cuda_variant_decode          every variant x dtype x head dims 64 / 96 / 128 / 256 x GQA
 *                                groups 1, 4, 16, 24 (sub-groups) x both algorithms, odd lengths,
 *                                split (fixed chunks) and automatic plans, window and soft cap on
 *                                top; every o and LSE element checked
 *   cuda_variant_decode_far_score_is_nan  a modifier's finite score beyond log2 range makes its
 *                                row NaN (never a mask), a masked key weighs 0
 *   cuda_variant_prefill_paged   paged prefill (chunked: queries <= keys), causal and not, split
 *                                and unsplit plans, page sizes 1 / 16; the device's prefill path
 *                                (on Hopper the warp-specialised TMA kernel)
 *   cuda_variant_prefill_ragged  ragged K/V, the same sweep at head dims 48 / 96 / 192 (padded to
 *                                the next built kernel); and kva_attention (dense)
 *   cuda_variant_prefill_mma     the paged sweep on the mma.sync kernels (KVA_PREFILL_PATH=mma)
 *   cuda_variant_prefill_wgmma   and on the wgmma kernel (KVA_PREFILL_PATH=wgmma, Hopper)
 *   cuda_variant_alibi_barriers_below_base  native ALiBi with its mbarriers in the alignment's
 *                                slack (a test shift of its shared memory; the H200 never gives it)
 *   cuda_variant_graph_replay    a KVA_PLAN_GRAPH decode run with a variant captured in a CUDA
 *                                graph replays correctly after re-planning
 *   cuda_variant_errors          a compile error on a GPU context (status, NVRTC's log, nothing
 *                                created), kernels the variant was not compiled for, score_mod on
 *                                CUDA, both set
 *   cuda_variant_cache           first-use compile, the context's cache, the disk cache in a fresh
 *                                context (cached load time; target < 50 ms), a corrupt entry
 *                                rebuilt; prints the times
 *   cuda_variant_bench           soft cap as a snippet vs the built-in soft cap, ALiBi vs plain, on
 *                                the decode (32/8 d128 bf16, 8 x 4096 and 64 x 4096) and prefill
 *                                (1 x 16384 causal) headline shapes, and 32 x 512 causal, on
 *                                random and on constant inputs, the modes in a rotating order
 *                                with an idle pause before each series; prints times and ratios
 *
 * The disk cache of these tests lives in a temporary XDG_CACHE_HOME (set once per process).
 * KVA_TEST_QUICK=1 (compute-sanitizer memcheck) shrinks the sweeps and skips the bench.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* nanosleep (CMake defines it for every target) */
#endif
#include "harness.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "../src/cuda/cuda_backend.h"
#include "../src/common/dtype_convert.h"
#include "../src/reference/reference.h"
#include "../examples/variant_sources.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if KVA_HAVE_CUDA
#include <cuda_runtime_api.h>

/* The CPU twins of the example variants: the reference's score_mod. */
KVA_EX_DEFINE_T5(t5_cpu, )
KVA_EX_DEFINE_DOC_MASK(doc_mask_cpu, )
KVA_EX_DEFINE_SOFTCAP(softcap_cpu, )
KVA_EX_DEFINE_ALIBI(alibi_cpu, )

/* A modifier that sends every fifth key (kv_pos % 5 == 2) far out of range in the heads of mode 1
 * (-3e38: finite, but beyond the FLT_MAX / log2(e) that kvattn.h allows, so those rows must come
 * out NaN, never as if the key were masked) and masks it in the heads of mode 2; caller data:
 * int32 mode[qo_head]. */
#define FAR_KEY_BODY(NAME, CONST)                                                               \
    float NAME(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, CONST void *user) {  \
        const int32_t mode = ((const int32_t *)user)[qo_head];                                  \
        (void)q_pos;                                                                            \
        if (kv_pos % 5 != 2 || mode == 0) return score;                                         \
        return mode == 1 ? -3.0e38f : kva_masked();                                             \
    }
FAR_KEY_BODY(far_key_cpu, )

static bool quick(void) {
    const char *e = getenv("KVA_TEST_QUICK");
    return e && *e && *e != '0';
}

/* A private disk cache for this process's variant tests. */
static void use_test_cache(void) {
    static char dir[64];
    if (dir[0]) return;
    snprintf(dir, sizeof dir, "/tmp/kvattn-cuda-variant-XXXXXX");
    if (mkdtemp(dir)) setenv("XDG_CACHE_HOME", dir, 1);
}

/* A variant test's context (NULL: no CUDA device, the test skips), its private disk cache and
 * its random generator. */
static kva_context *variant_test_begin(kva_rng *rng) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return NULL;
    use_test_cache();
    kva_rng_seed(rng, kva_test_seed());
    return ctx;
}

#define MAX_HEADS 32
#define MAX_POS 8192

enum { EX_ALIBI, EX_T5, EX_DOC_MASK, EX_SOFTCAP, NUM_EX };
static const char *ex_name[NUM_EX] = {"alibi", "t5-bias", "doc-mask", "softcap-snippet"};

/* One example variant on a context: the GPU variant, its caller data on both sides. */
typedef struct ex_variant {
    kva_variant *v;
    kva_score_mod_fn cpu;
    void *host_user, *dev_user;
    const int32_t *far_mode; /* (far_key only: the per-head modes in host_user, see below) */
} ex_variant;

static void ex_free(kva_context *ctx, ex_variant *e) {
    kva_variant_destroy(e->v);
    free(e->host_user);
    if (e->dev_user) kva_free(ctx, e->dev_user);
    memset(e, 0, sizeof *e);
}

/* Builds example `which` (NULL options: every kernel) with random caller data. */
static bool ex_make(kva_context *ctx, kva_rng *rng, int which, const kva_variant_options *opt, ex_variant *e) {
    memset(e, 0, sizeof *e);
    size_t bytes = 0;
    kva_status st;
    if (which == EX_ALIBI) {
        bytes = sizeof(float) * MAX_HEADS;
        float *s = kva_test_alloc(bytes);
        kva_alibi_slopes(MAX_HEADS, s);
        /* steep slopes over a few thousand positions would hide all but the nearest keys: scaled
         * so the bias stays comparable to the scores */
        for (int h = 0; h < MAX_HEADS; ++h) s[h] *= 0.05f;
        e->host_user = s;
        e->cpu = alibi_cpu;
        st = kva_variant_create_alibi(ctx, opt, &e->v);
    } else if (which == EX_T5) {
        bytes = sizeof(int32_t) * KVA_EX_T5_MAX_DISTANCE + sizeof(float) * MAX_HEADS * KVA_EX_T5_BUCKETS;
        int32_t *t = kva_test_alloc(bytes);
        kva_ex_t5_buckets(t);
        float *bias = (float *)(t + KVA_EX_T5_MAX_DISTANCE);
        for (int i = 0; i < MAX_HEADS * KVA_EX_T5_BUCKETS; ++i) bias[i] = kva_rng_uniform(rng, -2.f, 2.f);
        e->host_user = t;
        e->cpu = t5_cpu;
        st = kva_variant_create(ctx, KVA_EX_SOURCE_T5, "t5_bias", opt, &e->v);
    } else if (which == EX_DOC_MASK) {
        bytes = sizeof(int32_t) * MAX_POS;
        int32_t *doc = kva_test_alloc(bytes);
        for (int32_t p = 0, id = 0; p < MAX_POS; ++id) {
            const int32_t len = kva_rng_int(rng, 1, 300);
            for (int32_t i = 0; i < len && p < MAX_POS; ++i) doc[p++] = id;
        }
        e->host_user = doc;
        e->cpu = doc_mask_cpu;
        st = kva_variant_create(ctx, KVA_EX_SOURCE_DOC_MASK, "doc_mask", opt, &e->v);
    } else {
        bytes = sizeof(float);
        float *cap = kva_test_alloc(bytes);
        *cap = kva_rng_uniform(rng, 0.5f, 3.0f);
        e->host_user = cap;
        e->cpu = softcap_cpu;
        st = kva_variant_create(ctx, KVA_EX_SOURCE_SOFTCAP, "softcap", opt, &e->v);
    }
    if (st != KVA_OK) {
        kva_test_fail(__FILE__, __LINE__, "creating variant %s: %s (%s)", ex_name[which], kva_status_str(st),
                      kva_last_error());
        ex_free(ctx, e);
        return false;
    }
    e->dev_user = cuda_test_upload(ctx, e->host_user, bytes);
    return e->dev_user != NULL;
}

/* The GPU params and the reference's params of one case. */
static void ex_params(const ex_variant *e, kva_attn_params *gpu, kva_attn_params *ref) {
    *ref = *gpu;
    gpu->variant = e->v;
    gpu->score_mod_user = e->dev_user;
    ref->score_mod = e->cpu;
    ref->score_mod_user = e->host_user;
}

/* ---- decode ---------------------------------------------------------------------------------- */

/* layout: a CUDA_TEST_* pool layout, or -1 for a random one */
static void decode_case(kva_context *ctx, kva_rng *rng, const ex_variant *e, kva_dtype dt, int32_t D, int32_t Hq,
                        int32_t Hk, kva_decode_algo algo, int extra, int layout, const char *name) {
    const int before = kva_test_failures;
    const int32_t B = quick() ? 3 : 7, max_len = quick() ? 300 : 1500;
    const int32_t ps = kva_rng_int(rng, 0, 1) ? 16 : 3;
    int32_t lens[8];
    for (int32_t b = 0; b < B; ++b) lens[b] = cuda_test_pick_len(rng, max_len);
    lens[0] = max_len; /* one long request: split plans */
    cuda_paged_batch pb;
    cuda_test_workspace w = {0};
    void *q_dev = NULL, *o_dev = NULL, *q_host = NULL, *o_host = NULL;
    float *lse_dev = NULL, *lse_host = NULL;
    double *o_ref = NULL, *lse_ref = NULL;
    kva_plan plan;
    memset(&plan, 0, sizeof plan);
    if (layout < 0) layout = kva_rng_int(rng, 0, CUDA_TEST_NUM_LAYOUTS - 1);
    if (!cuda_paged_batch_make(ctx, rng, dt, B, lens, Hk, D, ps, layout, &pb))
        return;
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D), ref;
    if (extra == 1) p.window_left = kva_rng_int(rng, 0, max_len);
    if (extra == 2) p.logits_soft_cap = kva_rng_uniform(rng, 1.0f, 5.0f);
    ex_params(e, &p, &ref);
    kva_plan_limits lim = {0};
    lim.max_batch = B;
    lim.max_total_pages = pb.indptr[B];
    lim.num_qo_heads = Hq;
    lim.num_kv_heads = Hk;
    lim.head_dim = D;
    lim.page_size = ps;
    lim.min_fixed_chunk = 64;
    if (!cuda_test_workspace_make(ctx, &lim, &w)) goto done;
    const size_t es = kva_dtype_size(dt), nq = (size_t)B * Hq * D;
    q_host = kva_test_alloc(nq * es);
    kva_fill_random(rng, q_host, dt, nq, -1.f, 1.f);
    q_dev = cuda_test_upload(ctx, q_host, nq * es);
    o_dev = cuda_test_poisoned(ctx, nq * es);
    lse_dev = cuda_test_poisoned(ctx, sizeof(float) * (size_t)B * Hq);
    if (!q_dev || !o_dev || !lse_dev) goto done;
    kva_plan_options opt = {0, extra == 3 ? 0 : 64 * kva_rng_int(rng, 1, 5), algo};
    kva_status st = kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, &opt, w.ws, &plan);
    CHECK_MSG(st == KVA_OK, "%s: plan: %s (%s)", name, kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto done;
    st = kva_decode_run(ctx, &plan, &p, kva_tensor_nhd(q_dev, dt, Hq, D), &pb.dev_pages, kva_tensor_nhd(o_dev, dt, Hq, D),
                        lse_dev);
    CHECK_MSG(st == KVA_OK, "%s: run: %s (%s)", name, kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto done;
    o_ref = kva_test_alloc(sizeof(double) * nq);
    lse_ref = kva_test_alloc(sizeof(double) * (size_t)B * Hq);
    cuda_ref_decode(&pb, &ref, q_host, o_ref, lse_ref);
    o_host = cuda_test_download(ctx, o_dev, nq * es);
    lse_host = cuda_test_download(ctx, lse_dev, sizeof(float) * (size_t)B * Hq);
    if (e->far_mode && o_host && lse_host) /* rows that saw a far key: NaN, every element (then zeroed) */
        for (int32_t b = 0; b < B; ++b)
            for (int32_t h = 0; h < Hq; ++h) {
                if (e->far_mode[h] != 1 || lens[b] < 3) continue;
                const size_t row = (size_t)b * Hq + h;
                unsigned char *got = (unsigned char *)o_host + row * D * es;
                int finite = !isnan(lse_host[row]);
                for (int32_t d = 0; d < D; ++d) finite += !isnan(kva__load_f32(got, dt, d));
                CHECK_MSG(finite == 0, "%s: request %d (length %d) head %d saw a far key: %d of %d values not NaN",
                          name, (int)b, (int)lens[b], (int)h, finite, (int)D + 1);
                memset(got, 0, D * es);
                for (int32_t d = 0; d < D; ++d) o_ref[row * D + d] = 0.0;
                lse_host[row] = 0.0f;
                lse_ref[row] = 0.0;
            }
    kva_compare(name, o_host, dt, o_ref, nq, kva_tol_for(dt), NULL);
    kva_compare_lse(name, lse_host, lse_ref, (size_t)B * Hq, dt, NULL);
done:
    if (kva_test_failures != before) printf("    failed: %s (page %d, split %d)\n", name, ps, plan.split_kv);
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

KVA_TEST(cuda_variant_decode) {
    kva_rng rng;
    kva_context *ctx = variant_test_begin(&rng);
    if (!ctx) return;
    static const kva_dtype dts[3] = {KVA_BF16, KVA_F16, KVA_F32};
    static const int32_t dims[4] = {64, 96, 128, 256};
    static const int32_t heads[4][2] = {{4, 4}, {16, 4}, {16, 1}, {24, 1}};
    const kva_variant_options dec = {KVA_VARIANT_DECODE, 0, 0};
    int cases = 0;
    for (int x = 0; x < NUM_EX; ++x) {
        ex_variant e;
        if (!ex_make(ctx, &rng, x, &dec, &e)) continue;
        for (int t = 0; t < 3; ++t)
            for (int d = 0; d < 4; ++d)
                for (int algo = 0; algo < 2; ++algo) {
                    if (quick() && (d & 1)) continue;
                    const int hi = (t + d + algo + x) % 4;
                    const int extra = kva_rng_int(&rng, 0, 3);
                    char name[160];
                    snprintf(name, sizeof name, "decode %s %s d%d %d/%d %s extra %d", ex_name[x], kva_dtype_name(dts[t]),
                             dims[d], heads[hi][0], heads[hi][1], algo ? "global-rowmax" : "partial", extra);
                    decode_case(ctx, &rng, &e, dts[t], dims[d], heads[hi][0], heads[hi][1], (kva_decode_algo)algo,
                                extra, -1, name);
                    ++cases;
                }
        ex_free(ctx, &e);
    }
    printf("    %d decode cases\n", cases);
    kva_context_destroy(ctx);
}

/* Variants on decode units of two KV heads (bf16 d96, NHD pools; made to pair every plan): the
 * modifier's query head, the native ALiBi's slopes and caller data by head must be the real
 * head's in both halves of a pair. The variant is built for every head dim (it pairs only where
 * it has both the d96 kernel's and the pair's build). */
KVA_TEST(cuda_variant_decode_paired_heads) {
    kva_test_env env;
    kva_test_env_set(&env, "KVA_DECODE_PAIR_HEADS", "1");
    kva_context *ctx = cuda_test_context();
    kva_test_env_restore(&env);
    if (!ctx) return;
    use_test_cache();
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_variant_options dec = {KVA_VARIANT_DECODE, 1u << KVA_BF16, 0};
    static const int32_t heads[3][2] = {{4, 4}, {16, 4}, {8, 4}};
    CHECK(kva__cuda_decode_pairs_heads(ctx, KVA_BF16, 96, 1, 4, 96, 1));
    for (int x = 0; x < NUM_EX; ++x) {
        ex_variant e;
        if (!ex_make(ctx, &rng, x, &dec, &e)) continue;
        for (int k = 0; k < 3; ++k) {
            const int algo = (x + k) % 2, extra = kva_rng_int(&rng, 0, 3);
            char name[160];
            snprintf(name, sizeof name, "paired decode %s bf16 d96 %d/%d %s extra %d", ex_name[x], heads[k][0],
                     heads[k][1], algo ? "global-rowmax" : "partial", extra);
            decode_case(ctx, &rng, &e, KVA_BF16, 96, heads[k][0], heads[k][1], (kva_decode_algo)algo, extra,
                        k == 1 ? CUDA_TEST_NHD_INTERLEAVED : CUDA_TEST_NHD, name);
        }
        ex_free(ctx, &e);
    }
    kva_context_destroy(ctx);
}

/* A modifier's finite score beyond log2 range (FAR_KEY_BODY: -3e38 on every fifth key of the heads
 * of mode 1) makes its row NaN -- o and LSE, through split-KV merges too --, never a mask; a key
 * the same modifier masks (mode 2) weighs 0; mode 0 rows are plain. bf16 and f16 (the mma kernels'
 * tile path, kva__tile_scores: its range test left out, these cases fail) and f32 (the per-score
 * path), head dims 64 and 128, groups of 4 (one N tile) and 16 (two), both algorithms, with and
 * without the soft cap. */
KVA_TEST(cuda_variant_decode_far_score_is_nan) {
    kva_rng rng;
    kva_context *ctx = variant_test_begin(&rng);
    if (!ctx) return;
    const kva_variant_options dec = {KVA_VARIANT_DECODE, 0, 0};
    int32_t mode[MAX_HEADS];
    for (int h = 0; h < MAX_HEADS; ++h) mode[h] = (h * 7 + 1) % 3;
    ex_variant e = {0};
    e.cpu = far_key_cpu;
    e.host_user = mode;
    e.far_mode = mode;
    kva_status st = kva_variant_create(ctx, KVA_EX_STR(FAR_KEY_BODY(far_key, const)), "far_key", &dec, &e.v);
    CHECK_MSG(st == KVA_OK, "far_key: %s (%s)", kva_status_str(st), kva_last_error());
    e.dev_user = st == KVA_OK ? cuda_test_upload(ctx, mode, sizeof mode) : NULL;
    if (e.dev_user) {
        static const kva_dtype dts[3] = {KVA_BF16, KVA_F16, KVA_F32};
        static const int32_t heads[2][2] = {{16, 4}, {32, 2}};
        for (int t = 0; t < 3; ++t)
            for (int d = 0; d < 2; ++d)
                for (int hi = 0; hi < 2; ++hi) {
                    const int algo = (t + d + hi) % 2, extra = (t + hi) % 2 ? 2 : 3;
                    char name[160];
                    snprintf(name, sizeof name, "decode far-key %s d%d %d/%d %s %s", kva_dtype_name(dts[t]),
                             d ? 128 : 64, heads[hi][0], heads[hi][1], algo ? "global-rowmax" : "partial",
                             extra == 2 ? "soft cap, fixed chunks" : "automatic plan");
                    decode_case(ctx, &rng, &e, dts[t], d ? 128 : 64, heads[hi][0], heads[hi][1],
                                (kva_decode_algo)algo, extra, -1, name);
                }
    }
    kva_variant_destroy(e.v);
    if (e.dev_user) kva_free(ctx, e.dev_user);
    kva_context_destroy(ctx);
}

/* ---- prefill ------------------------------------------------------------------------------- */

typedef struct pf_problem {
    kva_dtype dt;
    int32_t n, Hq, Hk, D;
    int32_t qo_indptr[9], kv_indptr[9], qo[8], kv[8];
    bool paged;
    cuda_paged_batch pb;     /* paged */
    void *k_host, *v_host;   /* ragged: [total_kv][Hk][D] */
    void *k_dev, *v_dev;
    void *q_host, *q_dev;    /* [total_qo][Hq][D] */
} pf_problem;

static void pf_free(kva_context *ctx, pf_problem *pr) {
    if (pr->paged) cuda_paged_batch_free(ctx, &pr->pb);
    free(pr->k_host);
    free(pr->v_host);
    free(pr->q_host);
    kva_free(ctx, pr->k_dev);
    kva_free(ctx, pr->v_dev);
    kva_free(ctx, pr->q_dev);
    memset(pr, 0, sizeof *pr);
}

static bool pf_make(kva_context *ctx, kva_rng *rng, kva_dtype dt, int32_t D, int32_t Hq, int32_t Hk, bool paged,
                    pf_problem *pr) {
    memset(pr, 0, sizeof *pr);
    pr->dt = dt;
    pr->D = D;
    pr->Hq = Hq;
    pr->Hk = Hk;
    pr->paged = paged;
    pr->n = quick() ? 2 : kva_rng_int(rng, 1, 5);
    const int32_t max_kv = quick() ? 200 : 1200;
    for (int32_t b = 0; b < pr->n; ++b) {
        pr->kv[b] = kva_rng_int(rng, 1, max_kv) | 1;
        const int32_t r = kva_rng_int(rng, 0, 3);
        pr->qo[b] = r == 0 ? 1 : r == 1 ? pr->kv[b] : kva_rng_int(rng, 1, pr->kv[b]);
        pr->qo_indptr[b + 1] = pr->qo_indptr[b] + pr->qo[b];
        pr->kv_indptr[b + 1] = pr->kv_indptr[b] + pr->kv[b];
    }
    const size_t es = kva_dtype_size(dt);
    const size_t nq = (size_t)pr->qo_indptr[pr->n] * Hq * D, nk = (size_t)pr->kv_indptr[pr->n] * Hk * D;
    pr->q_host = kva_test_alloc(nq * es);
    kva_fill_random(rng, pr->q_host, dt, nq, -1.f, 1.f);
    pr->q_dev = cuda_test_upload(ctx, pr->q_host, nq * es);
    if (paged)
        return pr->q_dev &&
               cuda_paged_batch_make(ctx, rng, dt, pr->n, pr->kv, Hk, D, kva_rng_int(rng, 0, 1) ? 16 : 1,
                                     CUDA_TEST_NHD, &pr->pb);
    pr->k_host = kva_test_alloc(nk * es);
    pr->v_host = kva_test_alloc(nk * es);
    kva_fill_random(rng, pr->k_host, dt, nk, -1.f, 1.f);
    kva_fill_random(rng, pr->v_host, dt, nk, -1.f, 1.f);
    pr->k_dev = cuda_test_upload(ctx, pr->k_host, nk * es);
    pr->v_dev = cuda_test_upload(ctx, pr->v_host, nk * es);
    return pr->q_dev && pr->k_dev && pr->v_dev;
}

/* The float64 reference of the whole batch: o_ref [total_qo][Hq][D], lse_ref [total_qo][Hq]. */
static void pf_reference(const pf_problem *pr, const kva_attn_params *ref, double *o_ref, double *lse_ref) {
    const int32_t Hq = pr->Hq, Hk = pr->Hk, D = pr->D;
    int32_t max_kv = 1, max_qo = 1;
    for (int32_t b = 0; b < pr->n; ++b) {
        if (pr->kv[b] > max_kv) max_kv = pr->kv[b];
        if (pr->qo[b] > max_qo) max_qo = pr->qo[b];
    }
    double *k = kva_test_alloc(sizeof(double) * (size_t)max_kv * Hk * D);
    double *v = kva_test_alloc(sizeof(double) * (size_t)max_kv * Hk * D);
    double *q = kva_test_alloc(sizeof(double) * (size_t)max_qo * Hq * D);
    const kva_tensor qt = kva_tensor_nhd(pr->q_host, pr->dt, Hq, D);
    for (int32_t b = 0; b < pr->n; ++b) {
        if (pr->paged) {
            kva_ref_read_paged(&pr->pb.host_pages, &pr->pb.table, b, k, v);
        } else {
            kva_ref_read_tensor(kva_tensor_nhd(pr->k_host, pr->dt, Hk, D), pr->kv_indptr[b], pr->kv[b], Hk, D, k);
            kva_ref_read_tensor(kva_tensor_nhd(pr->v_host, pr->dt, Hk, D), pr->kv_indptr[b], pr->kv[b], Hk, D, v);
        }
        kva_ref_read_tensor(qt, pr->qo_indptr[b], pr->qo[b], Hq, D, q);
        kva_ref_attention(ref, pr->qo[b], pr->kv[b], q, k, v, o_ref + (size_t)pr->qo_indptr[b] * Hq * D,
                          lse_ref + (size_t)pr->qo_indptr[b] * Hq);
    }
    free(k);
    free(v);
    free(q);
}

/* Plans (split = 1: fixed chunks of 256 keys; 0 automatic; 2: dense kva_attention of request 0)
 * and runs one problem with variant e, and checks every element. extra: 1 a soft cap (the
 * modifier sees capped scores; the native ALiBi adds its bias after the cap with FFMAs), 2
 * sm_scale = 1e-5 (the scores nearly flat, the bias decides; the native ALiBi's slope / scale up
 * to ~3500 with these slopes, inside its f16 operands' range), 3 sm_scale = 3e-6 (with the usual
 * slopes of 32 heads, heads 0-15: slope / scale 2.1e4 .. 2.8e5, every row past the native
 * ALiBi's 16-bit range) */
static void prefill_case(kva_context *ctx, kva_rng *rng, const ex_variant *e, kva_dtype dt, int32_t D, int32_t Hq,
                         int32_t Hk, bool paged, int causal, int split, int extra, const char *name) {
    const int before = kva_test_failures;
    pf_problem pr;
    kva_workspace ws = {0};
    void *o_dev = NULL, *o_host = NULL;
    float *lse_dev = NULL, *lse_host = NULL;
    double *o_ref = NULL, *lse_ref = NULL;
    kva_plan plan;
    memset(&plan, 0, sizeof plan);
    if (!pf_make(ctx, rng, dt, D, Hq, Hk, paged, &pr)) goto done;
    if (split == 2) { /* dense: one sequence */
        pr.n = 1;
        pr.qo_indptr[1] = pr.qo[0];
        pr.kv_indptr[1] = pr.kv[0];
    }
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D), ref;
    p.causal = causal;
    if (extra == 1) p.logits_soft_cap = kva_rng_uniform(rng, 1.0f, 5.0f);
    if (extra == 2) p.sm_scale = 1e-5f;
    if (extra == 3) p.sm_scale = 3e-6f;
    ex_params(e, &p, &ref);
    const size_t es = kva_dtype_size(dt);
    const int32_t total_qo = pr.qo_indptr[pr.n];
    const size_t no = (size_t)total_qo * Hq * D;
    o_dev = cuda_test_poisoned(ctx, no * es);
    lse_dev = cuda_test_poisoned(ctx, sizeof(float) * (size_t)total_qo * Hq);
    if (!o_dev || !lse_dev) goto done;
    const kva_tensor q = kva_tensor_nhd(pr.q_dev, dt, Hq, D), o = kva_tensor_nhd(o_dev, dt, Hq, D);
    kva_status st;
    if (split == 2) {
        st = kva_attention(ctx, &p, pr.qo[0], pr.kv[0], q, kva_tensor_nhd(pr.k_dev, dt, Hk, D),
                           kva_tensor_nhd(pr.v_dev, dt, Hk, D), o, lse_dev);
    } else {
        kva_plan_limits lim = {0};
        lim.max_batch = pr.n;
        lim.max_total_pages = paged ? pr.pb.indptr[pr.n] : 0;
        lim.max_total_kv = pr.kv_indptr[pr.n];
        lim.max_total_qo = total_qo;
        lim.num_qo_heads = Hq;
        lim.num_kv_heads = Hk;
        lim.head_dim = D;
        lim.page_size = paged ? pr.pb.page_size : 0;
        lim.min_fixed_chunk = 256;
        st = kva_prefill_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes);
        if (st == KVA_OK) st = kva_malloc(ctx, ws.device_bytes, &ws.device);
        if (st == KVA_OK) st = kva_host_alloc(ctx, ws.host_bytes, &ws.host);
        kva_plan_options opt = {0, split ? 256 : 0, KVA_DECODE_PARTIAL_ROWMAX};
        if (st == KVA_OK)
            st = kva_prefill_plan(ctx, &lim, pr.n, pr.qo_indptr, paged ? NULL : pr.kv_indptr,
                                  paged ? &pr.pb.table : NULL, paged ? pr.pb.num_pages : 0, &opt, ws, &plan);
        if (st == KVA_OK)
            st = paged ? kva_prefill_run_paged(ctx, &plan, &p, q, &pr.pb.dev_pages, o, lse_dev)
                       : kva_prefill_run_ragged(ctx, &plan, &p, q, kva_tensor_nhd(pr.k_dev, dt, Hk, D),
                                                kva_tensor_nhd(pr.v_dev, dt, Hk, D), o, lse_dev);
    }
    CHECK_MSG(st == KVA_OK, "%s: %s (%s)", name, kva_status_str(st), kva_last_error());
    if (st != KVA_OK) goto done;
    o_ref = kva_test_alloc(sizeof(double) * no);
    lse_ref = kva_test_alloc(sizeof(double) * (size_t)total_qo * Hq);
    pf_reference(&pr, &ref, o_ref, lse_ref);
    o_host = cuda_test_download(ctx, o_dev, no * es);
    lse_host = cuda_test_download(ctx, lse_dev, sizeof(float) * (size_t)total_qo * Hq);
    kva_compare(name, o_host, dt, o_ref, no, kva_tol_for(dt), NULL);
    kva_compare_lse(name, lse_host, lse_ref, (size_t)total_qo * Hq, dt, NULL);
done:
    if (kva_test_failures != before) {
        printf("    failed: %s, %d requests (qo/kv:", name, pr.n);
        for (int32_t b = 0; b < pr.n; ++b) printf(" %d/%d", pr.qo[b], pr.kv[b]);
        printf("), split %d\n", plan.split_kv);
    }
    free(o_host);
    free(lse_host);
    free(o_ref);
    free(lse_ref);
    kva_free(ctx, o_dev);
    kva_free(ctx, lse_dev);
    if (ws.device) kva_free(ctx, ws.device);
    if (ws.host) kva_host_free(ctx, ws.host);
    pf_free(ctx, &pr);
}

/* mode 0 paged (head dims 64, 128, 256), 1 ragged + dense (48, 96, 192: padded to the next
 * built kernel, whose variant module serves them) */
static void prefill_sweep(int mode) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    use_test_cache();
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    static const kva_dtype dts[3] = {KVA_BF16, KVA_F16, KVA_F32};
    static const int32_t built_dims[3] = {64, 128, 256}, padded_dims[3] = {48, 96, 192};
    const int32_t *dims = mode == 1 ? padded_dims : built_dims;
    static const int32_t heads[3][2] = {{4, 4}, {8, 2}, {16, 1}};
    const kva_variant_options pf = {KVA_VARIANT_PREFILL, 0, 0};
    int cases = 0;
    for (int x = 0; x < NUM_EX; ++x) {
        ex_variant e;
        if (!ex_make(ctx, &rng, x, &pf, &e)) continue;
        for (int t = 0; t < 3; ++t)
            for (int d = 0; d < 3; ++d)
                for (int causal = 0; causal < 2; ++causal) {
                    if (quick() && d == 1) continue;
                    const int hi = (t + d + causal + x) % 3;
                    const int split = mode == 1 && causal == 0 && d == t ? 2 : kva_rng_int(&rng, 0, 1);
                    const int extra = (x + 2 * t + d + causal + mode) % 4 == 0 ? 1 : (x + t + 2 * d + causal) % 4 == 1 ? 2 : 0;
                    char name[160];
                    snprintf(name, sizeof name, "%s prefill %s %s d%d %d/%d %s%s%s",
                             split == 2 ? "dense" : mode == 0 ? "paged" : "ragged", ex_name[x], kva_dtype_name(dts[t]),
                             dims[d], heads[hi][0], heads[hi][1], causal ? "causal" : "full",
                             split == 1 ? " split" : "", extra == 1 ? " soft-cap" : extra == 2 ? " sm_scale 1e-5" : "");
                    /* ragged, every other case: the persistent grid capped at 3 blocks, so each
                     * block walks many items (the Hopper kernel's item boundary and, under ALiBi,
                     * its reversed tile order across it) */
                    const bool walk = mode == 1 && (x + d + causal) % 2 == 0;
                    kva_test_env env;
                    if (walk) kva_test_env_set(&env, "KVA_PREFILL_PERSISTENT", "3");
                    prefill_case(ctx, &rng, &e, dts[t], dims[d], heads[hi][0], heads[hi][1], mode == 0, causal, split,
                                 extra, name);
                    if (walk) kva_test_env_restore(&env);
                    ++cases;
                }
        ex_free(ctx, &e);
    }
    printf("    %d prefill cases\n", cases);
    kva_context_destroy(ctx);
}

KVA_TEST(cuda_variant_prefill_paged) { prefill_sweep(0); }
KVA_TEST(cuda_variant_prefill_ragged) { prefill_sweep(1); }

/* The paged sweep on another prefill path (KVA_PREFILL_PATH, read at context creation). */
static void prefill_sweep_on(const char *path) {
    kva_test_env env;
    kva_test_env_set(&env, "KVA_PREFILL_PATH", path);
    prefill_sweep(0);
    kva_test_env_restore(&env);
}

KVA_TEST(cuda_variant_prefill_mma) { prefill_sweep_on("mma"); }

/* Native ALiBi's prefill cases of the tests below: paged and ragged, f16 and bf16, d64 / d128 /
 * d256, causal on every other case, Hq / Hk heads. tiny: sm_scale 1e-5 or 3e-6 by turns (d128
 * skipped under KVA_TEST_QUICK); else the default scale, the ragged cases on a persistent grid of
 * 3 blocks (each block walks many items). */
static void alibi_prefill_cases(kva_context *ctx, kva_rng *rng, const ex_variant *e, const char *what, int32_t Hq,
                                int32_t Hk, bool tiny) {
    static const kva_dtype dts[2] = {KVA_F16, KVA_BF16};
    static const int32_t dims[3] = {64, 128, 256};
    int cases = 0;
    for (int t = 0; t < 2; ++t)
        for (int d = 0; d < 3; ++d)
            for (int mode = 0; mode < 2; ++mode) {
                if (tiny && quick() && d == 1) continue;
                const int causal = (t + d + mode) % 2, extra = !tiny ? 0 : (t + mode) % 2 ? 3 : 2;
                char name[160];
                snprintf(name, sizeof name, "%s prefill alibi %s %s d%d %d/%d %s%s", mode == 0 ? "paged" : "ragged",
                         what, kva_dtype_name(dts[t]), dims[d], (int)Hq, (int)Hk, causal ? "causal" : "full",
                         extra == 2 ? " sm_scale 1e-5" : extra == 3 ? " sm_scale 3e-6" : "");
                const bool walk = !tiny && mode == 1;
                kva_test_env env;
                if (walk) kva_test_env_set(&env, "KVA_PREFILL_PERSISTENT", "3");
                prefill_case(ctx, rng, e, dts[t], dims[d], Hq, Hk, mode == 0, causal, kva_rng_int(rng, 0, 1), extra,
                             name);
                if (walk) kva_test_env_restore(&env);
                ++cases;
            }
    printf("    %d prefill cases\n", cases);
}

/* Native ALiBi with the usual (unscaled) slopes of 16 heads and a tiny sm_scale: with 1e-5,
 * slope / sm_scale runs from 8.4e4 (past f16's 65504) down to 6250 across one row group's 16
 * heads, so the Hopper kernel's rows on both sides of its 16-bit k-step's range (heads 0-9 add
 * their bias with FFMAs, 10-15 on the tensor cores) share every warp; with 3e-6 every row is
 * past it. The path the chooser picks (the Hopper kernel on sm_90a; the other paths add every
 * bias with FFMAs), paged and ragged, f16 and bf16. */
KVA_TEST(cuda_variant_alibi_tiny_scale) {
    kva_rng rng;
    kva_context *ctx = variant_test_begin(&rng);
    if (!ctx) return;
    const kva_variant_options pf = {KVA_VARIANT_PREFILL, (1u << KVA_F16) | (1u << KVA_BF16), 0};
    ex_variant e;
    if (!ex_make(ctx, &rng, EX_ALIBI, &pf, &e)) goto out;
    kva_alibi_slopes(MAX_HEADS, (float *)e.host_user);
    kva_free(ctx, e.dev_user);
    e.dev_user = cuda_test_upload(ctx, e.host_user, sizeof(float) * MAX_HEADS);
    if (!e.dev_user) goto out;
    alibi_prefill_cases(ctx, &rng, &e, "unscaled", 16, 1, true);
out:
    ex_free(ctx, &e);
    kva_context_destroy(ctx);
}
/* Native ALiBi with its mbarriers below the aligned base of its shared memory: the H200 starts a
 * block's dynamic shared memory 1024-aligned, so that branch of the Hopper kernel's layout (see
 * kva__hopper_geom::PLAIN_SMEM) never runs in the other tests. A copy of the built-in source that
 * defines KVA__HP_TEST_SMEM_SHIFT (the kernel takes its shared memory as starting 16 bytes later:
 * a slack of 1008 bytes, the largest) runs under the kva_alibi name, so natively: paged and
 * ragged (these on a persistent grid of 3 blocks, so each block walks many items and hands their
 * records over), f16 and bf16, d64 / d128 / d256, against the float64 reference (the GPU script's
 * memcheck step runs it too, quick: every byte it touches must lie in the launch). */
KVA_TEST(cuda_variant_alibi_barriers_below_base) {
    kva_rng rng;
    kva_context *ctx = variant_test_begin(&rng);
    if (!ctx) return;
    const kva_variant_options pf = {KVA_VARIANT_PREFILL, (1u << KVA_F16) | (1u << KVA_BF16), 0};
    ex_variant e;
    memset(&e, 0, sizeof e);
    char *src = NULL;
    {
        /* the slopes as ex_make's ALiBi has them (without compiling its unshifted modules) */
        float *s = kva_test_alloc(sizeof(float) * MAX_HEADS);
        kva_alibi_slopes(MAX_HEADS, s);
        for (int h = 0; h < MAX_HEADS; ++h) s[h] *= 0.05f;
        e.host_user = s;
        e.cpu = alibi_cpu;
        e.dev_user = cuda_test_upload(ctx, s, sizeof(float) * MAX_HEADS);
        if (!e.dev_user) goto out;
    }
    const char *shift = "#define KVA__HP_TEST_SMEM_SHIFT 16\n", *alibi = kva_variant_alibi_source();
    src = kva_test_alloc(strlen(shift) + strlen(alibi) + 1);
    strcpy(src, shift);
    strcat(src, alibi);
    if (kva_variant_create(ctx, src, "kva_alibi", &pf, &e.v) != KVA_OK) {
        kva_test_fail(__FILE__, __LINE__, "creating the shifted ALiBi: %s", kva_last_error());
        goto out;
    }
    alibi_prefill_cases(ctx, &rng, &e, "(barriers below the base)", 8, 2, false);
out:
    free(src);
    ex_free(ctx, &e);
    kva_context_destroy(ctx);
}
KVA_TEST(cuda_variant_prefill_wgmma) { prefill_sweep_on("wgmma"); }

/* ---- CUDA graphs --------------------------------------------------------------------------- */

#define CUDA_CHECK(call)                                                                       \
    do {                                                                                       \
        cudaError_t e__ = (call);                                                              \
        if (e__ != cudaSuccess) {                                                              \
            kva_test_fail(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(e__));       \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)

/* Captures a decode run of the whole batch, then re-plans prefixes of the batch (its first
 * requests: a valid CSR table over the same pool) and replays: each must match the reference. */
KVA_TEST(cuda_variant_graph_replay) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    use_test_cache();
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const int32_t B = 9, Hq = 32, Hk = 8, D = 128, ps = 16;
    const kva_dtype dt = KVA_BF16;
    cudaStream_t stream = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cuda_paged_batch pb;
    memset(&pb, 0, sizeof pb);
    cuda_test_workspace w = {0};
    ex_variant e;
    memset(&e, 0, sizeof e);
    const size_t es = 2, nq = (size_t)B * Hq * D;
    void *q_host = kva_test_alloc(nq * es), *q_dev = NULL, *o_dev = NULL;
    float *lse_dev = NULL;
    int32_t lens[9];
    for (int32_t b = 0; b < B; ++b) lens[b] = b == 0 ? 3000 : cuda_test_pick_len(&rng, 2000);
    const kva_variant_options opt_v = {KVA_VARIANT_DECODE, 1u << KVA_BF16, D};
    if (!ex_make(ctx, &rng, EX_T5, &opt_v, &e)) goto out;
    if (!cuda_paged_batch_make(ctx, &rng, dt, B, lens, Hk, D, ps, CUDA_TEST_NHD, &pb)) goto out;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_OK(kva_context_set_stream(ctx, stream));
    kva_plan_limits lim = {B, pb.indptr[B], 0, 0, Hq, Hk, D, ps, 0};
    if (!cuda_test_workspace_make(ctx, &lim, &w)) goto out;
    kva_fill_random(&rng, q_host, dt, nq, -1.f, 1.f);
    q_dev = cuda_test_upload(ctx, q_host, nq * es);
    o_dev = cuda_test_poisoned(ctx, nq * es);
    lse_dev = cuda_test_poisoned(ctx, sizeof(float) * B * Hq);
    if (!q_dev || !o_dev || !lse_dev) goto out;
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D), ref;
    ex_params(&e, &p, &ref);
    const kva_plan_options opt = {KVA_PLAN_GRAPH, 0, KVA_DECODE_PARTIAL_ROWMAX};
    const int32_t sizes[3] = {B, 4, 1};
    for (int i = 0; i < 3; ++i) {
        cuda_paged_batch sub = pb;
        sub.batch = sizes[i];
        sub.table.batch_size = sizes[i];
        kva_plan plan;
        kva_status st = kva_decode_plan(ctx, &lim, &sub.table, pb.num_pages, &opt, w.ws, &plan);
        CHECK_MSG(st == KVA_OK, "plan %d: %s (%s)", i, kva_status_str(st), kva_last_error());
        if (st != KVA_OK) goto out;
        if (i == 0) {
            CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            st = kva_decode_run(ctx, &plan, &p, kva_tensor_nhd(q_dev, dt, Hq, D), &pb.dev_pages,
                                kva_tensor_nhd(o_dev, dt, Hq, D), lse_dev);
            CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
            CHECK_MSG(st == KVA_OK, "captured run: %s (%s)", kva_status_str(st), kva_last_error());
            CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        }
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CHECK_OK(kva_synchronize(ctx));
        const size_t n = (size_t)sizes[i] * Hq * D;
        double *o_ref = kva_test_alloc(sizeof(double) * n), *lse_ref = kva_test_alloc(sizeof(double) * sizes[i] * Hq);
        cuda_ref_decode(&sub, &ref, q_host, o_ref, lse_ref);
        void *o_host = cuda_test_download(ctx, o_dev, n * es);
        float *lse_host = cuda_test_download(ctx, lse_dev, sizeof(float) * sizes[i] * Hq);
        kva_compare("graph replay o", o_host, dt, o_ref, n, kva_tol_for(dt), NULL);
        kva_compare_lse("graph replay lse", lse_host, lse_ref, (size_t)sizes[i] * Hq, dt, NULL);
        free(o_ref);
        free(lse_ref);
        free(o_host);
        free(lse_host);
    }
out:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    free(q_host);
    kva_free(ctx, q_dev);
    kva_free(ctx, o_dev);
    kva_free(ctx, lse_dev);
    cuda_test_workspace_free(ctx, &w);
    cuda_paged_batch_free(ctx, &pb);
    ex_free(ctx, &e);
    if (stream) {
        kva_context_set_stream(ctx, NULL);
        cudaStreamDestroy(stream);
    }
    kva_context_destroy(ctx);
}

/* ---- errors ---------------------------------------------------------------------------------- */

KVA_TEST(cuda_variant_errors) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    use_test_cache();
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* a compile error: the status, NVRTC's log naming the caller's line, nothing created */
    kva_variant *v = (kva_variant *)0x1;
    const char *bad = "float m(float s, int32_t q, int32_t k, int32_t h, const void *u) {\n"
                      "    return s * not_declared;\n}\n";
    CHECK_STATUS(kva_variant_create(ctx, bad, "m", NULL, &v), KVA_ERR_INVALID_ARG);
    CHECK(v == NULL);
    CHECK_MSG(strstr(kva_last_error(), "not_declared") && strstr(kva_last_error(), "variant.cu(2)"), "log: %s",
              kva_last_error());

    /* a variant compiled for decode bf16 d64 only */
    const int32_t Hq = 4, Hk = 4, D = 128, L = 70;
    const kva_variant_options narrow = {KVA_VARIANT_DECODE, 1u << KVA_BF16, 64};
    ex_variant e;
    if (!ex_make(ctx, &rng, EX_ALIBI, &narrow, &e)) {
        kva_context_destroy(ctx);
        return;
    }
    const size_t n = (size_t)L * Hq * D * 2;
    void *q = cuda_test_poisoned(ctx, n), *o = cuda_test_poisoned(ctx, n);
    const kva_tensor tq = kva_tensor_nhd(q, KVA_BF16, Hq, D), to = kva_tensor_nhd(o, KVA_BF16, Hq, D);
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D);
    p.variant = e.v;
    p.score_mod_user = e.dev_user;
    /* prefill with a decode-only variant; d128 with a d64 variant */
    CHECK_STATUS(kva_attention(ctx, &p, L, L, tq, tq, tq, to, NULL), KVA_ERR_UNSUPPORTED);
    CHECK(strstr(kva_last_error(), "params.variant was not compiled for bf16 prefill") != NULL);
    /* score_mod on CUDA names the way in; both set is refused */
    kva_attn_params cpu_way = kva_attn_params_default(Hq, Hk, D);
    cpu_way.score_mod = alibi_cpu;
    CHECK_STATUS(kva_attention(ctx, &cpu_way, L, L, tq, tq, tq, to, NULL), KVA_ERR_UNSUPPORTED);
    CHECK(strstr(kva_last_error(), "params.variant") != NULL);
    kva_attn_params both = p;
    both.score_mod = alibi_cpu;
    CHECK_STATUS(kva_attention(ctx, &both, L, L, tq, tq, tq, to, NULL), KVA_ERR_INVALID_ARG);
    /* decode at a head dim the variant lacks */
    int32_t lens[1] = {L};
    cuda_paged_batch pb;
    cuda_test_workspace w = {0};
    if (cuda_paged_batch_make(ctx, &rng, KVA_BF16, 1, lens, Hk, D, 16, CUDA_TEST_NHD, &pb)) {
        kva_plan_limits lim = {1, pb.indptr[1], 0, 0, Hq, Hk, D, 16, 0};
        kva_plan plan;
        if (cuda_test_workspace_make(ctx, &lim, &w) &&
            kva_decode_plan(ctx, &lim, &pb.table, pb.num_pages, NULL, w.ws, &plan) == KVA_OK) {
            CHECK_STATUS(kva_decode_run(ctx, &plan, &p, tq, &pb.dev_pages, to, NULL), KVA_ERR_UNSUPPORTED);
            CHECK(strstr(kva_last_error(), "not compiled for bf16 decode at head_dim 128") != NULL);
        }
        cuda_test_workspace_free(ctx, &w);
        cuda_paged_batch_free(ctx, &pb);
    }
    kva_free(ctx, q);
    kva_free(ctx, o);
    ex_free(ctx, &e);
    kva_context_destroy(ctx);
}

/* ---- the caches, with times -------------------------------------------------------------------- */

KVA_TEST(cuda_variant_cache) {
    if (!kva_cuda_available()) {
        kva_test_skip("no CUDA device");
        return;
    }
    /* a fresh disk cache of its own, so the first create compiles */
    char dir[64], mod_dir[128];
    snprintf(dir, sizeof dir, "/tmp/kvattn-cuda-variant-cache-XXXXXX");
    if (!mkdtemp(dir)) {
        kva_test_fail(__FILE__, __LINE__, "mkdtemp");
        return;
    }
    const char *old = getenv("XDG_CACHE_HOME");
    char saved[128] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("XDG_CACHE_HOME", dir, 1);
    snprintf(mod_dir, sizeof mod_dir, "%s/kvattn", dir);

    /* the headline kernels: decode and prefill, bf16, d128 */
    const kva_variant_options opt = {0, 1u << KVA_BF16, 128};
    kva_context *a = cuda_test_context(), *b = NULL;
    kva_variant *v1 = NULL, *v2 = NULL, *v3 = NULL, *v4 = NULL;
    kva_variant_stats s1, s2, s3, s4;
    if (!a) goto out;
    if (kva_variant_create_alibi(a, &opt, &v1) != KVA_OK) {
        kva_test_fail(__FILE__, __LINE__, "kva_variant_create_alibi: %s", kva_last_error());
        goto out;
    }
    CHECK_OK(kva_variant_get_stats(v1, &s1));
    CHECK(s1.modules == 2 && s1.compiled == 2 && s1.disk_hits == 0 && s1.context_hits == 0);
    /* the same context: its module cache */
    CHECK_OK(kva_variant_create_alibi(a, &opt, &v2));
    CHECK_OK(kva_variant_get_stats(v2, &s2));
    CHECK(s2.context_hits == 2 && s2.compiled == 0);
    /* a new context: the disk cache */
    CHECK_OK(kva_context_create(KVA_DEVICE_CUDA, 0, &b));
    CHECK_OK(kva_variant_create_alibi(b, &opt, &v3));
    CHECK_OK(kva_variant_get_stats(v3, &s3));
    CHECK(s3.disk_hits == 2 && s3.compiled == 0);
    printf("    first use: %.1f ms (NVRTC %.1f ms, 2 modules); same context: %.2f ms; cached load in a new "
           "context: %.1f ms (target < 50 ms)\n",
           s1.total_ms, s1.compile_ms, s2.total_ms, s3.total_ms);
    CHECK_MSG(s3.total_ms < 50.0, "cached load took %.1f ms", s3.total_ms);
    /* a corrupt entry is rebuilt: flip a byte in every file of the cache */
    {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "for f in %s/*.kvamod; do printf '\\377' | dd of=\"$f\" bs=1 seek=200 conv=notrunc 2>/dev/null; done",
                 mod_dir);
        CHECK(system(cmd) == 0);
    }
    kva_variant_destroy(v3);
    v3 = NULL;
    kva_context_destroy(b); /* its module cache goes with it */
    b = NULL;
    CHECK_OK(kva_context_create(KVA_DEVICE_CUDA, 0, &b));
    CHECK_OK(kva_variant_create_alibi(b, &opt, &v4));
    CHECK_OK(kva_variant_get_stats(v4, &s4));
    CHECK_MSG(s4.compiled == 2 && s4.disk_hits == 0, "corrupt entries: compiled %d, disk hits %d", s4.compiled,
              s4.disk_hits);
    /* the context outlives kva_context_destroy while a variant holds it */
    kva_context_destroy(a);
    a = NULL;
out:
    kva_variant_destroy(v1); /* frees context a */
    kva_variant_destroy(v2);
    kva_variant_destroy(v3);
    kva_variant_destroy(v4);
    kva_context_destroy(a);
    kva_context_destroy(b);
    if (old) setenv("XDG_CACHE_HOME", saved, 1);
    else unsetenv("XDG_CACHE_HOME");
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "    (could not remove %s)\n", dir);
}

/* ---- bench ------------------------------------------------------------------------------------- */

/* A timed call (events on the context's stream: NULL). */
typedef kva_status (*bench_fn)(void *arg);
/* Mean microseconds per call: `reps` calls back to back between two events (the GPU never waits
 * for the host, so a launch path's host cost does not count, as in a serving loop), after 3
 * warm-up calls. */
static double time_us(bench_fn fn, void *arg, int reps) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; ++i) fn(arg);
    cudaEventRecord(e0, NULL);
    for (int i = 0; i < reps; ++i) fn(arg);
    cudaEventRecord(e1, NULL);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms * 1e3 / reps;
}

/* The GPU idles BENCH_SETTLE_MS before every timed series, so that no mode is timed at the
 * clocks and power state the previous one left (bench_torch.py's --settle, shorter here: the
 * series are short). */
#define BENCH_SETTLE_MS 100
static void settle_gpu(void) {
    cudaDeviceSynchronize();
    const struct timespec pause = {0, BENCH_SETTLE_MS * 1000000L};
    nanosleep(&pause, NULL);
}

/* The five modes (plain, ALiBi, built-in cap, cap snippet, identity snippet) timed in turn over BENCH_ROUNDS rounds,
 * each mode's median round in us[mode]: the GPU's clock and power state drift over a run, and
 * interleaving puts every mode under the same drift. */
#define BENCH_ROUNDS 7
static double median_of(double *v, int n) {
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && v[j] < v[j - 1]; --j) {
            const double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return v[n / 2];
}

typedef struct bench_decode {
    kva_context *ctx;
    kva_plan plan;
    kva_attn_params p;
    kva_tensor q, o;
    kva_kv_pages pages;
} bench_decode;
static kva_status run_decode(void *arg) {
    bench_decode *b = (bench_decode *)arg;
    return kva_decode_run(b->ctx, &b->plan, &b->p, b->q, &b->pages, b->o, NULL);
}
typedef struct bench_prefill {
    kva_context *ctx;
    kva_plan plan;
    kva_attn_params p;
    kva_tensor q, k, v, o;
} bench_prefill;
static kva_status run_prefill(void *arg) {
    bench_prefill *b = (bench_prefill *)arg;
    return kva_prefill_run_ragged(b->ctx, &b->plan, &b->p, b->q, b->k, b->v, b->o, NULL);
}

/* The attention settings compared: plain, the ALiBi variant, the built-in soft cap, the soft cap
 * as a snippet, and a modifier that returns the score unchanged (the hook's own cost). */
#define BENCH_MODES 5
typedef struct bench_variants {
    kva_variant *alibi, *snippet, *identity;
    void *slopes, *cap; /* their caller data, device memory */
} bench_variants;

static void set_mode(kva_attn_params *p, int mode, const bench_variants *bv) {
    p->variant = NULL;
    p->score_mod_user = NULL;
    p->logits_soft_cap = 0.0f;
    if (mode == 1) { p->variant = bv->alibi; p->score_mod_user = bv->slopes; }
    if (mode == 2) p->logits_soft_cap = 50.0f;
    if (mode == 3) { p->variant = bv->snippet; p->score_mod_user = bv->cap; }
    if (mode == 4) p->variant = bv->identity;
}

/* us[mode]: each mode's median over BENCH_ROUNDS rounds of `reps` calls, the modes taking turns
 * within a round (p: the params fn runs with). False if a warm-up call failed. */
static bool time_modes(bench_fn fn, void *arg, kva_attn_params *p, const bench_variants *bv, int reps,
                       double us[BENCH_MODES]) {
    double rounds[BENCH_MODES][BENCH_ROUNDS];
    for (int m = 0; m < BENCH_MODES; ++m) {
        set_mode(p, m, bv);
        CHECK_OK(fn(arg));
        if (kva_test_failures) return false;
    }
    for (int r = 0; r < BENCH_ROUNDS; ++r)
        for (int i = 0; i < BENCH_MODES; ++i) {
            /* every series after the same idle pause (with the modes back to back, ALiBi always
             * ran at the clocks plain had left), each round opening with another mode, every
             * other round in the reverse order (so no mode always follows the same one) */
            const int k = (r + i) % BENCH_MODES, m = r & 1 ? BENCH_MODES - 1 - k : k;
            set_mode(p, m, bv);
            settle_gpu();
            rounds[m][r] = time_us(fn, arg, reps);
        }
    for (int m = 0; m < BENCH_MODES; ++m) us[m] = median_of(rounds[m], BENCH_ROUNDS);
    return true;
}

/* Bench inputs: random values, uniform in [-2, 2] (an 8 MB random block repeated; like the
 * README tables' normal values, real operands, so the tensor cores draw real power) or one
 * constant (0x3c bytes: every score equal; the cheapest case for the plain kernel, kept for
 * comparison with earlier runs). */
static void fill_bench_input(kva_rng *rng, void *dev, size_t bytes, kva_dtype dt, bool random) {
    if (!random) {
        CHECK_MSG(cudaMemset(dev, 0x3c, bytes) == cudaSuccess, "bench inputs: cudaMemset failed");
        return;
    }
    const size_t es = kva_dtype_size(dt), block = (size_t)8 << 20;
    unsigned char *h = kva_test_alloc(block);
    kva_fill_random(rng, h, dt, block / es, -2.f, 2.f);
    for (size_t off = 0; off < bytes; off += block)
        CHECK_MSG(cudaMemcpy((unsigned char *)dev + off, h, bytes - off < block ? bytes - off : block,
                             cudaMemcpyHostToDevice) == cudaSuccess,
                  "bench inputs: cudaMemcpy failed");
    free(h);
}

KVA_TEST(cuda_variant_bench) {
    if (quick()) {
        kva_test_skip("KVA_TEST_QUICK");
        return;
    }
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    use_test_cache();
    const int32_t Hq = 32, Hk = 8, D = 128, ps = 16;
    const kva_dtype dt = KVA_BF16;
    const kva_variant_options opt = {0, 1u << KVA_BF16, D};
    kva_variant *alibi = NULL, *snippet = NULL, *identity = NULL;
    void *slopes = NULL, *cap = NULL, *pool = NULL, *q = NULL, *o = NULL, *k = NULL, *v = NULL;
    kva_workspace ws = {0};
    int32_t *indptr = NULL, *indices = NULL, *last = NULL;
    REQUIRE_OK(kva_variant_create_alibi(ctx, &opt, &alibi));
    REQUIRE_OK(kva_variant_create(ctx, KVA_EX_SOURCE_SOFTCAP, "softcap", &opt, &snippet));
    REQUIRE_OK(kva_variant_create(ctx,
                                  "float identity(float s, int32_t q, int32_t k, int32_t h, const void *u) {\n"
                                  "    (void)q; (void)k; (void)h; (void)u;\n    return s;\n}\n",
                                  "identity", &opt, &identity));
    float host_slopes[32], host_cap = 50.0f;
    kva_alibi_slopes(Hq, host_slopes);
    slopes = cuda_test_upload(ctx, host_slopes, sizeof host_slopes);
    cap = cuda_test_upload(ctx, &host_cap, sizeof host_cap);
    const bench_variants bv = {alibi, snippet, identity, slopes, cap};

    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* decode: B x 4096 keys, pages in order */
    const int32_t L = 4096, maxB = 64, pages_per = L / ps, npages = maxB * pages_per;
    const size_t page_elems = (size_t)ps * Hk * D;
    const size_t pool_bytes = (size_t)npages * 2 * page_elems * 2;
    CHECK_OK(kva_malloc(ctx, pool_bytes, &pool));
    CHECK_OK(kva_malloc(ctx, (size_t)maxB * Hq * D * 2, &q));
    CHECK_OK(kva_malloc(ctx, (size_t)maxB * Hq * D * 2, &o));
    if (!pool || !q || !o || !slopes || !cap) goto out;
    indptr = kva_test_alloc(sizeof(int32_t) * (maxB + 1));
    indices = kva_test_alloc(sizeof(int32_t) * npages);
    last = kva_test_alloc(sizeof(int32_t) * maxB);
    for (int32_t i = 0; i < npages; ++i) indices[i] = i;
    for (int32_t b = 0; b <= maxB; ++b) indptr[b] = b * pages_per;
    for (int32_t b = 0; b < maxB; ++b) last[b] = ps;
    {
        kva_plan_limits lim = {maxB, npages, 0, 0, Hq, Hk, D, ps, 0};
        CHECK_OK(kva_decode_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes));
        CHECK_OK(kva_malloc(ctx, ws.device_bytes, &ws.device));
        CHECK_OK(kva_host_alloc(ctx, ws.host_bytes, &ws.host));
        const int32_t batches[2] = {8, 64};
        for (int inp = 0; inp < 2; ++inp) {
            for (int bi = 0; bi < 2; ++bi) {
                if (bi == 0) {
                    fill_bench_input(&rng, pool, pool_bytes, dt, inp == 0);
                    fill_bench_input(&rng, q, (size_t)maxB * Hq * D * 2, dt, inp == 0);
                }
                bench_decode bd;
                bd.ctx = ctx;
                kva_page_table t = {batches[bi], indptr, indices, last};
                CHECK_OK(kva_decode_plan(ctx, &lim, &t, npages, NULL, ws, &bd.plan));
                bd.p = kva_attn_params_default(Hq, Hk, D);
                bd.q = kva_tensor_nhd(q, dt, Hq, D);
                bd.o = kva_tensor_nhd(o, dt, Hq, D);
                bd.pages = kva_kv_pages_interleaved(pool, dt, npages, ps, Hk, D, KVA_LAYOUT_NHD);
                double us[BENCH_MODES];
                if (!time_modes(run_decode, &bd, &bd.p, &bv, 50, us)) continue;
                printf("    decode 32/8 d128 bf16 %dx%d, %s inputs: plain %.1f us, alibi %.1f us (%+.1f%%), softcap built-in %.1f us, "
                       "snippet %.1f us (%+.1f%%), identity snippet %.1f us (%+.1f%%)\n",
                       batches[bi], L, inp == 0 ? "random" : "constant", us[0], us[1], 100.0 * (us[1] / us[0] - 1), us[2], us[3], 100.0 * (us[3] / us[2] - 1),
                       us[4], 100.0 * (us[4] / us[0] - 1));
            }
        }
        kva_free(ctx, ws.device);
        kva_host_free(ctx, ws.host);
        memset(&ws, 0, sizeof ws);
    }
    kva_free(ctx, pool);
    pool = NULL;
    kva_free(ctx, q);
    kva_free(ctx, o);
    q = o = NULL;

    /* prefill, causal, ragged: the headline 1 x 16384 and 32 x 512 (short items, where the
     * per-item code weighs most: the library's plain d128 call keeps the consumers' turns
     * there, native ALiBi's build does not) -- 16384 tokens either way */
    {
        const int32_t S = 16384;
        const size_t qb = (size_t)S * Hq * D * 2, kb = (size_t)S * Hk * D * 2;
        CHECK_OK(kva_malloc(ctx, qb, &q));
        CHECK_OK(kva_malloc(ctx, qb, &o));
        CHECK_OK(kva_malloc(ctx, kb, &k));
        CHECK_OK(kva_malloc(ctx, kb, &v));
        if (!q || !o || !k || !v) goto out;
        const int32_t shapes[2][2] = {{1, 16384}, {32, 512}}; /* requests x tokens */
        kva_plan_limits lim = {32, 0, S, S, Hq, Hk, D, 0, 0};
        CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes));
        CHECK_OK(kva_malloc(ctx, ws.device_bytes, &ws.device));
        CHECK_OK(kva_host_alloc(ctx, ws.host_bytes, &ws.host));
        for (int sh = 0; sh < 2; ++sh) {
            const int32_t B = shapes[sh][0], L = shapes[sh][1];
            int32_t indptr_qo[33];
            for (int32_t b = 0; b <= B; ++b) indptr_qo[b] = b * L;
            bench_prefill bp;
            bp.ctx = ctx;
            CHECK_OK(kva_prefill_plan(ctx, &lim, B, indptr_qo, indptr_qo, NULL, 0, NULL, ws, &bp.plan));
            bp.p = kva_attn_params_default(Hq, Hk, D);
            bp.p.causal = 1;
            bp.q = kva_tensor_nhd(q, dt, Hq, D);
            bp.o = kva_tensor_nhd(o, dt, Hq, D);
            bp.k = kva_tensor_nhd(k, dt, Hk, D);
            bp.v = kva_tensor_nhd(v, dt, Hk, D);
            for (int inp = 0; inp < 2; ++inp) {
                fill_bench_input(&rng, q, qb, dt, inp == 0);
                fill_bench_input(&rng, k, kb, dt, inp == 0);
                fill_bench_input(&rng, v, kb, dt, inp == 0);
                double us[BENCH_MODES];
                if (!time_modes(run_prefill, &bp, &bp.p, &bv, L >= 4096 ? 5 : 40, us)) goto out;
                const double flop = 4.0 * B * L * (double)L / 2 * Hq * D;
                printf("    prefill 32/8 d128 bf16 %dx%d causal, %s inputs: plain %.1f us (%.0f TFLOP/s), alibi %.1f us (%+.1f%%), "
                       "softcap built-in %.1f us, snippet %.1f us (%+.1f%%), identity snippet %.1f us (%+.1f%%)\n",
                       B, L, inp == 0 ? "random" : "constant", us[0], flop / us[0] * 1e-6, us[1], 100.0 * (us[1] / us[0] - 1), us[2],
                       us[3], 100.0 * (us[3] / us[2] - 1), us[4], 100.0 * (us[4] / us[0] - 1));
            }
        }
    }
out:
    free(indptr);
    free(indices);
    free(last);
    if (ws.device) kva_free(ctx, ws.device);
    if (ws.host) kva_host_free(ctx, ws.host);
    kva_free(ctx, pool);
    kva_free(ctx, q);
    kva_free(ctx, o);
    kva_free(ctx, k);
    kva_free(ctx, v);
    kva_free(ctx, slopes);
    kva_free(ctx, cap);
    kva_variant_destroy(alibi);
    kva_variant_destroy(snippet);
    kva_variant_destroy(identity);
    kva_context_destroy(ctx);
}

#else
KVA_TEST(cuda_variant_decode) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_decode_paired_heads) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_decode_far_score_is_nan) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_prefill_paged) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_prefill_ragged) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_prefill_mma) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_prefill_wgmma) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_graph_replay) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_errors) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_cache) { kva_test_skip("no CUDA device"); }
KVA_TEST(cuda_variant_bench) { kva_test_skip("no CUDA device"); }
#endif
