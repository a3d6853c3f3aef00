/*
 * decode_kernels.h -- what the decode launcher (decode_launch.cu) needs from the kernel
 * instantiation files: the kernel argument block and one lookup per (element type, head dim).
 * C++ only (included by .cu files).
 */
#ifndef KVA_CUDA_DECODE_KERNELS_H
#define KVA_CUDA_DECODE_KERNELS_H

#include <stdint.h>
#include "kvattn.h"
#include "../plan/workspace_layout.h"
#include "../common/div_magic.h"

/* Warps per decode block; each streams its own key tiles. */
#define KVA__DECODE_WARPS 4
#define KVA__DECODE_THREADS (32 * KVA__DECODE_WARPS)
/* The shared merge's participants depart (the atomic that finds the last one out, who resets the
 * request's words) before merging their slices where no block withdrew, so its round trip runs
 * under them (1; 0: after them, as the withdrawal path does -- for A/B runs). */
#ifndef KVA__MERGE_EARLY_DEPARTURE
#define KVA__MERGE_EARLY_DEPARTURE 1
#endif
#ifndef KVA__SHARED_MERGE_MIN
/* chunks of a request from which the decode kernel's shared merge is used (decode_merge.cuh):
 * below 16 the last block's merge is cheaper (few states, one round trip) than the others' wait
 * and their slices (bench/NOTES.md, "The shared decode merge": from 2 chunks it cost 8 x 4096
 * +3.5..+6%) */
#define KVA__SHARED_MERGE_MIN 16
#endif

/* Everything a decode kernel reads that is fixed for a workspace and a layer (so a captured
 * graph may bake it in). Whatever changes between plans is read from hdr / ints on the device. */
typedef struct kva__decode_args {
    const void *q;
    int64_t q_st, q_sh;          /* elements */
    void *o;
    int64_t o_st, o_sh;
    const void *k, *v;
    int64_t p_sp, p_st, p_sh;    /* page, token, head strides of the pool (elements) */
    float *lse;                  /* NULL or [batch][num_qo_heads] */
    const kva__plan_header *hdr; /* device part: header */
    const int32_t *ints;         /* device part: int section */
    int64_t off_request, off_kv_tile, off_group_indptr, off_kv_indptr, off_page_indices,
        off_kv_len;              /* int32 offsets into ints (fixed by the workspace's limits) */
    const int4 *records;         /* device part: unit records, 2 int4 per work item (workspace_layout.h) */
    int32_t num_work;            /* >= 0: the plan's work items (non-graph plans); -1: read hdr
                                  * (graph plans: a replay must see the current plan's count) */
    int32_t max_units;           /* padded_work * units_per_work: units that exist (>= grid) */
    float *partial_o;            /* f32 [work][num_qo_heads][D] */
    float *partial_lse;          /* f32 [work][num_qo_heads] */
    unsigned *counters;          /* u32 [batch][num_kv_heads][nsub], zero between runs */
    unsigned *run_counters;      /* u32 [work][num_kv_heads][nsub]: merge-tree runs (by first item);
                                  * the shared merge's claim and departure words (the request's
                                  * first and second item's rows) */
    float *run_lse;              /* f32 [work][num_qo_heads]: a merged run's LSE (by first item) */
    int32_t num_qo_heads, num_kv_heads, group, page_size, window_left;
    kva__div_magic page_div;     /* page_size as a multiplier: a key's page is kva__div_by(pos, .) */
    int32_t head_dim;            /* the real head dim (<= the kernel's D; the rest is zero-filled) */
    int32_t row_dim;             /* dims of the K/V row a unit copies per key: head_dim, or 2 x
                                  * head_dim where a unit holds two adjacent KV heads (pair_group) */
    int32_t pair_group;          /* 0: one KV head per unit. g > 0: a unit holds KV heads 2k and 2k+1
                                  * (NHD pool, adjacent rows: one row of 2 x head_dim), as a group of
                                  * 2g query heads whose first g see dims [0, head_dim) of that
                                  * row (q zero elsewhere) and the last g dims [head_dim, 2 head_dim)
                                  * (kva__decode_pair_for) */
    int32_t sub, nsub;           /* query heads per unit (<= 8 * NT) and units per (work item, KV
                                  * head): a GQA group of more than 16 heads is served in nsub
                                  * sub-groups of sub heads (the last may hold fewer) */
    int32_t units_per_work;      /* num_kv_heads * nsub */
    int32_t pass;                /* global-rowmax kernels: 1 = row max of each chunk, 2 = exp
                                  * against the request's max and plain-sum merge; 0 otherwise */
    float scale_log2;            /* sm_scale * log2(e), used without a soft cap */
    float cap_log2;              /* soft cap * log2(e), or 0 for none */
    float cap_inv_scale;         /* sm_scale / soft cap */
    const void *mod_user;         /* a variant's caller data (kva_attn_params.score_mod_user, device
                                   * memory); read only by kernels built with a score modifier */
    uint32_t merge_wait_ns;       /* the shared merge's pause without a new chunk arriving
                                   * before a block withdraws (decode_merge.cuh;
                                   * KVA_DECODE_MERGE_WAIT_NS) */
    int32_t shared_merge_min;     /* chunks of a request from which the shared merge is used
                                   * (KVA__SHARED_MERGE_MIN; above 0xffff: never,
                                   * KVA_DECODE_SHARED_MERGE=0) */
    unsigned *merge_withdrawals;  /* the context's count of shared-merge withdrawals (device
                                   * memory; tests read it back: kva__cuda_decode_merge_withdrawals),
                                   * or NULL */
} kva__decode_args;

/* Kernel for up to 8 (nt = 1) or 16 (nt = 2) query heads per unit, partial rowmax (gr = 0) or
 * global rowmax (gr = 1), and the dynamic shared memory it needs. */
const void *kva__decode_bf16_d64(int nt, int gr);
const void *kva__decode_bf16_d128(int nt, int gr);
const void *kva__decode_bf16_d256(int nt, int gr);
const void *kva__decode_f16_d64(int nt, int gr);
const void *kva__decode_f16_d128(int nt, int gr);
const void *kva__decode_f16_d256(int nt, int gr);
const void *kva__decode_f32_d64(int nt, int gr);
const void *kva__decode_f32_d128(int nt, int gr);
const void *kva__decode_f32_d256(int nt, int gr);
int kva__decode_bf16_d64_smem(int nt);
int kva__decode_bf16_d128_smem(int nt);
int kva__decode_bf16_d256_smem(int nt);
int kva__decode_f16_d64_smem(int nt);
int kva__decode_f16_d128_smem(int nt);
int kva__decode_f16_d256_smem(int nt);
int kva__decode_f32_d64_smem(int nt);
int kva__decode_f32_d128_smem(int nt);
int kva__decode_f32_d256_smem(int nt);
/* KVA__DECODE_PDL as each decode file was compiled (1: its kernels hold kva__pdl_wait). */
int kva__decode_bf16_pdl(void);
int kva__decode_f16_pdl(void);
int kva__decode_f32_pdl(void);

/* What the kernel chooser decided for one (dtype, head dim, GQA group, algorithm). */
typedef struct kva__decode_choice {
    const void *fn;     /* the kernel */
    int smem;           /* its dynamic shared memory */
    int blocks_per_sm;  /* blocks of it one SM of the context's device holds at once */
    int built_dim;      /* the D it was built for (>= head_dim; the rest is zero-filled) */
    int nt;             /* 8-head N tiles per unit (1 or 2) */
    int sub, nsub;      /* query heads per unit, units per (work item, KV head) */
    int via_prefill;    /* 1: the group is too large for one decode unit and the device has the
                         * warp-specialised prefill kernel, whose 128-row tile holds the whole
                         * group: run the decode plan on it (kva__cuda_decode_as_prefill), so each
                         * chunk's K/V is read once instead of once per sub-group. fn is still
                         * the sub-group kernel (a variant without that prefill build uses it). */
} kva__decode_choice;

/* Two adjacent KV heads per unit (kva__decode_args.pair_group) where one head's K/V row is not a
 * whole number of 128-byte lines but two heads' rows are (f16 / bf16 d32 and d96; NHD pools,
 * whose heads of a token are adjacent): a unit then reads whole lines, not lines shared with the
 * unit of the next head, on another block at another time. The pair runs on the kernel
 * kva__decode_kernel_for picks for 2 x head_dim and a group of 2 x group; true and that choice
 * where the run takes it. Only for plans that split no request (`split` = kva_plan.split_kv = 0;
 * a graph keeps the choice of the plan it was captured with) unless KVA_DECODE_PAIR_HEADS=1, never
 * under =0: H200, bf16 (bench/NOTES.md, "Paired KV heads"), unsplit Phi-3 32/32 d96 64 x 4096
 * 774 -> 746 us and 8 x 4096 98.0 -> 96.4, 32/8 d32 64 x 4096 83.5 -> 68.6, while the d96 split
 * plans measured were level or slower (Phi-3 1 x 8192 +0.25..+0.47, 32/8 d96 8 x 4096 +0.8..+1.3
 * us; one d32 split row was 0.4 us faster); not f32, whose CUDA-core path computes every dim of
 * every query row, so a pair took 1.7-2x the time; and only groups of <= 4, whose pair (<= 8
 * query rows) stays in the one 8-row N tile each of its two units used -- a pair of 8 takes two
 * N tiles of a twice as wide row, twice the tensor work of its two units (d64 32/4 64 x 4096
 * paired: 70 -> 93 us). The unpaired kernel serves every shape either way, so "supported?" does
 * not depend on it. A pair's scores sum over both heads' dims with the other head's q zero, so a
 * non-finite K element of one head (Inf, NaN) makes its partner's scores NaN too (kvattn.h). */
bool kva__decode_pair_for(const kva_context *ctx, kva_dtype dtype, int head_dim, int group, int num_kv_heads,
                          int64_t stride_head, int split, int gr, kva__decode_choice *pair);

/* THE decode kernel chooser: the launch (decode_launch.cu), the "supported?" answer of limits
 * and params validation (kva__cuda_decode_supported) and the split policy all ask it, so they
 * never disagree. Head dims: any multiple of 16 in 32..256 runs on the next built D (64, 128,
 * 256) with predicated loads and stores; groups: any, in sub-groups of <= 16 heads. Returns
 * false (choice untouched) when no kernel serves the shape. ctx may be NULL (occupancy 1). */
bool kva__decode_kernel_for(const kva_context *ctx, kva_dtype dtype, int head_dim, int group, int gr,
                            kva__decode_choice *choice);

/* A partial-rowmax decode plan run on the warp-specialised prefill kernel (prefill_launch.cu):
 * one query token per request, the plan's chunks as work items, then the prefill merge. */
kva_status kva__cuda_decode_as_prefill(kva_context *ctx, const kva_plan *plan, const kva_attn_params *params,
                                       kva_tensor q, const kva_kv_pages *pages, kva_tensor o, float *lse);

#endif /* KVA_CUDA_DECODE_KERNELS_H */
