/*
 * fuzz_planner.c -- page tables, limits and options through kva_decode_plan / kva_prefill_plan
 * and their runs on tiny shapes (CPU), checked against the float64 reference. Inputs are often
 * invalid (page ids outside the pool, bad last_page_len, decreasing indptr, batches beyond the
 * limits, unknown flags and algorithms, fixed chunks below limits.min_fixed_chunk). Checks:
 *   - a plan either succeeds and its run matches the reference, or fails with a documented
 *     status and a message naming the public call;
 *   - a failing plan call retires the workspace's previous plan (its run is refused), and a
 *     successful one as well (generations);
 *   - a plan never writes outside the workspace (ASan) and a workspace sized by
 *     *_workspace_size() for the limits is never reported too small for a plan within them.
 */
#include "fuzz_input.h"
#include "kvattn.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

enum { D = 16, MAX_B = 6, POOL = 24, MAX_PS = 6, MAX_QO = 40, MAX_KV = 160 };

static kva_context *ctx;

static float store[3][POOL * MAX_PS * 4 * D] __attribute__((aligned(64))); /* k, v pool; q */
static float ragged_k[MAX_KV * 4 * D] __attribute__((aligned(64)));
static float ragged_v[MAX_KV * 4 * D] __attribute__((aligned(64)));
static float out[MAX_QO * 8 * D] __attribute__((aligned(64)));
static float lse[MAX_QO * 8];
static double dq[MAX_QO * 8 * D], dk[MAX_KV * 4 * D], dv[MAX_KV * 4 * D], dout[MAX_QO * 8 * D];
static double dlse[MAX_QO * 8];

static bool documented(kva_status st) {
    return st == KVA_ERR_INVALID_ARG || st == KVA_ERR_BAD_SHAPE || st == KVA_ERR_OUT_OF_RANGE ||
           st == KVA_ERR_WORKSPACE_TOO_SMALL || st == KVA_ERR_UNSUPPORTED;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx) {
        if (kva_context_create(KVA_DEVICE_CPU, 0, &ctx) != KVA_OK) abort();
    }
    fz_in in = {data, size, 0};
    kva_context_set_threads(ctx, fz_range(&in, 1, 3)); /* the capacity the search sees varies */
    const int kind = fz_range(&in, 0, 2); /* decode, prefill ragged, prefill paged */
    const int32_t Hk = fz_range(&in, 1, 2), Hq = Hk * fz_range(&in, 1, 3);
    const int32_t ps = fz_range(&in, 1, MAX_PS);
    kva_plan_limits lim = {.max_batch = fz_range(&in, 1, MAX_B), .max_total_pages = fz_range(&in, 0, POOL),
                           .max_total_kv = fz_range(&in, 0, 1) ? MAX_KV : 0,
                           .max_total_qo = MAX_QO, .num_qo_heads = Hq, .num_kv_heads = Hk,
                           .head_dim = fz_range(&in, 0, 20) == 0 ? 24 : D,
                           .page_size = kind == 1 && fz_bool(&in) ? 0 : ps,
                           .min_fixed_chunk = fz_range(&in, 0, 3) == 0 ? fz_range(&in, 1, 9) : 0};
    if (kind == 1) lim.max_total_kv = MAX_KV;
    kva_workspace ws = {0};
    kva_status st = kind == 0 ? kva_decode_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes)
                              : kva_prefill_workspace_size(ctx, &lim, &ws.device_bytes, &ws.host_bytes);
    if (st != KVA_OK) {
        FZ_ASSERT(documented(st), "sizing: %s", kva_status_str(st));
        return 0;
    }
    if (kva_malloc(ctx, ws.device_bytes, &ws.device) != KVA_OK ||
        kva_host_alloc(ctx, ws.host_bytes, &ws.host) != KVA_OK)
        abort();

    /* the batch */
    int32_t B = fz_range(&in, 0, MAX_B + 1);
    int32_t indptr[MAX_B + 2], indices[POOL + 4], last[MAX_B + 1], qo[MAX_B + 2], kv[MAX_B + 2];
    indptr[0] = qo[0] = kv[0] = 0;
    for (int32_t b = 0; b < B; ++b) {
        int32_t np = fz_range(&in, 0, 4);
        if (indptr[b] + np > POOL + 4) np = 0;
        indptr[b + 1] = indptr[b] + np;
        last[b] = fz_range(&in, 0, 12) == 0 ? fz_range(&in, 0, MAX_PS + 1) : fz_range(&in, 1, ps);
        int32_t nq = fz_range(&in, 0, 8);
        qo[b + 1] = qo[b] + (qo[b] + nq <= MAX_QO ? nq : 0);
        int32_t nk = fz_range(&in, 0, 30);
        kv[b + 1] = kv[b] + (kv[b] + nk <= MAX_KV ? nk : 0);
    }
    for (int32_t i = 0; i < indptr[B]; ++i)
        indices[i] = fz_range(&in, 0, 20) == 0 ? fz_range(&in, -1, POOL + 3) : fz_range(&in, 0, POOL - 1);
    if (B > 0 && fz_range(&in, 0, 20) == 0) indptr[fz_range(&in, 1, B)] -= 1; /* maybe decreasing */
    kva_page_table t = {B, indptr, indices, last};
    const int32_t num_pages = fz_range(&in, 0, 20) == 0 ? fz_range(&in, -1, POOL) : POOL;
    kva_plan_options opt = {fz_range(&in, 0, 10) == 0 ? fz_u32(&in) : (uint32_t)fz_range(&in, 0, 3),
                            fz_bool(&in) ? fz_range(&in, 0, 12) : 0,
                            (kva_decode_algo)(fz_range(&in, 0, 10) == 0 ? fz_range(&in, 0, 3)
                                                                        : kind == 0 ? fz_range(&in, 0, 1) : 0)};
    kva_attn_params p = kva_attn_params_default(Hq, Hk, D);
    p.causal = fz_bool(&in);
    p.window_left = fz_bool(&in) ? fz_range(&in, 0, 20) : -1;
    p.logits_soft_cap = fz_range(&in, 0, 3) == 0 ? 5.0f : 0.0f;
    uint64_t seed = fz_u32(&in) | 1;

    /* an older plan in the same workspace, which any later plan call must retire */
    kva_plan old, plan;
    int32_t one_indptr[2] = {0, 1}, one_idx[1] = {0}, one_last[1] = {1}, one_qo[2] = {0, 1};
    kva_page_table one = {1, one_indptr, one_idx, one_last};
    kva_status old_st = lim.head_dim != D ? KVA_ERR_UNSUPPORTED
                        : kind == 0 ? kva_decode_plan(ctx, &lim, &one, POOL, NULL, ws, &old)
                        : kind == 1 ? kva_prefill_plan(ctx, &lim, 1, one_qo, one_qo, NULL, 0, NULL, ws, &old)
                                    : kva_prefill_plan(ctx, &lim, 1, one_qo, NULL, &one, POOL, NULL, ws, &old);

    st = kind == 0 ? kva_decode_plan(ctx, &lim, &t, num_pages, &opt, ws, &plan)
       : kind == 1 ? kva_prefill_plan(ctx, &lim, B, qo, kv, NULL, 0, &opt, ws, &plan)
                   : kva_prefill_plan(ctx, &lim, B, qo, NULL, &t, num_pages, &opt, ws, &plan);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st == KVA_OK ? "" : kva_last_error());
    if (old_st == KVA_OK) {
        kva_kv_pages pg = kva_kv_pages_separate(store[0], store[1], KVA_F32, POOL, lim.page_size ? lim.page_size : 1,
                                                Hk, D, KVA_LAYOUT_NHD);
        kva_tensor qt = kva_tensor_nhd(store[2], KVA_F32, Hq, D), ot = kva_tensor_nhd(out, KVA_F32, Hq, D);
        kva_status r = kind == 0 ? kva_decode_run(ctx, &old, &p, qt, &pg, ot, NULL)
                                 : kind == 1 ? kva_prefill_run_ragged(ctx, &old, &p, qt, qt, qt, ot, NULL)
                                             : kva_prefill_run_paged(ctx, &old, &p, qt, &pg, ot, NULL);
        FZ_ASSERT(r == KVA_ERR_BAD_STATE, "a retired plan ran: %s", kva_status_str(r));
    }
    if (st != KVA_OK) {
        FZ_ASSERT(documented(st), "plan: %s (%s)", kva_status_str(st), msg);
        const char *want = kind == 0 ? "kva_decode_plan:" : "kva_prefill_plan:";
        FZ_ASSERT(strncmp(msg, want, strlen(want)) == 0, "message: %s", msg);
        /* sized for these limits, a plan within them never lacks room: only totals beyond the
         * limits, or a fixed chunk the sizing was not told about, may be "too small" */
        if (st == KVA_ERR_WORKSPACE_TOO_SMALL)
            FZ_ASSERT(strstr(msg, "exceeds the limit") || strstr(msg, "limits.max_total_kv") ||
                          (opt.fixed_chunk_size > 0 && lim.min_fixed_chunk == 0),
                      "sized workspace too small: %s", msg);
        kva_free(ctx, ws.device);
        kva_host_free(ctx, ws.host);
        return 0;
    }

    /* the run, on random data, against the reference */
    const int32_t psz = lim.page_size ? lim.page_size : 1;
    for (size_t i = 0; i < sizeof store / sizeof(float); ++i) ((float *)store)[i] = fz_randf(&seed);
    for (int i = 0; i < MAX_KV * 4 * D; ++i) ragged_k[i] = fz_randf(&seed), ragged_v[i] = fz_randf(&seed);
    memset(out, 0, sizeof out);
    kva_kv_pages pg = kva_kv_pages_separate(store[0], store[1], KVA_F32, POOL, psz, Hk, D, KVA_LAYOUT_NHD);
    const int32_t nq = kind == 0 ? B : qo[B];
    kva_tensor qt = kva_tensor_nhd(store[2], KVA_F32, Hq, D), ot = kva_tensor_nhd(out, KVA_F32, Hq, D);
    st = kind == 0 ? kva_decode_run(ctx, &plan, &p, qt, &pg, ot, lse)
       : kind == 1 ? kva_prefill_run_ragged(ctx, &plan, &p, qt, kva_tensor_nhd(ragged_k, KVA_F32, Hk, D),
                                            kva_tensor_nhd(ragged_v, KVA_F32, Hk, D), ot, lse)
                   : kva_prefill_run_paged(ctx, &plan, &p, qt, &pg, ot, lse);
    FZ_ASSERT(st == KVA_OK, "run of a valid plan: %s", kva_last_error());
    for (int32_t b = 0; b < B; ++b) {
        int32_t q0 = kind == 0 ? b : qo[b], nqb = kind == 0 ? 1 : qo[b + 1] - qo[b], len;
        if (kind == 1) {
            len = kv[b + 1] - kv[b];
            kva_ref_read_tensor(kva_tensor_nhd(ragged_k, KVA_F32, Hk, D), kv[b], len, Hk, D, dk);
            kva_ref_read_tensor(kva_tensor_nhd(ragged_v, KVA_F32, Hk, D), kv[b], len, Hk, D, dv);
        } else {
            len = kva_ref_read_paged(&pg, &t, b, dk, dv);
        }
        kva_ref_read_tensor(qt, q0, nqb, Hq, D, dq);
        kva_ref_attention(&p, nqb, len, dq, dk, dv, dout, dlse);
        for (int32_t i = 0; i < nqb * Hq * D; ++i) {
            double got = out[(size_t)q0 * Hq * D + i], want = dout[i];
            FZ_ASSERT(fabs(got - want) <= 1e-4 + 1e-4 * fabs(want), "request %d value %d: %g vs %g",
                      b, i, got, want);
        }
        for (int32_t i = 0; i < nqb * Hq; ++i) {
            double got = lse[(size_t)q0 * Hq + i], want = dlse[i];
            FZ_ASSERT(isinf(want) ? got == want : fabs(got - want) <= 1e-4 + 1e-5 * fabs(want),
                      "request %d lse %d: %g vs %g", b, i, got, want);
        }
    }
    (void)nq;
    kva_free(ctx, ws.device);
    kva_host_free(ctx, ws.host);
    return 0;
}
