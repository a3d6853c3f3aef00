/*
 * prefill_f32.cu -- prefill for f32 inputs on CUDA cores, so f32 stays f32 (tensor cores would
 * round it to tf32). Same work items, masks, outputs and partial states as the tensor-core
 * kernel (prefill_kernel.cuh); correctness first, f32 prefill is not the fast path.
 *
 * Work split: grid = (work items, KV heads), 4 warps. The work item's packed rows (token,
 * group head) are taken 32 at a time (8 rows per warp); for each pass the block streams the
 * visible keys in tiles of 32 through shared memory (padded rows: conflict-free float4 reads).
 * For each of its rows a warp computes 32 scores at once (lane = key), updates the online
 * softmax with warp reductions, and accumulates O with each lane owning head_dim / 32 dims.
 * Traffic: K and V once per 32-row pass (they stay in L2 across passes).
 */
#include "prefill_kernel.cuh"

template <int D>
struct kva__pf32_geom {
    static constexpr int ROWS = 32; /* packed rows per pass, 8 per warp */
    static constexpr int BN = 32;   /* keys per tile */
    static constexpr int KROW = D + 4; /* padded floats per Q / K row */
    static constexpr int SMEM = (ROWS * KROW + BN * KROW + BN * D) * 4;
};

template <int D>
__global__ void __launch_bounds__(KVA__PREFILL_THREADS)
    kva__prefill_f32_kernel(const __grid_constant__ kva__prefill_args a) {
    using G = kva__pf32_geom<D>;
    constexpr int BN = G::BN, KROW = G::KROW, VPL = D / 32, C4 = D / 4;
    extern __shared__ __align__(128) unsigned char smem[];
    float *q_s = reinterpret_cast<float *>(smem);
    float *k_s = q_s + G::ROWS * KROW;
    float *v_s = k_s + BN * KROW;
    kva__pdl_trigger(); /* (the merge kernel may take its place as blocks end) */

    kva__pf_item it;
    if (!kva__pf_load_item(a, blockIdx.x, it)) return;
    const int kh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = a.group, rows = it.q_tokens * g, Hq = a.num_qo_heads;
    const bool split = it.key_beg > 0 || it.key_end < it.kv_len;
    int lo = it.key_beg, hi = it.key_end;
    const int q_last = it.q_pos0 + it.q_tokens - 1;
    if (a.causal && hi > q_last + 1) hi = q_last + 1;
    if (a.window_left >= 0 && (int64_t)lo < (int64_t)it.q_pos0 - a.window_left) lo = it.q_pos0 - a.window_left;
    const float *kb = (const float *)a.k + (int64_t)kh * a.k_sh;
    const float *vb = (const float *)a.v + (int64_t)kh * a.v_sh;

    for (int r0 = 0; r0 < rows; r0 += G::ROWS) {
        __syncthreads(); /* the previous pass is done with q_s */
        for (int i = tid; i < G::ROWS * C4; i += KVA__PREFILL_THREADS) {
            const int r = i / C4, c = i % C4, R = r0 + r;
            const bool ok = R < rows && 4 * c < a.head_dim; /* (zeros past the head dim) */
            const int t = ok ? R / g : 0, hh = ok ? R - t * g : 0;
            const float *src = (const float *)a.q + (int64_t)(it.q_row0 + t) * a.q_st + (int64_t)(kh * g + hh) * a.q_sh + 4 * c;
            kva__pf_cp16(kva__smem_addr(q_s + r * KROW + 4 * c), ok ? (const void *)src : a.q, ok);
        }
        kva__cp_async_commit();

        float o[8][VPL], m[8], l[8];
#pragma unroll
        for (int rr = 0; rr < 8; ++rr) {
            m[rr] = -INFINITY;
            l[rr] = 0.0f;
#pragma unroll
            for (int e = 0; e < VPL; ++e) o[rr][e] = 0.0f;
        }
        for (int key0 = lo; key0 < hi; key0 += BN) {
            __syncthreads(); /* every warp is done with the previous tile */
            for (int i = tid; i < BN * C4; i += KVA__PREFILL_THREADS) {
                const int r = i / C4, c = i % C4, key = key0 + r;
                const bool ok = key < hi && 4 * c < a.head_dim;
                int64_t ko = 0, vo = 0;
                if (ok) {
                    if (a.page_indices) {
                        const int pg = key / a.page_size, slot = key - pg * a.page_size;
                        const int64_t base = (int64_t)__ldg(a.page_indices + it.kv_beg + pg) * a.page_stride;
                        ko = base + (int64_t)slot * a.k_st;
                        vo = base + (int64_t)slot * a.v_st;
                    } else {
                        ko = (int64_t)(it.kv_beg + key) * a.k_st;
                        vo = (int64_t)(it.kv_beg + key) * a.v_st;
                    }
                }
                kva__pf_cp16(kva__smem_addr(k_s + r * KROW + 4 * c), ok ? (const void *)(kb + ko + 4 * c) : a.k, ok);
                kva__pf_cp16(kva__smem_addr(v_s + r * D + 4 * c), ok ? (const void *)(vb + vo + 4 * c) : a.k, ok);
            }
            kva__cp_async_commit();
            kva__cp_async_wait<0>();
            __syncthreads();

            const int key = key0 + lane;
#pragma unroll
            for (int rr = 0; rr < 8; ++rr) {
                const int R = r0 + warp * 8 + rr;
                if (R >= rows) break; /* warp-uniform */
                const float *qr = q_s + (warp * 8 + rr) * KROW, *kr = k_s + lane * KROW;
                float dot = 0.0f;
#pragma unroll 8
                for (int c = 0; c < C4; ++c) {
                    const float4 x = *reinterpret_cast<const float4 *>(qr + 4 * c);
                    const float4 y = *reinterpret_cast<const float4 *>(kr + 4 * c);
                    dot = fmaf(x.x, y.x, fmaf(x.y, y.y, fmaf(x.z, y.z, fmaf(x.w, y.w, dot))));
                }
                /* out of f32 range: NaN, carried into the row (kvattn.h, kva_attn_params); an
                 * overflowed dot product under a soft cap is the cap, as in the reference.
                 * __fmul_rn: rounded like the max, never fused into exp2(x - max). */
                float x = a.cap_log2 > 0.0f ? a.cap_log2 * kva__tanh_accurate(dot * a.cap_inv_scale)
                                            : __fmul_rn(dot, a.scale_log2);
                if (x == -INFINITY) x = NAN;
                const int p = it.q_pos0 + R / g;
                if (key >= hi || (a.causal && key > p) || (a.window_left >= 0 && (int64_t)key < (int64_t)p - a.window_left)) x = -INFINITY;
                if constexpr (KVA__HAS_SCORE_MOD) { /* a variant's modifier on visible keys, natural-log units */
                    if (x != -INFINITY) {
                        const float s = KVA_SCORE_MOD(x * KVA__PF_LN2, p, key, kh * g + R % g, a.mod_user);
                        x = __fmul_rn(s, KVA__PF_LOG2E);
                        if (x == -INFINITY && s != -INFINITY) x = NAN;
                    }
                }
                float mx = x;
#pragma unroll
                for (int sh = 16; sh >= 1; sh >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
                const float m_new = fmaxf(m[rr], mx);
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                const float alpha = exp2f(m[rr] - m_use);
                const float pr = exp2f(x - m_use);
                float sum = pr;
#pragma unroll
                for (int sh = 16; sh >= 1; sh >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, sh);
                l[rr] = l[rr] * alpha + sum;
                m[rr] = m_new;
#pragma unroll
                for (int e = 0; e < VPL; ++e) o[rr][e] *= alpha;
                for (int jj = 0; jj < BN; ++jj) {
                    const float pj = __shfl_sync(0xffffffffu, pr, jj);
                    const float *vr = v_s + jj * D + lane * VPL;
#pragma unroll
                    for (int e = 0; e < VPL; ++e) o[rr][e] = fmaf(pj, vr[e], o[rr][e]);
                }
            }
        }
        kva__cp_async_wait<0>();

#pragma unroll
        for (int rr = 0; rr < 8; ++rr) {
            const int R = r0 + warp * 8 + rr;
            if (R >= rows) break;
            const int t = R / g, qh = kh * g + (R - t * g);
            const float inv = kva__softmax_inv(l[rr]);
            const float lse = kva__softmax_lse(m[rr], l[rr]);
            float *dst;
            if (!split) {
                dst = (float *)a.o + (int64_t)(it.q_row0 + t) * a.o_st + (int64_t)qh * a.o_sh;
                if (a.lse && lane == 0) a.lse[(int64_t)(it.q_row0 + t) * Hq + qh] = lse;
            } else {
                const int64_t prow = (int64_t)it.w * a.rows_per_work + (int64_t)t * Hq + qh;
                dst = a.partial_o + prow * a.head_dim;
                if (lane == 0) a.partial_lse[prow] = lse;
            }
#pragma unroll
            for (int e = 0; e < VPL; ++e)
                if (lane * VPL + e < a.head_dim) dst[lane * VPL + e] = o[rr][e] * inv;
        }
    }
}

#ifndef __CUDACC_RTC__ /* a variant's NVRTC build takes the kernel by name */
const void *kva__prefill_f32(int head_dim, int rows, int *smem, int *threads) {
    (void)rows; /* one kernel serves any row count: it takes rows 32 at a time */
    *threads = KVA__PREFILL_THREADS;
    switch (head_dim) {
    case 64: *smem = kva__pf32_geom<64>::SMEM; return (const void *)kva__prefill_f32_kernel<64>;
    case 128: *smem = kva__pf32_geom<128>::SMEM; return (const void *)kva__prefill_f32_kernel<128>;
    case 256: *smem = kva__pf32_geom<256>::SMEM; return (const void *)kva__prefill_f32_kernel<256>;
    default: return NULL;
    }
}
#endif
