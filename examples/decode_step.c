/*
 * decode_step.c -- the smallest complete use of kvattn: a paged cache, two sequences, one
 * decode step (reserve, append, plan, run) on the CPU, or on CUDA with `decode_step cuda`.
 * Built with the project (`build/decode_step`); shown in README.md.
 */
#include <kvattn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        kva_status st_ = (call);                                                               \
        if (st_ != KVA_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s: %s\n", #call, kva_status_str(st_), kva_last_error()); \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

int main(int argc, char **argv) {
    kva_device_type dev = argc > 1 && strcmp(argv[1], "cuda") == 0 ? KVA_DEVICE_CUDA : KVA_DEVICE_CPU;
    enum { QO_HEADS = 32, KV_HEADS = 8, D = 128, PAGE = 16, PAGES = 256, N = 2 };
    kva_context *ctx;
    CHECK(kva_context_create(dev, 0, &ctx));

    /* A cache of one layer; pages live in the context's device memory. */
    kva_cache_config cc = {.num_layers = 1, .num_kv_heads = KV_HEADS, .head_dim = D,
                           .page_size = PAGE, .num_pages = PAGES, .dtype = KVA_F32,
                           .layout = KVA_LAYOUT_NHD, .max_sequences = 8, .max_append_tokens = 64};
    kva_cache *cache;
    CHECK(kva_cache_create(ctx, &cc, &cache));
    int32_t seq[N];
    for (int i = 0; i < N; ++i) CHECK(kva_cache_add_sequence(cache, &seq[i]));

    /* One new token per sequence: reserve its slot, then write its K/V (host -> device). */
    int32_t one[N] = {1, 1};
    size_t kv_bytes = (size_t)N * KV_HEADS * D * sizeof(float);
    size_t q_bytes = (size_t)N * QO_HEADS * D * sizeof(float);
    float *host = malloc(q_bytes);
    for (size_t i = 0; i < q_bytes / sizeof(float); ++i) host[i] = (float)(i % 7) * 0.1f;
    void *k, *v, *q, *o;
    CHECK(kva_malloc(ctx, kv_bytes, &k));
    CHECK(kva_malloc(ctx, kv_bytes, &v));
    CHECK(kva_malloc(ctx, q_bytes, &q));
    CHECK(kva_malloc(ctx, q_bytes, &o));
    CHECK(kva_memcpy(ctx, k, host, kv_bytes, KVA_COPY_HOST_TO_DEVICE));
    CHECK(kva_memcpy(ctx, v, host, kv_bytes, KVA_COPY_HOST_TO_DEVICE));
    CHECK(kva_memcpy(ctx, q, host, q_bytes, KVA_COPY_HOST_TO_DEVICE));
    CHECK(kva_cache_reserve(cache, N, seq, one));
    CHECK(kva_cache_append(cache, 0, N, seq, one, kva_tensor_nhd(k, KVA_F32, KV_HEADS, D),
                           kva_tensor_nhd(v, KVA_F32, KV_HEADS, D)));

    /* Plan once per step (host arithmetic into a workspace sized once), run per layer. */
    int32_t indptr[N + 1], indices[PAGES], last_len[N];
    kva_page_table table;
    CHECK(kva_cache_page_table(cache, N, seq, indptr, indices, PAGES, last_len, &table));
    kva_plan_limits lim = {.max_batch = 8, .max_total_pages = PAGES, .num_qo_heads = QO_HEADS,
                           .num_kv_heads = KV_HEADS, .head_dim = D, .page_size = PAGE};
    kva_workspace ws = {0};
    CHECK(kva_decode_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes));
    CHECK(kva_malloc(ctx, ws.device_bytes, &ws.device));
    CHECK(kva_host_alloc(ctx, ws.host_bytes, &ws.host));
    kva_plan plan;
    CHECK(kva_decode_plan(ctx, &lim, &table, PAGES, NULL, ws, &plan));

    kva_attn_params p = kva_attn_params_default(QO_HEADS, KV_HEADS, D);
    kva_kv_pages pages;
    CHECK(kva_cache_layer_pages(cache, 0, &pages));
    CHECK(kva_decode_run(ctx, &plan, &p, kva_tensor_nhd(q, KVA_F32, QO_HEADS, D), &pages,
                         kva_tensor_nhd(o, KVA_F32, QO_HEADS, D), NULL));
    CHECK(kva_memcpy(ctx, host, o, q_bytes, KVA_COPY_DEVICE_TO_HOST));
    /* With one key, attention returns that key's value row: o == v for every head. */
    printf("o[0][0][0..3] = %.2f %.2f %.2f %.2f (v row: %.2f %.2f %.2f %.2f)\n", host[0], host[1],
           host[2], host[3], 0.0, 0.1, 0.2, 0.3);

    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    kva_free(ctx, k); kva_free(ctx, v); kva_free(ctx, q); kva_free(ctx, o);
    free(host);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    return 0;
}
