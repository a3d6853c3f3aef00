/*
 * prefill_merge.cu -- combines the partial states of split prefill work items (seed 002's LSE
 * reduction, as kva_merge_states). A (request, query tile) group whose keys were cut into n > 1
 * chunks left n f32 states per row in the workspace; this kernel writes o (dtype) and lse.
 *
 * Rows are (group, token of the tile, query head), grid-stride with a fixed grid, reading the
 * group count and split flag from the workspace (a captured graph replays after re-planning).
 * Lanes own head_dim / 32 dims. Pass 1 finds the largest LSE, pass 2 sums exp(lse_s - max) * o_s.
 * Traffic: each partial state read once (from L2).
 * Rows of unsplit groups and tokens past the tile's end are skipped; only the plan's first
 * merge_groups groups are walked (all where the split search cut keys, 1 where the planner cut
 * one item for the last wave: src/plan/prefill_balance.h).
 */
#include "cuda_common.cuh"
#include "prefill_kernels.h"

#define KVA__PM_WARPS 8

/* Work split: narrow (WIDE = false, prefill plans: many rows of a few states each) -- one warp
 * per row; wide (decode plans: one row per query head, a long request split into up to ~100
 * chunks) -- one block per row, warp w taking states w, w + 8, ..., so that 8 warps' loads are in
 * flight at once instead of one warp walking every state; the warps' sums meet in shared memory. */
template <typename T, bool WIDE>
__global__ void __launch_bounds__(32 * KVA__PM_WARPS) kva__prefill_merge_kernel(const __grid_constant__ kva__prefill_merge_args a) {
    kva__pdl_wait(); /* (launched as the prefill kernel's dependent: its partial states) */
    if (!__ldg(a.split_dev)) return;
    const float LOG2E = 1.4426950408889634f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int Hq = a.num_qo_heads, D = a.head_dim;
    /* (only the leading groups that may be split: a plan with one cut item has its pieces in
     * group 0, and a walk over every row of every group cost ~70 us at 512 groups -- a warp per
     * row, each a dependent load of the group's range) */
    const int32_t ngroups = min(__ldg(a.num_groups_dev), __ldg(a.merge_groups_dev));
    const int64_t rows = (int64_t)ngroups * a.qo_tile * Hq;
    const int64_t step = WIDE ? (int64_t)gridDim.x : (int64_t)gridDim.x * KVA__PM_WARPS;
    const int s0 = WIDE ? warp : 0, ds = WIDE ? KVA__PM_WARPS : 1; /* my states: s0, s0 + ds, ... */
    __shared__ float red_m[KVA__PM_WARPS], red_sum[KVA__PM_WARPS];
    __shared__ float red_acc[WIDE ? KVA__PM_WARPS : 1][WIDE ? 256 : 1];
    for (int64_t r = WIDE ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * KVA__PM_WARPS + warp; r < rows; r += step) {
        const int grp = (int)(r / ((int64_t)a.qo_tile * Hq));
        const int rem = (int)(r - (int64_t)grp * a.qo_tile * Hq);
        const int t = rem / Hq, qh = rem - t * Hq;
        const int w0 = __ldg(a.group_indptr + grp), n = __ldg(a.group_indptr + grp + 1) - w0;
        if (n <= 1) continue; /* (uniform across a wide block: same row) */
        int64_t q_row;
        if (a.decode_records) { /* one query token, row = request (KVA__UR_REQUEST) */
            q_row = __ldg(a.records + 2 * w0).x;
        } else {
            const int4 r1 = __ldg(a.records + 2 * w0 + 1);
            if (t >= r1.z) continue; /* KVA__PR_Q_TOKENS */
            q_row = r1.y + t;        /* KVA__PR_Q_ROW0 */
        }
        const int64_t prow = (int64_t)w0 * a.rows_per_work + (int64_t)t * Hq + qh;
        const int64_t sstride = a.rows_per_work; /* between the group's consecutive work items */
        float mx = -INFINITY;
        for (int s = s0 + lane * ds; s < n; s += 32 * ds)
            mx = fmaxf(mx, __fmul_rn(__ldcg(a.partial_lse + prow + s * sstride), LOG2E));
#pragma unroll
        for (int sh = 16; sh >= 1; sh >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
        if (WIDE) {
            if (lane == 0) red_m[warp] = mx;
            __syncthreads();
#pragma unroll
            for (int w = 0; w < KVA__PM_WARPS; ++w) mx = fmaxf(mx, red_m[w]);
        }
        float acc[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
        float sum = 0.0f;
        /* Empty states weigh 0; a NaN state (a score out of f32 range) makes the row NaN, even
         * when every other state is empty (max ignores NaN, so mx may be -inf). */
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        /* (__fmul_rn: rounded as in the max, never fused into exp2's argument -- an unrounded
         * product differs from a huge max by more than exp2 can take; unrolled: several states'
         * loads in flight) */
#pragma unroll 4
        for (int s = s0; s < n; s += ds) {
            const float wgt = exp2f(__fmul_rn(__ldcg(a.partial_lse + prow + s * sstride), LOG2E) - m_use);
            sum += wgt;
            const float *src = a.partial_o + (prow + s * sstride) * D;
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (lane + 32 * e < D) acc[e] = fmaf(wgt, __ldcg(src + lane + 32 * e), acc[e]);
        }
        if (WIDE) { /* the warps' partial sums -> warp 0 */
            if (lane == 0) red_sum[warp] = sum;
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (lane + 32 * e < D) red_acc[warp][lane + 32 * e] = acc[e];
            __syncthreads();
            if (warp == 0) {
                sum = 0.0f;
                for (int w = 0; w < KVA__PM_WARPS; ++w) sum += red_sum[w];
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    float x = 0.0f;
                    if (lane + 32 * e < D)
                        for (int w = 0; w < KVA__PM_WARPS; ++w) x += red_acc[w][lane + 32 * e];
                    acc[e] = x;
                }
            }
            __syncthreads(); /* (red_* are reused by the block's next row) */
            if (warp != 0) continue;
        }
        const float inv = kva__softmax_inv(sum);
        T *dst = (T *)a.o + q_row * a.o_st + (int64_t)qh * a.o_sh;
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (lane + 32 * e < D) dst[lane + 32 * e] = kva__from_f32<T>(acc[e] * inv);
        if (a.lse && lane == 0) a.lse[q_row * Hq + qh] = kva__softmax_lse(m_use, sum);
    }
}

const void *kva__prefill_merge_kernel_for(kva_dtype dtype, bool wide) {
    switch (dtype) {
    case KVA_BF16: return wide ? (const void *)kva__prefill_merge_kernel<__nv_bfloat16, true>
                               : (const void *)kva__prefill_merge_kernel<__nv_bfloat16, false>;
    case KVA_F16: return wide ? (const void *)kva__prefill_merge_kernel<__half, true>
                              : (const void *)kva__prefill_merge_kernel<__half, false>;
    case KVA_F32: return wide ? (const void *)kva__prefill_merge_kernel<float, true>
                              : (const void *)kva__prefill_merge_kernel<float, false>;
    default: return NULL;
    }
}
