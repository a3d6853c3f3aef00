/*
 * prefill_launch.cu -- the CUDA prefill entry points: kva__cuda_prefill_run (ragged or paged
 * K/V, from a host plan) and kva__cuda_attention (one dense sequence, no plan), plus the kernel
 * chooser they and the split policy share.
 *
 * A plan run is one launch of the prefill kernel over grid (padded work items, KV heads) and,
 * when the plan may split keys, one launch of the merge kernel (where its code is sm_90+, a
 * programmatic dependent of the first, so its launch overlaps the first's end). Kernel arguments hold only what
 * is fixed for a workspace and a layer (pointers, strides, the variant, the work count of a
 * non-graph plan); records, page ids, the work and group counts of a KVA_PLAN_GRAPH plan are
 * read from the workspace's device part, so a captured run replays after re-planning.
 */
#include "cuda_common.cuh"
#include "decode_kernels.h"
#include "prefill_kernels.h"
#include "variant.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The kernel of exactly `rows` rows (64, 128, or KVA__PREFILL_ROWS_HOPPER: the wgmma kernel of
 * the Hopper kernel's rows), or false. */
static bool lookup(kva_dtype dtype, int head_dim, int rows, kva__prefill_choice *k) {
    int smem = 0, threads = 0;
    const void *fn = NULL;
    if (dtype == KVA_F32) fn = kva__prefill_f32(head_dim, rows, &smem, &threads);
    else if (dtype == KVA_BF16) fn = kva__prefill_bf16(head_dim, rows, &smem, &threads);
    else if (dtype == KVA_F16) fn = kva__prefill_f16(head_dim, rows, &smem, &threads);
    if (!fn) return false;
    k->fn = fn;
    k->rows = rows == KVA__PREFILL_ROWS_HOPPER ? threads / 2 /* 16 rows per warp */ : rows;
    k->smem = smem;
    k->threads = threads;
    k->lookup_rows = rows;
    return true;
}

/* The warp-specialised Hopper kernel, or false. */
static bool lookup_hopper(kva_dtype dtype, int head_dim, kva__prefill_choice *k) {
    int smem = 0, threads = 0, rows = 0, block_n = 0;
    const void *fn = NULL, *fn_nt = NULL, *fn_cap = NULL, *fn_cap_nt = NULL;
    if (dtype == KVA_BF16) {
        fn = kva__prefill_hopper_bf16(head_dim, 0, 0, &smem, &threads, &rows, &block_n);
        fn_nt = kva__prefill_hopper_bf16(head_dim, 1, 0, &smem, &threads, &rows, &block_n);
        fn_cap = kva__prefill_hopper_bf16(head_dim, 0, 1, &smem, &threads, &rows, &block_n);
        fn_cap_nt = kva__prefill_hopper_bf16(head_dim, 1, 1, &smem, &threads, &rows, &block_n);
    } else if (dtype == KVA_F16) {
        fn = kva__prefill_hopper_f16(head_dim, 0, 0, &smem, &threads, &rows, &block_n);
        fn_nt = kva__prefill_hopper_f16(head_dim, 1, 0, &smem, &threads, &rows, &block_n);
        fn_cap = kva__prefill_hopper_f16(head_dim, 0, 1, &smem, &threads, &rows, &block_n);
        fn_cap_nt = kva__prefill_hopper_f16(head_dim, 1, 1, &smem, &threads, &rows, &block_n);
    }
    if (!fn) return false;
    k->fn = fn;
    k->fn_no_turns = fn_nt != fn ? fn_nt : NULL;
    /* (a layout without capped builds, KVA__HP_CAP_BUILT, returns the same kernels: none) */
    k->fn_cap = fn_cap != fn ? fn_cap : NULL;
    k->fn_cap_no_turns = k->fn_cap && fn_cap_nt != fn_cap ? fn_cap_nt : NULL;
    k->rows = rows;
    k->smem = smem;
    k->threads = threads;
    k->tma = 1;
    k->block_n = block_n;
    return true;
}

extern "C" int kva__prefill_wg_warps(int built_dim) { return KVA__PREFILL_WG_WARPS(built_dim); }
extern "C" int kva__prefill_hp_qbufs(void) { return KVA__HP_QBUFS; }
extern "C" int kva__prefill_hp_oring(void) { return KVA__HP_ORING; }
extern "C" int kva__prefill_hp_smem_records(void) { return KVA__HP_SMEM_RECORDS; }
extern "C" int kva__prefill_hp_alibi_turns(void) { return KVA__HP_ALIBI_TURNS; }

bool kva__prefill_choose(kva_dtype dtype, int head_dim, int rows_wanted,
                         const kva__prefill_target *target, kva__prefill_choice *k) {
    memset(k, 0, sizeof *k);
    /* (head dims between the built ones run the next built kernel, paying for its padded
     * columns; on Hopper d96 has its own products on the d128 layout: bench/NOTES.md) */
    const int D = kva__built_head_dim(head_dim);
    if (D == 0) return false;
    k->built_dim = D;
    if (rows_wanted > KVA__PREFILL_ROWS_SMALL && target->path == KVA__PREFILL_HOPPER &&
        lookup_hopper(dtype, head_dim == 96 ? 96 : D, k) && k->smem <= target->smem_limit) {
        k->built_dim = D; /* (the layout's: a variant's module is built for it) */
        return true;
    }
    memset(k, 0, sizeof *k);
    k->built_dim = D;
    /* 128 rows share each K/V tile between twice the rows of the 64-row kernel; on Hopper the
     * large tile runs on wgmma (192 rows at d64). A kernel whose shared memory the device cannot give falls
     * back to the 64-row mma.sync kernel (e.g. head_dim 256 on an A100), or is unsupported. */
    int order[2] = {KVA__PREFILL_ROWS_SMALL, 0}, n = 1;
    if (rows_wanted > KVA__PREFILL_ROWS_SMALL) {
        order[0] = dtype != KVA_F32 && target->path >= KVA__PREFILL_WGMMA ? KVA__PREFILL_ROWS_HOPPER
                                                                          : KVA__PREFILL_ROWS_LARGE;
        order[1] = KVA__PREFILL_ROWS_SMALL;
        n = 2;
    }
    for (int i = 0; i < n; ++i)
        if (lookup(dtype, D, order[i], k) && k->smem <= target->smem_limit) {
            /* the f32 kernel takes rows 32 at a time, so it runs any tile up to the largest a
             * plan can have (192 at d64: plans are sized for the 16-bit kernels on Hopper) */
            if (dtype == KVA_F32 && rows_wanted > k->rows && rows_wanted <= KVA__PREFILL_ROWS_MAX)
                k->rows = rows_wanted;
            return true;
        }
    memset(k, 0, sizeof *k);
    return false;
}

/* The variant and head geometry, shared by plan runs and dense calls. */
static void fill_variant(kva__prefill_args *a, const kva_attn_params *p) {
    const int D = p->head_dim;
    a->head_dim = D;
    a->num_qo_heads = p->num_qo_heads;
    a->num_kv_heads = p->num_kv_heads;
    a->group = p->num_qo_heads / p->num_kv_heads;
    a->causal = p->causal;
    a->mod_user = p->score_mod_user;
    a->window_left = p->window_left < 0 ? -1 : p->window_left;
    const float sm_scale = p->sm_scale > 0 ? p->sm_scale : 1.0f / sqrtf((float)D);
    const float log2e = 1.4426950408889634f;
    a->scale_log2 = sm_scale * log2e;
    const float cap = kva__soft_cap(p->logits_soft_cap); /* +inf: no cap */
    if (cap > 0) {
        a->cap_log2 = cap * log2e;
        a->cap_inv_scale = sm_scale / cap;
    } else {
        a->cap_log2 = 0.0f;
        a->cap_inv_scale = 0.0f;
    }
}

/* ---- tensor maps for the warp-specialised Hopper kernel ----
 * The driver's encoder is reached through the runtime (no link against libcuda). A map is
 * built per call from pointers and strides only, so a captured graph replays with the maps of
 * its capture: ragged K/V get an unbounded token extent (the kernel never copies past a
 * block's last key), paged K/V the pool's page count. */
typedef CUresult (*kva__encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                         const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                         CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                         CUtensorMapFloatOOBfill);

static kva__encode_tiled_fn encoder(void) {
    static const kva__encode_tiled_fn fn = []() -> kva__encode_tiled_fn {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        return (kva__encode_tiled_fn)p;
    }();
    return fn;
}

/* One map of `rank` dims (innermost first: the head dim, copied 64 elements -- one 128-byte
 * swizzled row block -- per box, then the others), strides in elements for dims 1.. (a 16-bit
 * element), or false if the encoder refuses (unaligned pointer or stride). A box reaching past
 * the head dim (a head dim padded to the kernel's: 96 in the d128 kernel) lands zeros there and
 * a store writes nothing there. */
static bool encode(CUtensorMap *m, kva_dtype dt, int rank, const void *base, const uint64_t *dims,
                   const int64_t *strides, const uint32_t *box) {
    kva__encode_tiled_fn fn = encoder();
    if (!fn || ((uintptr_t)base & 15)) return false;
    cuuint64_t d[5], st[4];
    cuuint32_t b[5], es[5];
    for (int i = 0; i < rank; ++i) {
        d[i] = dims[i];
        b[i] = box[i];
        es[i] = 1;
        if (i > 0) {
            /* a dim of extent 1 is never stepped: any legal stride will do */
            const int64_t bytes = dims[i] == 1 ? 16 : strides[i - 1] * 2;
            if (bytes <= 0 || (bytes & 15)) return false;
            st[i - 1] = (cuuint64_t)bytes;
        }
    }
    const CUtensorMapDataType t = dt == KVA_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return fn(m, t, (cuuint32_t)rank, const_cast<void *>(base), d, st, b, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Ragged (or dense) K or V: [token][head][head_dim] with any token/head strides: dims
 * head_dim x token x head, one box = one 64-column block of a BN-key tile. */
static bool ragged_map(CUtensorMap *m, kva_dtype dt, const void *base, int64_t st, int64_t sh, int heads,
                       int head_dim, int bn) {
    const uint64_t dims[3] = {(uint64_t)head_dim, 0x7fffffffu, (uint64_t)heads};
    const int64_t strides[2] = {st, sh};
    const uint32_t box[3] = {64, (uint32_t)bn, 1};
    return encode(m, dt, 3, base, dims, strides, box);
}

/* Q or O: [token][head][head_dim]: dims head_dim x head x token, one box = one 64-column block
 * of g heads x `tokens` tokens. Unbounded token extent: the kernel copies only whole items'
 * rows. */
static bool qo_map(CUtensorMap *m, kva_dtype dt, const void *base, int64_t st, int64_t sh, int heads, int head_dim,
                   int g, int tokens) {
    const uint64_t dims[3] = {(uint64_t)head_dim, (uint64_t)heads, 0x7fffffffu};
    const int64_t strides[2] = {sh, st};
    const uint32_t box[3] = {64, (uint32_t)g, (uint32_t)tokens};
    return encode(m, dt, 3, base, dims, strides, box);
}

/* A paged pool: dims head_dim x slot x head x page, one box = `box_rows` slots of one 64-column
 * block. */
static bool paged_map(CUtensorMap *m, kva_dtype dt, const void *base, const kva_kv_pages *p, int box_rows) {
    const uint64_t dims[4] = {(uint64_t)p->head_dim, (uint64_t)p->page_size, (uint64_t)p->num_kv_heads,
                              (uint64_t)p->num_pages};
    const int64_t strides[3] = {p->stride_token, p->stride_head, p->stride_page};
    const uint32_t box[4] = {64, (uint32_t)box_rows, 1, 1};
    return encode(m, dt, 4, base, dims, strides, box);
}

/* A variant's build of the chosen kernel (same template, so the same launch shape), or an
 * error naming what the variant lacks. Where the chooser picked the warp-specialised Hopper
 * kernel and the variant has none (prefill_hopper.cuh without the score-modifier hook:
 * kva__variant_hopper_hooked), the variant runs the wgmma kernel of the same tile, as
 * the launcher does for K/V a tensor map cannot describe. */
static kva_status use_variant(const char *api, const kva_attn_params *p, kva_dtype dt, kva__prefill_choice *k) {
    if (!p->variant) return KVA_OK;
    k->fn_no_turns = NULL;
    k->fn_cap = k->fn_cap_no_turns = NULL; /* (a variant's module takes the cap at run time) */
    if (k->tma) {
        const void *fn = kva__variant_prefill_fn(p->variant, dt, k->built_dim, KVA__VMOD_PF_TMA);
        if (fn) {
            /* at d128 the module has a build with the turns too (variant.h): hopper_fn picks as for
             * the built-in kernels, between it and the source's own choice */
            const void *ft = kva__variant_prefill_fn(p->variant, dt, k->built_dim, KVA__VMOD_PF_TMA_TURNS);
            k->fn = ft ? ft : fn;
            k->fn_no_turns = ft ? fn : NULL;
            return KVA_OK;
        }
        kva__prefill_choice w;
        const kva__prefill_target wt = {KVA__PREFILL_WGMMA, 1 << 30};
        if (!kva__prefill_choose(dt, p->head_dim, KVA__PREFILL_ROWS_LARGE, &wt, &w) || w.rows != k->rows)
            return kva__fail(KVA_ERR_UNSUPPORTED, "%s: no wgmma kernel for a variant at %s head_dim %d", api,
                             kva_dtype_name(dt), p->head_dim);
        *k = w;
    }
    const int slot = k->lookup_rows == KVA__PREFILL_ROWS_HOPPER ? KVA__VMOD_PF_HOPPER
                     : k->lookup_rows == KVA__PREFILL_ROWS_SMALL ? KVA__VMOD_PF_SMALL
                                                                 : KVA__VMOD_PF_LARGE;
    const void *fn = kva__variant_prefill_fn(p->variant, dt, k->built_dim, slot);
    if (!fn)
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "%s: params.variant was not compiled for %s prefill at head_dim %d "
                         "(kva_variant_options: kinds, dtypes, head_dim)",
                         api, kva_dtype_name(dt), p->head_dim);
    k->fn = fn;
    return KVA_OK;
}

static kva_status launch(kva_context *ctx, const kva__prefill_choice *k, int64_t grid_x, int heads, void *a) {
    if (grid_x == 0) return KVA_OK;
    if (grid_x > 0x7fffffff || heads > 65535)
        return kva__fail(KVA_ERR_BAD_SHAPE, "prefill on CUDA: %lld work items x %d KV heads exceed the grid",
                         (long long)grid_x, heads);
    void *args[] = {a};
    KVA_CUDA_TRY(cudaLaunchKernel(k->fn, dim3((unsigned)grid_x, (unsigned)heads), dim3(k->threads), args,
                                  (size_t)k->smem, kva__stream(ctx)));
    return KVA_OK;
}

/* The chooser's second half, per call (kva__prefill_choose knows no shapes): on the d128 layout
 * the Hopper kernel's consumer warpgroups take turns issuing (ping-pong) where a call's items
 * are causal and short, and issue freely elsewhere. Paired H200 rounds, bf16 (bench/NOTES.md,
 * v6.39, 2026-11-29): without them 16k causal / full 690 / 697 -> 700 / 708 TFLOP/s, 8 x 2048
 * causal / full 588 / 669 -> 592 / 678, 32 x 512 full 578 -> 587, but 32 x 512 causal 380 -> 373
 * (items of ~2 key tiles, one of them the diagonal's masked one); at the threshold (one round,
 * 2026-11-29 19:23 UTC) 16 x 1024 causal 500 / 501 without / with, 8 x 2048 causal 597 / 590. d64 keeps
 * its turns (32 x 512 causal 234 -> 217 without, long rows level), d256 has none. Decode
 * records keep the build they were measured with. keys_per_item: the plan's chunk (a searched
 * plan's is at most its longest request; a fixed_chunk_size may exceed it) or a dense call's
 * kv_len. A graph-captured run keeps the build chosen at capture. KVA_PREFILL_TURNS=0 / 1 forces either build (tests,
 * comparisons; checked at context creation). */
#define KVA__HP_TURNS_MAX_KEYS 1024
static const void *hopper_fn(const kva__prefill_choice *k, const kva__prefill_args *a, int64_t keys_per_item) {
    /* (Where the layout has soft-capped builds, KVA__HP_CAP_BUILT, fn_cap: a soft-capped call
     * takes them, which must not run uncapped calls nor the other builds capped ones; elsewhere
     * the one build reads the cap at run time. The kernels read the cap flushing subnormals to
     * zero, so a cap whose log2 is subnormal counts as none here too.) */
    const bool capped = k->fn_cap && a->cap_log2 >= FLT_MIN;
    const void *turns_fn = capped ? k->fn_cap : k->fn;
    const void *no_turns_fn = capped ? k->fn_cap_no_turns : k->fn_no_turns;
    if (!no_turns_fn) return turns_fn;
    const char *env = getenv("KVA_PREFILL_TURNS");
    if (env && *env) return strcmp(env, "0") == 0 ? no_turns_fn : turns_fn;
    const bool turns = a->decode_records || (a->causal && keys_per_item <= KVA__HP_TURNS_MAX_KEYS);
    return turns ? turns_fn : no_turns_fn;
}

/* Launches the chosen kernel. The Hopper kernel gets tensor maps of K and V; where a map
 * cannot describe them (a pointer or stride not a multiple of 16 bytes) the call runs the wgmma
 * kernel of the same tile instead -- or fails, under KVA_PREFILL_TMA_STRICT=1 (the device tests
 * use it so that a silent fallback cannot pass for the Hopper path). */
static kva_status launch_prefill(kva_context *ctx, const char *call, kva_dtype dt, int head_dim,
                                 const kva__prefill_choice *k, int64_t grid_x, int heads, kva__prefill_args *a,
                                 const kva_kv_pages *pages, const kva_variant *variant, int64_t keys_per_item) {
    if (!k->tma) return launch(ctx, k, grid_x, heads, a);
    kva__hopper_prefill_args h; /* cudaLaunchKernel copies it: a stack object will do */
    memset(&h, 0, sizeof h);
    h.a = *a;
    bool ok;
    if (pages) {
        int box = 1;
        while (box < k->block_n && pages->page_size % (box * 2) == 0) box *= 2;
        h.box_rows = box;
        ok = paged_map(&h.k_map, dt, pages->k_data, pages, box) && paged_map(&h.v_map, dt, pages->v_data, pages, box);
    } else {
        h.box_rows = k->block_n;
        ok = ragged_map(&h.k_map, dt, a->k, a->k_st, a->k_sh, a->num_kv_heads, head_dim, k->block_n) &&
             ragged_map(&h.v_map, dt, a->v, a->v_st, a->v_sh, a->num_kv_heads, head_dim, k->block_n);
    }
    if (ok) {
        /* Q and O by tensor copies where a map describes them (else the kernel's own copies) */
        const int g = a->group;
        if (k->rows % g == 0 && qo_map(&h.q_map, dt, a->q, a->q_st, a->q_sh, a->num_qo_heads, head_dim, g, k->rows / g))
            h.qo_maps |= 1;
        if (a->o && 64 % g == 0 &&
            qo_map(&h.o_map, dt, a->o, a->o_st, a->o_sh, a->num_qo_heads, head_dim, g, 64 / g))
            h.qo_maps |= 2;
        /* persistent: one block per SM walks (KV head, work item) pairs; KVA_PREFILL_PERSISTENT=0
         * launches one block per pair instead (comparisons), =N at most N blocks (tests: small
         * batches then still walk several items per block, through the cross-item tail) */
        const int64_t pairs = grid_x * heads;
        if (pairs == 0) return KVA_OK;
        if (pairs > 0x7fffffff)
            return kva__fail(KVA_ERR_BAD_SHAPE, "%s on CUDA: %lld work items x %d KV heads exceed the grid", call,
                             (long long)grid_x, heads);
        const char *pers = getenv("KVA_PREFILL_PERSISTENT");
        int64_t blocks = ctx->num_sms > 0 ? ctx->num_sms : 1;
        const long cap = pers ? strtol(pers, NULL, 10) : 0;
        if (cap > 0 && blocks > cap) blocks = cap;
        if ((pers && strcmp(pers, "0") == 0) || blocks > pairs) blocks = pairs;
        kva__prefill_choice kt = *k;
        kt.fn = hopper_fn(k, a, keys_per_item);
        return launch(ctx, &kt, blocks, 1, &h);
    }
    const char *strict = getenv("KVA_PREFILL_TMA_STRICT");
    if (strict && strcmp(strict, "1") == 0)
        return kva__fail(KVA_ERR_UNSUPPORTED, "%s on CUDA: K/V pointers or strides a tensor map cannot describe "
                         "(KVA_PREFILL_TMA_STRICT=1)", call);
    kva__prefill_choice w;
    const kva__prefill_target wt = {KVA__PREFILL_WGMMA, 1 << 30};
    if (!kva__prefill_choose(dt, head_dim, KVA__PREFILL_ROWS_LARGE, &wt, &w) || w.rows != k->rows)
        return kva__fail(KVA_ERR_UNSUPPORTED, "%s on CUDA: no kernel for these K/V strides", call);
    if (variant && !(w.fn = kva__variant_prefill_fn(variant, dt, w.built_dim, KVA__VMOD_PF_HOPPER)))
        return kva__fail(KVA_ERR_UNSUPPORTED, "%s on CUDA: params.variant has no wgmma kernel for these K/V strides",
                         call);
    return launch(ctx, &w, grid_x, heads, a);
}

/* Paged K/V: the pool's pointers and strides, the plan's page ids, key -> page as a
 * multiply-shift. */
static void fill_pages(kva__prefill_args *a, const kva_kv_pages *pages, const int32_t *page_indices_dev) {
    a->k = pages->k_data;
    a->v = pages->v_data;
    a->k_st = a->v_st = pages->stride_token;
    a->k_sh = a->v_sh = pages->stride_head;
    a->page_stride = pages->stride_page;
    a->page_indices = page_indices_dev;
    a->page_size = pages->page_size;
    /* key / page_size as a multiply-shift (exact for keys < 2^31): the smallest l with
     * page_size <= 2^l, m = ceil(2^(31+l) / page_size) */
    int l = 0;
    while ((1ll << l) < (long long)pages->page_size) ++l;
    a->page_div_s = 31 + l;
    a->page_div_m = ((1ull << a->page_div_s) + (uint64_t)pages->page_size - 1) / (uint64_t)pages->page_size;
}

/* What a plan run passes the kernel, whatever the plan's kind: q, o and lse; paged K/V when
 * `pages` is given (ragged K/V are the caller's); the plan's records, page ids and partial-state
 * buffers in the workspace's device part (rows_per_work: num_qo_heads for a decode plan, its
 * partial rows); the work count, read from the device part under KVA_PLAN_GRAPH so that a
 * captured run replays after re-planning; the variant. The query tile and the record layout are
 * the caller's: they differ between prefill and decode plans. */
static void fill_plan_args(kva__prefill_args *a, const kva_plan *plan, const kva_attn_params *params, kva_tensor q,
                           const kva_kv_pages *pages, kva_tensor o, float *lse) {
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    unsigned char *dev = (unsigned char *)plan->workspace.device;
    const int32_t *ints_dev = kva__plan_ints(dev);
    const kva__plan_header *hdr_dev = (const kva__plan_header *)dev;
    memset(a, 0, sizeof *a);
    a->q = q.data;
    a->q_st = q.stride_token;
    a->q_sh = q.stride_head;
    a->o = o.data;
    a->o_st = o.stride_token;
    a->o_sh = o.stride_head;
    if (pages) fill_pages(a, pages, ints_dev + h->off_page_indices);
    a->lse = lse;
    a->records = (const int4 *)(ints_dev + h->off_unit_records);
    a->sched = (unsigned *)(dev + h->off_sched);
    a->sched_blocks = KVA__SCHED_MAX_BLOCKS;
    a->sched_ring = KVA__SCHED_RING;
    a->num_work_dev = &hdr_dev->num_work;
    a->num_work = (plan->flags & KVA_PLAN_GRAPH) ? -1 : plan->num_work;
    a->partial_o = (float *)(dev + h->off_partial_o);
    a->partial_lse = (float *)(dev + h->off_partial_lse);
    a->rows_per_work = h->rows_per_work;
    fill_variant(a, params);
}

/* The merge of split work items, when the plan may have split (a graph plan always launches it:
 * the kernel reads the split flag of the plan it replays with). */
static kva_status launch_merge(kva_context *ctx, const kva_plan *plan, const kva_attn_params *params, kva_dtype dt,
                               kva_tensor o, float *lse, const kva__prefill_args *a) {
    if (!plan->split_kv && !(plan->flags & KVA_PLAN_GRAPH)) return KVA_OK;
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    unsigned char *dev = (unsigned char *)plan->workspace.device;
    const kva__plan_header *hdr_dev = (const kva__plan_header *)dev;
    kva__prefill_merge_args m;
    m.o = o.data;
    m.o_st = o.stride_token;
    m.o_sh = o.stride_head;
    m.lse = lse;
    m.records = a->records;
    m.group_indptr = kva__plan_ints(dev) + h->off_group_indptr;
    m.num_groups_dev = &hdr_dev->num_groups;
    m.split_dev = &hdr_dev->split_kv;
    m.merge_groups_dev = &hdr_dev->merge_groups;
    m.partial_o = a->partial_o;
    m.partial_lse = a->partial_lse;
    m.rows_per_work = h->rows_per_work;
    m.num_qo_heads = params->num_qo_heads;
    m.head_dim = params->head_dim;
    m.qo_tile = plan->qo_tile_size;
    m.decode_records = a->decode_records;
    /* (a performance choice only: both kernels merge any plan, e.g. a graph's next one) */
    const bool wide = a->decode_records != 0 && h->num_work >= 8 * (int64_t)h->num_groups;
    const void *fn = kva__prefill_merge_kernel_for(dt, wide);
    void *args[] = {&m};
    /* wide: a block per row, as many as there are rows of one KV head's requests at most */
    const unsigned blocks = (unsigned)(ctx->num_sms > 0 ? ctx->num_sms : 1) * (wide ? 8 : 4);
    /* As the prefill kernel's programmatic dependent where the merge's code holds the wait
     * (merge_pdl: sm_90+ code on an sm_90+ device): placed as the prefill grid's blocks end
     * instead of after a launch gap, it waits in-kernel for the grid's writes */
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = kva__stream(ctx);
    const kva__cuda_private *priv = (const kva__cuda_private *)ctx->cuda_private;
    cfg.attrs = &attr;
    cfg.numAttrs = priv && priv->merge_pdl ? 1 : 0;
    KVA_CUDA_TRY(cudaLaunchKernelExC(&cfg, fn, args));
    return KVA_OK;
}

extern "C" kva_status kva__cuda_prefill_run(kva_context *ctx, const kva_plan *plan,
                                            const kva_attn_params *params, kva_tensor q, kva_tensor k,
                                            kva_tensor v, const kva_kv_pages *pages, kva_tensor o,
                                            float *lse) {
    const kva_dtype dt = q.dtype;
    const int g = params->num_qo_heads / params->num_kv_heads;
    const int rows = plan->qo_tile_size * g;
    kva__prefill_choice kern;
    const kva__prefill_target target = kva__cuda_prefill_target(ctx);
    if (!kva__prefill_choose(dt, params->head_dim, rows, &target, &kern) || kern.rows < rows)
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "prefill on CUDA: %s, head_dim %d, %d query rows per tile is not built",
                         kva_dtype_name(dt), params->head_dim, rows);
    KVA_TRY(use_variant(kva__api(), params, dt, &kern));
    KVA_TRY(kva__cuda_use_device(ctx));

    kva__prefill_args a;
    fill_plan_args(&a, plan, params, q, pages, o, lse);
    if (!pages) {
        a.k = k.data;
        a.v = v.data;
        a.k_st = k.stride_token;
        a.k_sh = k.stride_head;
        a.v_st = v.stride_token;
        a.v_sh = v.stride_head;
    }
    /* an empty tensor may have no data; the kernel uses k as a harmless zero-fill source */
    if (!a.k) a.k = a.q;
    if (!a.v) a.v = a.q;
    a.qo_tile = plan->qo_tile_size;

    KVA_TRY(launch_prefill(ctx, "prefill run", dt, params->head_dim, &kern, plan->padded_work,
                           params->num_kv_heads, &a, pages, params->variant, plan->kv_chunk_size));

    return launch_merge(ctx, plan, params, dt, o, lse, &a);
}

kva_status kva__cuda_decode_as_prefill(kva_context *ctx, const kva_plan *plan,
                                       const kva_attn_params *params, kva_tensor q,
                                       const kva_kv_pages *pages, kva_tensor o, float *lse) {
    const kva_dtype dt = pages->dtype;
    const int g = params->num_qo_heads / params->num_kv_heads;
    kva__prefill_choice kern;
    const kva__prefill_target target = kva__cuda_prefill_target(ctx);
    if (!kva__prefill_choose(dt, params->head_dim, KVA__PREFILL_ROWS_LARGE, &target, &kern) || !kern.tma ||
        kern.rows < g)
        return kva__fail(KVA_ERR_UNSUPPORTED, "kva_decode_run: no warp-specialised prefill kernel for %s, head_dim %d",
                         kva_dtype_name(dt), params->head_dim);
    KVA_TRY(use_variant("kva_decode_run", params, dt, &kern));
    KVA_TRY(kva__cuda_use_device(ctx));

    kva__prefill_args a;
    fill_plan_args(&a, plan, params, q, pages, o, lse);
    a.decode_records = 1;
    a.qo_tile = 1;
    a.causal = 0; /* the one query sits at the last key: nothing to mask */
    KVA_TRY(launch_prefill(ctx, "kva_decode_run", dt, params->head_dim, &kern, plan->padded_work,
                           params->num_kv_heads, &a, pages, params->variant, plan->kv_chunk_size));
    return launch_merge(ctx, plan, params, dt, o, lse, &a);
}

extern "C" kva_status kva__cuda_attention(kva_context *ctx, const kva_attn_params *params,
                                          int32_t qo_len, int32_t kv_len, kva_tensor q, kva_tensor k,
                                          kva_tensor v, kva_tensor o, float *lse) {
    if (qo_len == 0) return KVA_OK;
    const int g = params->num_qo_heads / params->num_kv_heads;
    /* The large tile when the sequence fills it, else the small one. */
    const int want = (int64_t)qo_len * g > KVA__PREFILL_ROWS_SMALL ? KVA__PREFILL_ROWS_LARGE
                                                                   : KVA__PREFILL_ROWS_SMALL;
    kva__prefill_choice kern;
    const kva__prefill_target target = kva__cuda_prefill_target(ctx);
    if (!kva__prefill_choose(q.dtype, params->head_dim, want, &target, &kern) || g > kern.rows)
        return kva__fail(KVA_ERR_UNSUPPORTED, "kva_attention on CUDA: %s, head_dim %d, GQA group %d is not built",
                         kva_dtype_name(q.dtype), params->head_dim, g);
    KVA_TRY(use_variant("kva_attention", params, q.dtype, &kern));
    KVA_TRY(kva__cuda_use_device(ctx));
    kva__prefill_args a;
    memset(&a, 0, sizeof a);
    a.q = q.data;
    a.q_st = q.stride_token;
    a.q_sh = q.stride_head;
    a.o = o.data;
    a.o_st = o.stride_token;
    a.o_sh = o.stride_head;
    a.k = k.data ? k.data : q.data;
    a.v = v.data ? v.data : q.data;
    a.k_st = k.stride_token;
    a.k_sh = k.stride_head;
    a.v_st = v.stride_token;
    a.v_sh = v.stride_head;
    a.lse = lse;
    a.records = NULL;
    a.qo_tile = kva__prefill_tile_tokens_for(kern.rows, g);
    a.dense_qo_len = qo_len;
    a.dense_kv_len = kv_len;
    const int64_t tiles = ((int64_t)qo_len + a.qo_tile - 1) / a.qo_tile;
    a.num_work = (int32_t)tiles;
    fill_variant(&a, params);
    return launch_prefill(ctx, "kva_attention", q.dtype, params->head_dim, &kern, tiles, params->num_kv_heads, &a,
                          NULL, params->variant, kv_len);
}
