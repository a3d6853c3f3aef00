/*
 * test_error_messages.c -- kva_last_error() names the public call and the argument the caller
 * wrote ("kva_decode_plan: page_table.indices[3] = 9000 ..."), never an internal helper
 * ("kva__check_params: p is NULL") or its parameter names.
 */
#include "harness.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The message of the last failure starts with "call:" and, if given, contains `arg`. */
static void expect_message(int line, kva_status st, const char *call, const char *arg) {
    const char *m = kva_last_error();
    size_t n = strlen(call);
    if (st == KVA_OK) {
        kva_test_fail(__FILE__, line, "%s: the bad call succeeded", call);
        return;
    }
    if (strncmp(m, call, n) != 0 || m[n] != ':')
        kva_test_fail(__FILE__, line, "message does not start with \"%s:\": %s", call, m);
    if (strstr(m, "kva__") || strstr(m, " p is") || strstr(m, "plan:") == m)
        kva_test_fail(__FILE__, line, "message names an internal function: %s", m);
    if (arg && !strstr(m, arg))
        kva_test_fail(__FILE__, line, "message does not name %s: %s", arg, m);
}
#define EXPECT_MSG(expr, call, arg) expect_message(__LINE__, (expr), call, arg)

KVA_TEST(error_messages_name_the_public_call_and_argument) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    enum { HQ = 2, HK = 1, D = 16, PS = 16, POOL = 256 };
    kva_plan_limits lim = {.max_batch = 4, .max_total_pages = 16, .num_qo_heads = HQ,
                           .num_kv_heads = HK, .head_dim = D, .page_size = PS};
    kva_workspace ws = {0};
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes));
    REQUIRE_OK(kva_malloc(ctx, ws.device_bytes, &ws.device));
    REQUIRE_OK(kva_host_alloc(ctx, ws.host_bytes, &ws.host));
    size_t pool_elems = (size_t)POOL * PS * HK * D;
    float *k = kva_test_alloc(pool_elems * sizeof(float));
    float *v = kva_test_alloc(pool_elems * sizeof(float));
    memset(k, 0, pool_elems * sizeof(float));
    memset(v, 0, pool_elems * sizeof(float));
    float *q = kva_test_alloc(4 * HQ * D * sizeof(float));
    float *o = kva_test_alloc(4 * HQ * D * sizeof(float));
    memset(q, 0, 4 * HQ * D * sizeof(float));
    kva_kv_pages pages = kva_kv_pages_separate(k, v, KVA_F32, POOL, PS, HK, D, KVA_LAYOUT_NHD);
    kva_tensor qt = kva_tensor_nhd(q, KVA_F32, HQ, D), ot = kva_tensor_nhd(o, KVA_F32, HQ, D);
    kva_attn_params p = kva_attn_params_default(HQ, HK, D);

    int32_t indptr[3] = {0, 2, 4}, idx[4] = {0, 1, 2, 9000}, last[2] = {3, 4};
    kva_page_table t = {2, indptr, idx, last};
    kva_plan plan;
    EXPECT_MSG(kva_decode_plan(ctx, &lim, &t, POOL, NULL, ws, &plan), "kva_decode_plan",
               "page_table.indices[3] = 9000 is outside the pool (0..255)");
    idx[3] = 3;
    last[1] = 17;
    EXPECT_MSG(kva_decode_plan(ctx, &lim, &t, POOL, NULL, ws, &plan), "kva_decode_plan",
               "page_table.last_page_len[1]");
    last[1] = 4;
    EXPECT_MSG(kva_decode_plan(ctx, NULL, &t, POOL, NULL, ws, &plan), "kva_decode_plan", "limits");
    EXPECT_MSG(kva_decode_plan(ctx, &lim, NULL, POOL, NULL, ws, &plan), "kva_decode_plan",
               "page_table");
    kva_plan_options opt = {0, 0, (kva_decode_algo)9};
    EXPECT_MSG(kva_decode_plan(ctx, &lim, &t, POOL, &opt, ws, &plan), "kva_decode_plan",
               "options.algo");
    kva_plan_limits bad_lim = lim;
    bad_lim.num_kv_heads = 3;
    EXPECT_MSG(kva_decode_plan(ctx, &bad_lim, &t, POOL, NULL, ws, &plan), "kva_decode_plan",
               "limits.num_kv_heads");
    size_t a, b;
    EXPECT_MSG(kva_decode_workspace_size(ctx, &bad_lim, &a, &b), "kva_decode_workspace_size",
               "limits.num_kv_heads");
    EXPECT_MSG(kva_decode_workspace_size(ctx, NULL, &a, &b), "kva_decode_workspace_size", "limits");
    EXPECT_MSG(kva_prefill_workspace_size(ctx, &bad_lim, &a, &b), "kva_prefill_workspace_size",
               "limits.num_kv_heads");
    int32_t qo[3] = {0, 1, 2};
    EXPECT_MSG(kva_prefill_plan(ctx, &lim, 2, qo, NULL, NULL, 0, NULL, ws, &plan), "kva_prefill_plan",
               "kv_indptr");

    REQUIRE_OK(kva_decode_plan(ctx, &lim, &t, POOL, NULL, ws, &plan));
    EXPECT_MSG(kva_decode_run(ctx, &plan, NULL, qt, &pages, ot, NULL), "kva_decode_run", "params");
    EXPECT_MSG(kva_decode_run(ctx, NULL, &p, qt, &pages, ot, NULL), "kva_decode_run", "plan");
    EXPECT_MSG(kva_decode_run(ctx, &plan, &p, qt, NULL, ot, NULL), "kva_decode_run", "pages");
    kva_attn_params bp = p;
    bp.head_dim = 24;
    EXPECT_MSG(kva_decode_run(ctx, &plan, &bp, qt, &pages, ot, NULL), "kva_decode_run",
               "params.head_dim");
    bp = p;
    bp.causal = 2;
    EXPECT_MSG(kva_decode_run(ctx, &plan, &bp, qt, &pages, ot, NULL), "kva_decode_run",
               "params.causal");
    kva_tensor misq = qt;
    misq.data = (char *)q + 4;
    EXPECT_MSG(kva_decode_run(ctx, &plan, &p, misq, &pages, ot, NULL), "kva_decode_run", "q.data");
    kva_tensor wrong = ot;
    wrong.dtype = KVA_F16;
    EXPECT_MSG(kva_decode_run(ctx, &plan, &p, qt, &pages, wrong, NULL), "kva_decode_run", "o.dtype");
    kva_kv_pages bad_pages = pages;
    bad_pages.num_kv_heads = 2;
    EXPECT_MSG(kva_decode_run(ctx, &plan, &p, qt, &bad_pages, ot, NULL), "kva_decode_run", "pages");
    EXPECT_MSG(kva_prefill_run_paged(ctx, &plan, &p, qt, &pages, ot, NULL), "kva_prefill_run_paged",
               "plan");
    EXPECT_MSG(kva_prefill_run_ragged(ctx, &plan, NULL, qt, qt, qt, ot, NULL),
               "kva_prefill_run_ragged", "params");
    EXPECT_MSG(kva_attention(ctx, NULL, 1, 1, qt, qt, qt, ot, NULL), "kva_attention", "params");
    EXPECT_MSG(kva_attention(ctx, &bp, 1, 1, qt, qt, qt, ot, NULL), "kva_attention", "params.causal");
    EXPECT_MSG(kva_attention(ctx, &p, 1, 1, misq, qt, qt, ot, NULL), "kva_attention", "q.data");
    EXPECT_MSG(kva_merge_states(NULL, 1, 1, 16, KVA_F32, q, q, o, NULL), "kva_merge_states", "ctx");

    free(k);
    free(v);
    free(q);
    free(o);
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    kva_context_destroy(ctx);
}

/* kva_cache_append checks k / v with the attention calls' tensor check: its messages must name
 * kva_cache_append, not the call an earlier failure on this thread was serving (they read
 * "kva_decode_workspace_size: kva_cache_append: k.dtype ..." or "kvattn: kva_cache_append: ..."). */
KVA_TEST(error_messages_cache_append_tensors_name_the_call) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    enum { HK = 2, D = 16 };
    kva_cache_config cfg = {.num_layers = 1, .num_kv_heads = HK, .head_dim = D, .page_size = 4,
                            .num_pages = 4, .dtype = KVA_F32, .layout = KVA_LAYOUT_NHD,
                            .max_sequences = 2, .max_append_tokens = 8};
    kva_cache *cache = NULL;
    REQUIRE_OK(kva_cache_create(ctx, &cfg, &cache));
    int32_t seq, two = 2;
    REQUIRE_OK(kva_cache_add_sequence(cache, &seq));
    REQUIRE_OK(kva_cache_reserve(cache, 1, &seq, &two));
    float *rows = kva_test_alloc(2 * HK * D * sizeof(float));
    memset(rows, 0, 2 * HK * D * sizeof(float));
    kva_tensor k = kva_tensor_nhd(rows, KVA_F32, HK, D), v = k;
    size_t a, b;
    kva_tensor bad = k;
    bad.dtype = KVA_BF16;
    (void)kva_decode_workspace_size(ctx, NULL, &a, &b); /* another call's name on this thread */
    EXPECT_MSG(kva_cache_append(cache, 0, 1, &seq, &two, bad, v), "kva_cache_append", "k.dtype");
    bad = v;
    bad.data = NULL;
    (void)kva_decode_workspace_size(ctx, NULL, &a, &b);
    EXPECT_MSG(kva_cache_append(cache, 0, 1, &seq, &two, k, bad), "kva_cache_append", "v.data");
    bad = k;
    bad.data = (char *)rows + 4;
    EXPECT_MSG(kva_cache_append(cache, 0, 1, &seq, &two, bad, v), "kva_cache_append", "k.data");
    CHECK_OK(kva_cache_append(cache, 0, 1, &seq, &two, k, v));
    free(rows);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
}

/* A NULL cache is named as kvattn.h names the argument ("cache"), not as the library's local
 * variable ("kva_cache_seq_len: c is NULL"). */
KVA_TEST(error_messages_null_cache_is_named_cache) {
    int32_t id = 0, ids[1] = {0}, one[1] = {1}, len, rc, indptr[2];
    kva_kv_pages pages;
    kva_cache_stats stats;
    kva_tensor none = {NULL, KVA_F32, 0, 0};
    EXPECT_MSG(kva_cache_add_sequence(NULL, &id), "kva_cache_add_sequence", "cache is NULL");
    EXPECT_MSG(kva_cache_free_sequence(NULL, 0), "kva_cache_free_sequence", "cache is NULL");
    EXPECT_MSG(kva_cache_fork(NULL, 0, &id), "kva_cache_fork", "cache is NULL");
    EXPECT_MSG(kva_cache_reserve(NULL, 1, ids, one), "kva_cache_reserve", "cache is NULL");
    EXPECT_MSG(kva_cache_append(NULL, 0, 1, ids, one, none, none), "kva_cache_append",
               "cache is NULL");
    EXPECT_MSG(kva_cache_seq_len(NULL, 0, &len), "kva_cache_seq_len", "cache is NULL");
    EXPECT_MSG(kva_cache_page_table(NULL, 0, NULL, indptr, NULL, 0, NULL, NULL),
               "kva_cache_page_table", "cache is NULL");
    EXPECT_MSG(kva_cache_layer_pages(NULL, 0, &pages), "kva_cache_layer_pages", "cache is NULL");
    EXPECT_MSG(kva_cache_get_stats(NULL, &stats), "kva_cache_get_stats", "cache is NULL");
    EXPECT_MSG(kva_cache_prefault(NULL), "kva_cache_prefault", "cache is NULL");
    EXPECT_MSG(kva_cache_page_refcount(NULL, 0, &rc), "kva_cache_page_refcount", "cache is NULL");
}

/* A negative thread count, or one whose CPU scratch cannot be allocated: the message names the
 * call and the argument (they read "kva_context_set_threads: -1 < 0" and "CPU scratch: cannot
 * allocate N bytes"), and the context keeps its threads.
 * Skipped under Address- and ThreadSanitizer, whose allocators abort on a request this large.
 * (Named so that the ThreadSanitizer target's "threads_" filter does not pick it.) */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVA__SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVA__SANITIZER_ALLOCATOR 1
#endif
#endif
KVA_TEST(error_messages_thread_count_out_of_memory) {
#ifdef KVA__SANITIZER_ALLOCATOR
    kva_test_skip("the sanitizer's allocator aborts on an allocation of 2^53 bytes");
#else
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const int before = kva_context_threads(ctx);
    EXPECT_MSG(kva_context_set_threads(ctx, -1), "kva_context_set_threads", "num_threads");
    /* INT32_MAX threads x 4 MB of scratch: 2^53 bytes, more than any address space */
    kva_status st = kva_context_set_threads(ctx, INT32_MAX);
    if (st == KVA_OK) { /* an address space and overcommit policy that reserve 8 PB */
        kva_test_skip("the system reserved 2^53 bytes of scratch");
    } else {
        CHECK(st == KVA_ERR_OUT_OF_MEMORY);
        EXPECT_MSG(st, "kva_context_set_threads", "num_threads");
        CHECK(kva_context_threads(ctx) == before);
    }
    kva_context_destroy(ctx);
#endif
}
