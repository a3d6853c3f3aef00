/*
 * decode_launch.cu -- kva__cuda_decode_run: picks the decode kernel for (dtype, head dim, GQA
 * group, algorithm) with kva__decode_kernel_for and launches it on the context stream: once for
 * partial rowmax (the split-KV merge is fused into it), twice for global rowmax (pass 1: each
 * chunk's row max, reduced per request by the last block; pass 2: exp against it, plain-sum
 * merge). Both launches have the same shape and arguments but the pass number, so a graph
 * captured with either algorithm replays after re-planning.
 *
 * The grid is persistent: min(padded_work x num_kv_heads, blocks resident at once), each block
 * looping over (work item, KV head) units (decode_kernel.cuh) -- or (work item, pair of KV
 * heads) units, num_kv_heads / 2 per work item, where kva__decode_pair_for pairs them. Kernel arguments hold only what is fixed
 * for a workspace and a layer (pointers, strides, offsets of the workspace's int arrays, the
 * attention variant, and the work count of a non-graph plan); per-unit records, lengths and page
 * ids -- and the work count of a KVA_PLAN_GRAPH plan -- are read from the workspace's device part,
 * so a run captured in a CUDA graph replays correctly after re-planning into the same workspace.
 */
#include "cuda_common.cuh"
#include "decode_kernels.h"
#include "variant.h"

#include <math.h>

extern "C" kva_status kva__cuda_decode_run(kva_context *ctx, const kva_plan *plan,
                                           const kva_attn_params *params, kva_tensor q,
                                           const kva_kv_pages *pages, kva_tensor o, float *lse) {
    const int Hq = params->num_qo_heads, Hk = params->num_kv_heads, D = params->head_dim;
    const int group = Hq / Hk;
    const int gr = plan->algo == KVA_DECODE_GLOBAL_ROWMAX;
    kva__decode_choice ch;
    if (!kva__decode_kernel_for(ctx, pages->dtype, D, group, gr, &ch))
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "kva_decode_run: %s with head_dim %d, GQA group %d has no CUDA decode kernel "
                         "(head_dim: multiples of 16 in 32..256)",
                         kva_dtype_name(pages->dtype), D, group);
    /* A large group on the prefill kernel, unless its plan chose the sub-group kernel
     * (kva__plan_header.decode_subgroups). A variant must have been built for decode (as for
     * any group: which kernel serves the group is ours to choose, not the caller's) and, to take
     * this path, for the TMA prefill kernel too; else the sub-group kernel runs it. */
    int per_sm = ch.blocks_per_sm;
    const bool variant_decode =
        !params->variant || kva__variant_decode_fn(params->variant, pages->dtype, ch.built_dim, ch.nt, gr, &per_sm, NULL);
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    if (ch.via_prefill && !gr && !h->decode_subgroups && variant_decode &&
        (!params->variant || kva__variant_prefill_fn(params->variant, pages->dtype, ch.built_dim, KVA__VMOD_PF_TMA)))
        return kva__cuda_decode_as_prefill(ctx, plan, params, q, pages, o, lse);
    /* Two adjacent KV heads per unit where that makes a unit's rows whole 128-byte lines (a
     * variant's too, if it was built for the pair's head dim as well as for the caller's, so
     * that whether a variant runs never depends on the plan's split) */
    kva__decode_choice pair;
    int pair_per_sm = 0;
    const bool paired = kva__decode_pair_for(ctx, pages->dtype, D, group, Hk, pages->stride_head, plan->split_kv, gr, &pair) &&
                        (!params->variant ||
                         (kva__variant_decode_fn(params->variant, pages->dtype, pair.built_dim, pair.nt, gr, &pair_per_sm, NULL) &&
                          kva__variant_decode_fn(params->variant, pages->dtype, ch.built_dim, ch.nt, gr, &pair_per_sm, NULL)));
    if (paired) ch = pair;
    const int unit_heads = paired ? 2 : 1; /* KV heads per unit */
    per_sm = ch.blocks_per_sm;
    int fn_pdl = 1; /* the kernel's running code holds kva__pdl_wait (built-in: decode_kernels_wait) */
    if (params->variant) {
        /* the variant's build of the same kernel: same geometry, its own occupancy */
        ch.fn = kva__variant_decode_fn(params->variant, pages->dtype, ch.built_dim, ch.nt, gr, &per_sm, &fn_pdl);
        if (!ch.fn)
            return kva__fail(KVA_ERR_UNSUPPORTED,
                             "kva_decode_run: params.variant was not compiled for %s decode at head_dim %d "
                             "(kva_variant_options: kinds, dtypes, head_dim)",
                             kva_dtype_name(pages->dtype), D);
    }
    const int smem = ch.smem;
    /* Persistent grid: every block resident at once, each looping over (work item, KV head,
     * sub-group) units; never more blocks than the plan (padded for graphs) has units. */
    const int64_t units = (int64_t)plan->padded_work * (Hk / unit_heads) * ch.nsub;
    if (units == 0) return KVA_OK;
    if (units > 0x7fffffff)
        return kva__fail(KVA_ERR_BAD_SHAPE, "kva_decode_run: %lld (work item, KV head) units exceed 2^31",
                         (long long)units);
    const int64_t resident = (int64_t)(ctx->num_sms > 0 ? ctx->num_sms : 1) * per_sm;
    const int64_t blocks = units < resident ? units : resident;
    KVA_TRY(kva__cuda_use_device(ctx));

    unsigned char *dev = (unsigned char *)plan->workspace.device;
    kva__decode_args a;
    a.q = q.data;
    a.q_st = q.stride_token;
    a.q_sh = q.stride_head;
    a.o = o.data;
    a.o_st = o.stride_token;
    a.o_sh = o.stride_head;
    a.k = pages->k_data;
    a.v = pages->v_data;
    a.p_sp = pages->stride_page;
    a.p_st = pages->stride_token;
    a.p_sh = pages->stride_head * unit_heads; /* (a unit's first KV head) */
    a.lse = lse;
    a.hdr = (const kva__plan_header *)dev;
    a.ints = kva__plan_ints(dev);
    a.off_request = h->off_request;
    a.off_kv_tile = h->off_kv_tile;
    a.off_group_indptr = h->off_group_indptr;
    a.off_kv_indptr = h->off_kv_indptr;
    a.off_page_indices = h->off_page_indices;
    a.off_kv_len = h->off_kv_len;
    a.records = (const int4 *)(a.ints + h->off_unit_records);
    /* A graph replays after re-planning: it must read the count from the device; otherwise the
     * count travels with the launch and the kernel starts one round trip earlier. */
    a.num_work = (plan->flags & KVA_PLAN_GRAPH) ? -1 : plan->num_work;
    a.max_units = (int32_t)units;
    a.partial_o = (float *)(dev + h->off_partial_o);
    a.partial_lse = (float *)(dev + h->off_partial_lse);
    a.counters = (unsigned *)(dev + h->off_counters);
    a.run_counters = (unsigned *)(dev + h->off_run_counters);
    a.run_lse = (float *)(dev + h->off_run_lse);
    a.num_qo_heads = Hq;
    a.num_kv_heads = Hk / unit_heads;
    a.group = group * unit_heads;
    a.page_size = h->page_size;
    a.page_div = kva__div_magic_for(h->page_size);
    a.window_left = params->window_left < 0 ? -1 : params->window_left;
    a.head_dim = D;
    a.row_dim = D * unit_heads;
    a.pair_group = paired ? group : 0;
    a.sub = ch.sub;
    a.nsub = ch.nsub;
    a.units_per_work = a.num_kv_heads * ch.nsub;
    a.pass = 0;
    a.mod_user = params->score_mod_user;
    a.merge_wait_ns = ((const kva__cuda_private *)ctx->cuda_private)->decode_merge_wait_ns;
    a.shared_merge_min = ((const kva__cuda_private *)ctx->cuda_private)->decode_shared_merge_min;
    a.merge_withdrawals = ((const kva__cuda_private *)ctx->cuda_private)->merge_withdrawals;
    const float sm_scale = params->sm_scale > 0 ? params->sm_scale : 1.0f / sqrtf((float)D);
    const float log2e = 1.4426950408889634f;
    a.scale_log2 = sm_scale * log2e;
    const float cap = kva__soft_cap(params->logits_soft_cap); /* +inf: no cap */
    if (cap > 0) {
        a.cap_log2 = cap * log2e;
        a.cap_inv_scale = sm_scale / cap;
    } else {
        a.cap_log2 = 0.0f;
        a.cap_inv_scale = 0.0f;
    }

    void *args[] = {&a};
    /* With KVA__DECODE_PDL (cuda_common.cuh) the kernel -- built-in, or a variant's whose code
     * runs sm_90+ -- launches as a programmatic dependent of the kernel before it, whose writes it
     * waits for in-kernel (the caller data of a variant included) */
    const kva__cuda_private *priv = (const kva__cuda_private *)ctx->cuda_private;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3(KVA__DECODE_THREADS);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = kva__stream(ctx);
    cfg.attrs = &attr;
    cfg.numAttrs = priv && priv->decode_pdl && fn_pdl ? 1 : 0;
    for (int pass = gr ? 1 : 0; pass <= (gr ? 2 : 0); ++pass) {
        a.pass = pass; /* copied into the launch: the second launch sees 2 */
        if (cfg.numAttrs)
            KVA_CUDA_TRY(cudaLaunchKernelExC(&cfg, ch.fn, args));
        else
            KVA_CUDA_TRY(cudaLaunchKernel(ch.fn, cfg.gridDim, cfg.blockDim, args, cfg.dynamicSmemBytes, cfg.stream));
    }
    return KVA_OK;
}
