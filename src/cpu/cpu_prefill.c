/*
 * cpu_prefill.c -- the CPU entry points for prefill-shaped attention: dense kva_attention and
 * the ragged / paged prefill runs. They cut the call into engine tasks (prefill_engine.h), run
 * them in parallel on the context's threads (thread_pool.h), and for split-KV plans merge the
 * partial states.
 *
 * Work split:
 *   dense:  (query tile x KV head) tasks over the whole key range; no workspace, so no split.
 *   plans:  (work item x KV head) tasks, work items as the planner flattened them (request,
 *           query tile of plan->qo_tile_size tokens, key chunk of plan->kv_chunk_size keys).
 *           A task whose (request, query tile) group has one work item writes o / lse directly;
 *           otherwise it writes its partial state to the workspace and a second parallel pass
 *           merges each group's states by LSE, as kva_merge_states does.
 * Tasks are handed out under dynamic scheduling in reverse order: later query tiles see more
 * keys under a causal mask, so the longest tasks start first and the short ones fill the tail.
 *
 * Partial states (device part of the workspace), for split work item w:
 *   O   f32 at off_partial_o   + ((w * rows_per_work) + t * num_qo_heads + h) * head_dim
 *   LSE f32 at off_partial_lse + (w * rows_per_work) + t * num_qo_heads + h   (natural log)
 * with t the token within the query tile and h the query head (token-major, like o itself).
 */
#include "cpu_backend.h"
#include "prefill_engine.h"
#include "cpu_isa.h"
#include "kernels/simd.h"
#include "../common/internal.h"
#include "../common/softmax_state.h"
#include "../plan/planner.h"

#include <math.h>

static kva__prefill_config make_config(const kva_attn_params *p, kva_dtype dtype) {
    kva__prefill_config c;
    c.group = p->num_qo_heads / p->num_kv_heads;
    c.head_dim = p->head_dim;
    c.dtype = dtype;
    c.sm_scale = p->sm_scale > 0 ? p->sm_scale : 1.0f / sqrtf((float)p->head_dim);
    c.causal = p->causal;
    c.window_left = p->window_left;
    c.logits_soft_cap = kva__soft_cap(p->logits_soft_cap);
    c.score_mod = p->score_mod;
    c.score_mod_user = p->score_mod_user;
    return c;
}

static kva_status check_scratch(const kva_context *ctx, int32_t head_dim) {
    size_t need = ctx->cpu_kernels->prefill_scratch_bytes(head_dim);
    if (!ctx->cpu_scratch || ctx->cpu_scratch_per_thread < need ||
        ctx->cpu_scratch_threads < ctx->num_threads)
        return kva__fail(KVA_ERR_BAD_STATE,
                         "%s: the context's per-thread scratch is %zu bytes for %d threads, needs "
                         "%zu for %d",
                         kva__api(), ctx->cpu_scratch_per_thread, ctx->cpu_scratch_threads, need,
                         ctx->num_threads);
    return KVA_OK;
}

static void *thread_scratch(const kva_context *ctx, int thread) {
    return ctx->cpu_scratch + (size_t)thread * ctx->cpu_scratch_per_thread;
}

static const unsigned char *row_of(kva_tensor t, int64_t token) {
    return (const unsigned char *)t.data +
           (size_t)(token * t.stride_token) * kva_dtype_size(t.dtype);
}

/* ---- dense ------------------------------------------------------------------------------ */

typedef struct dense_job {
    const kva_context *ctx;
    kva__prefill_config cfg;
    int32_t Hk, Hq, tile, qo_len, kv_len;
    int64_t tasks;
    kva_tensor q, k, v, o;
    float *lse;
} dense_job;

/* Task i of a dense call: the last query tiles first (causal: they have the most keys). */
static void dense_task(void *arg, int64_t i, int thread) {
    const dense_job *J = (const dense_job *)arg;
    const int64_t u = J->tasks - 1 - i;
    const int32_t qt = (int32_t)(u / J->Hk);
    int32_t tok0, ntok; /* (tiles aligned to the end, as a plan's: planner.h) */
    kva__qo_tile_span(J->qo_len, J->tile, qt, &tok0, &ntok);
    kva__prefill_task task;
    task.q = row_of(J->q, tok0);
    task.q_stride_token = J->q.stride_token;
    task.q_stride_head = J->q.stride_head;
    task.num_tokens = ntok;
    task.first_q_pos = J->kv_len - J->qo_len + tok0;
    task.kv_begin = 0;
    task.kv_end = J->kv_len;
    task.kv_head = (int32_t)(u % J->Hk);
    task.kv = (kva__kv_source){.k = J->k.data,
                               .v = J->v.data,
                               .stride_token = J->k.stride_token,
                               .stride_head = J->k.stride_head,
                               .v_stride_token = J->v.stride_token,
                               .v_stride_head = J->v.stride_head};
    task.out = (void *)row_of(J->o, tok0);
    task.out_dtype = J->o.dtype;
    task.out_stride_token = J->o.stride_token;
    task.out_stride_head = J->o.stride_head;
    task.lse = J->lse ? J->lse + (size_t)tok0 * J->Hq : NULL;
    task.lse_stride_token = J->Hq;
    J->ctx->cpu_kernels->prefill_task_run(&J->cfg, &task, thread_scratch(J->ctx, thread));
}

kva_status kva__cpu_attention(kva_context *ctx, const kva_attn_params *params, int32_t qo_len,
                              int32_t kv_len, kva_tensor q, kva_tensor k, kva_tensor v,
                              kva_tensor o, float *lse) {
    if (qo_len == 0) return KVA_OK;
    KVA_TRY(check_scratch(ctx, params->head_dim));
    const int32_t Hk = params->num_kv_heads, Hq = params->num_qo_heads;
    /* The engine's preferred tile, halved (down to 16) while there are too few tasks for the
     * threads. */
    int32_t tile = kva__prefill_tile_tokens(params->num_qo_heads / params->num_kv_heads);
    while (tile > 16 && kva__ceil_div64(qo_len, tile) * Hk < 2 * (int64_t)ctx->num_threads)
        tile /= 2;
    const int64_t tasks = kva__ceil_div64(qo_len, tile) * Hk;
    dense_job J = {ctx, make_config(params, q.dtype), Hk, Hq, tile, qo_len, kv_len, tasks, q, k, v, o, lse};
    kva__pool_for(&ctx->cpu_pool, ctx->num_threads, tasks, 1, dense_task, &J);
    return KVA_OK;
}

/* ---- plans -------------------------------------------------------------------------------- */

/* Merges the n partial states of one row into an output row of dtype (and its LSE), with the
 * shared merge math of softmax_state.h. */
static void merge_row(int32_t n, const float *lse_in, int64_t lse_stride, const float *o_in,
                      int64_t o_stride, int32_t D, void *out, kva_dtype dtype, float *lse_out) {
    const float total = kva__lse_combine(lse_in, lse_stride, n);
    kva__vf acc[256 / KVA__VL];
    for (int32_t d = 0; d < D / KVA__VL; ++d)
        acc[d] = kva__splat(0.0f);
    if (total != -INFINITY) {
        for (int32_t s = 0; s < n; ++s) {
            const float w = kva__lse_weight(lse_in[s * lse_stride], total);
            if (w == 0.0f) continue;
            const float *os = o_in + s * o_stride;
            for (int32_t d = 0; d < D / KVA__VL; ++d)
                acc[d] = kva__fma(kva__splat(w), kva__loadu(os + KVA__VL * d), acc[d]);
        }
    }
    const size_t es = kva_dtype_size(dtype);
    for (int32_t d = 0; d < D / KVA__VL; ++d)
        kva__storev((unsigned char *)out + (size_t)d * KVA__VL * es, dtype, acc[d]);
    if (lse_out) *lse_out = total;
}

typedef struct plan_job {
    const kva_context *ctx;
    kva__prefill_config cfg;
    int32_t Hk, Hq, D, tile, chunk;
    int64_t tasks, rows_per_work;
    const int32_t *req, *qtile, *kvtile, *group, *qo_indptr, *kv_indptr, *qo_len, *kv_len, *page_indices;
    float *partial_o, *partial_lse;
    kva_tensor q, k, v, o;
    const kva_kv_pages *pages;
    float *lse;
} plan_job;

/* Task i of a plan: (work item, KV head), the plan's last items first. */
static void plan_task(void *arg, int64_t i, int thread) {
    const plan_job *J = (const plan_job *)arg;
    const int32_t tile = J->tile, chunk = J->chunk, Hq = J->Hq, D = J->D;
    const int64_t u = J->tasks - 1 - i;
    const int32_t w = (int32_t)(u / J->Hk);
    const int32_t b = J->req[w];
    int32_t tok0, ntok; /* (the plan's tile: planner.h) */
    kva__qo_tile_span(J->qo_len[b], tile, J->qtile[w], &tok0, &ntok);
    const int64_t q_row = (int64_t)J->qo_indptr[b] + tok0;
    const int32_t nkv = J->kv_len[b];
    const int64_t kv_begin = (int64_t)J->kvtile[w] * chunk;
    kva__prefill_task task;
    task.q = row_of(J->q, q_row);
    task.q_stride_token = J->q.stride_token;
    task.q_stride_head = J->q.stride_head;
    task.num_tokens = ntok;
    task.first_q_pos = nkv - J->qo_len[b] + tok0;
    task.kv_begin = (int32_t)(kv_begin < nkv ? kv_begin : nkv);
    task.kv_end = (int32_t)(kv_begin + chunk < nkv ? kv_begin + chunk : nkv);
    task.kv_head = (int32_t)(u % J->Hk);
    const kva_kv_pages *pages = J->pages;
    if (pages)
        task.kv = (kva__kv_source){.k = pages->k_data,
                                   .v = pages->v_data,
                                   .stride_token = pages->stride_token,
                                   .stride_head = pages->stride_head,
                                   .pages = J->page_indices + J->kv_indptr[b],
                                   .page_size = pages->page_size,
                                   .stride_page = pages->stride_page};
    else
        task.kv = (kva__kv_source){.k = J->k.data,
                                   .v = J->v.data,
                                   .stride_token = J->k.stride_token,
                                   .stride_head = J->k.stride_head,
                                   .v_stride_token = J->v.stride_token,
                                   .v_stride_head = J->v.stride_head,
                                   .first_row = J->kv_indptr[b]};
    const bool split = nkv > chunk;
    if (split) {
        task.out = J->partial_o + (size_t)w * J->rows_per_work * D;
        task.out_dtype = KVA_F32;
        task.out_stride_token = (int64_t)Hq * D;
        task.out_stride_head = D;
        task.lse = J->partial_lse + (size_t)w * J->rows_per_work;
    } else {
        task.out = (void *)row_of(J->o, q_row);
        task.out_dtype = J->o.dtype;
        task.out_stride_token = J->o.stride_token;
        task.out_stride_head = J->o.stride_head;
        task.lse = J->lse ? J->lse + (size_t)q_row * Hq : NULL;
    }
    task.lse_stride_token = Hq;
    J->ctx->cpu_kernels->prefill_task_run(&J->cfg, &task, thread_scratch(J->ctx, thread));
}

/* Merge row set i: one (group, token of the tile), every query head. */
static void plan_merge(void *arg, int64_t i, int thread) {
    (void)thread;
    const plan_job *J = (const plan_job *)arg;
    const int32_t tile = J->tile, Hq = J->Hq, D = J->D;
    const int64_t rows_per_work = J->rows_per_work;
    const int32_t g = (int32_t)(i / tile), t = (int32_t)(i % tile);
    const int32_t w0 = J->group[g], n = J->group[g + 1] - J->group[g];
    if (n <= 1) return;
    const int32_t b = J->req[w0];
    int32_t tok0, ntok;
    kva__qo_tile_span(J->qo_len[b], tile, J->qtile[w0], &tok0, &ntok);
    if (t >= ntok) return;
    const int32_t tok = tok0 + t;
    const int64_t q_row = (int64_t)J->qo_indptr[b] + tok;
    const kva_tensor o = J->o;
    for (int32_t hq = 0; hq < Hq; ++hq) {
        const int64_t r = (int64_t)t * Hq + hq;
        merge_row(n, J->partial_lse + (size_t)w0 * rows_per_work + r, rows_per_work,
                  J->partial_o + ((size_t)w0 * rows_per_work + r) * D, rows_per_work * D, D,
                  (unsigned char *)o.data +
                      (size_t)(q_row * o.stride_token + hq * o.stride_head) * kva_dtype_size(o.dtype),
                  o.dtype, J->lse ? J->lse + q_row * Hq + hq : NULL);
    }
}

/* Runs a prefill plan; pages == NULL means ragged k / v tensors. */
static kva_status run_plan(kva_context *ctx, const kva_plan *plan, const kva_attn_params *params,
                           kva_tensor q, kva_tensor k, kva_tensor v, const kva_kv_pages *pages,
                           kva_tensor o, float *lse) {
    KVA_TRY(check_scratch(ctx, params->head_dim));
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    const int32_t *ints = kva__plan_ints(plan->workspace.host);
    const int32_t Hk = params->num_kv_heads;
    plan_job J = {
        .ctx = ctx,
        .cfg = make_config(params, q.dtype),
        .Hk = Hk,
        .Hq = params->num_qo_heads,
        .D = params->head_dim,
        .tile = h->qo_tile_size,
        .chunk = h->kv_chunk_size,
        .tasks = (int64_t)h->num_work * Hk,
        .rows_per_work = h->rows_per_work,
        .req = ints + h->off_request,
        .qtile = ints + h->off_qo_tile,
        .kvtile = ints + h->off_kv_tile,
        .group = ints + h->off_group_indptr,
        .qo_indptr = ints + h->off_qo_indptr,
        .kv_indptr = ints + h->off_kv_indptr,
        .qo_len = ints + h->off_qo_len,
        .kv_len = ints + h->off_kv_len,
        .page_indices = ints + h->off_page_indices,
        .partial_o = (float *)((unsigned char *)plan->workspace.device + h->off_partial_o),
        .partial_lse = (float *)((unsigned char *)plan->workspace.device + h->off_partial_lse),
        .q = q,
        .k = k,
        .v = v,
        .o = o,
        .pages = pages,
        .lse = lse,
    };
    kva__pool_for(&ctx->cpu_pool, ctx->num_threads, J.tasks, 1, plan_task, &J);
    if (!h->split_kv) return KVA_OK;
    kva__pool_for(&ctx->cpu_pool, ctx->num_threads, (int64_t)h->num_groups * J.tile, 4, plan_merge, &J);
    return KVA_OK;
}

kva_status kva__cpu_prefill_run_ragged(kva_context *ctx, const kva_plan *plan,
                                       const kva_attn_params *params, kva_tensor q, kva_tensor k,
                                       kva_tensor v, kva_tensor o, float *lse) {
    return run_plan(ctx, plan, params, q, k, v, NULL, o, lse);
}

kva_status kva__cpu_prefill_run_paged(kva_context *ctx, const kva_plan *plan,
                                      const kva_attn_params *params, kva_tensor q,
                                      const kva_kv_pages *pages, kva_tensor o, float *lse) {
    kva_tensor none = {NULL, pages->dtype, 0, 0};
    return run_plan(ctx, plan, params, q, none, none, pages, o, lse);
}
