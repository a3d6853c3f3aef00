/*
 * decode_merge.cuh -- the split-KV merges of the decode kernel's epilogue (decode_kernel.cuh,
 * which includes this file after its geometry and helpers): kva__merge_states (the last block of
 * a split request, or one level of the merge tree) and the shared merge (kva__merge_slice,
 * kva__merge_shared: the request's chunk blocks merge it together).
 */
#ifndef KVA_DECODE_MERGE_CUH
#define KVA_DECODE_MERGE_CUH

/* Folds one partial state (its LSE ls in log2 units, its normalised O x) into a running state
 * (M, L, acc), both rescaled to the larger max (0 where both are empty, so that -inf - -inf never
 * makes a NaN; a NaN propagates). */
__device__ __forceinline__ void kva__fold_state(float &M, float &L, float4 &acc, float ls, float4 x) {
    const float m_new = fmaxf(M, ls);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float scale = exp2f(M - m_use), f = exp2f(ls - m_use);
    acc.x = acc.x * scale + f * x.x;
    acc.y = acc.y * scale + f * x.y;
    acc.z = acc.z * scale + f * x.z;
    acc.w = acc.w * scale + f * x.w;
    L = L * scale + f;
    M = m_new;
}

/* Merges `count` partial states of query heads hb2 .. hb2 + gs2 - 1, at work-item slots first,
 * first + stride, ... (O in partial_o, LSE in lse_src): into o and lse (dst_slot < 0), or into
 * slot dst_slot as one normalised state (a merge-tree run, read again by the level above): O in
 * place into partial_o (each O column is read and written by one thread), LSE into run_lse
 * (never an input of the same merge, so no thread can read a value another already replaced).
 * The block's threads split the gs2 x head_dim columns. With the ring idle (no next unit in
 * flight) the states are staged through it by cp.async, as many per batch as fit (one L2 round
 * trip per batch); otherwise they are read straight from L2, MB per round trip. Empty rows give
 * 0 / -inf, NaN propagates. */
template <typename T, int D, int NT>
__device__ __forceinline__ void kva__merge_states(const kva__decode_args &a, unsigned char *ring, int tid,
                                                  bool has_next, int hb2, int gs2, int b, int first, int count,
                                                  int stride, const float *lse_src, int dst_slot) {
    using G = kva__decode_geom<T, D, NT>;
    constexpr int GM = G::GM;
    const int Hq = a.num_qo_heads, dh = a.head_dim;
    const bool to_slot = dst_slot >= 0;
    if (!has_next) {
        constexpr int EPT = (GM * D / 4 + KVA__DECODE_THREADS - 1) / KVA__DECODE_THREADS; /* float4 columns per thread */
        const int gd = gs2 * dh;
        const int batch_cap = (G::SMEM - G::RING_OFF) / (gd * 4 + gs2 * 4);
        float *st_o = reinterpret_cast<float *>(ring);
        float *st_l = st_o + (size_t)batch_cap * gd;
        float Mx[EPT], Lx[EPT];
        float4 acc[EPT];
#pragma unroll
        for (int e = 0; e < EPT; ++e) {
            Mx[e] = -INFINITY;
            Lx[e] = 0.0f;
            acc[e] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        for (int s0 = 0; s0 < count; s0 += batch_cap) {
            const int nb = count - s0 < batch_cap ? count - s0 : batch_cap;
            for (int i = tid; i < nb * (gd / 4); i += KVA__DECODE_THREADS) {
                const int st = i / (gd / 4), e = i - st * (gd / 4);
                const int64_t slot = first + (int64_t)(s0 + st) * stride;
                const float *src = a.partial_o + (slot * Hq + hb2) * dh + e * 4;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(kva__smem_addr(st_o + (size_t)st * gd + e * 4)),
                             "l"(src)
                             : "memory");
            }
            kva__cp_async_commit();
            for (int i = tid; i < nb * gs2; i += KVA__DECODE_THREADS) {
                const int st = i / gs2, h = i - st * gs2;
                const int64_t slot = first + (int64_t)(s0 + st) * stride;
                st_l[i] = __fmul_rn(__ldcg(lse_src + slot * Hq + hb2 + h), KVA__LOG2E_F);
            }
            kva__cp_async_wait<0>();
            __syncthreads();
#pragma unroll
            for (int e = 0; e < EPT; ++e) {
                const int i = tid + e * KVA__DECODE_THREADS;
                if (i < gd / 4) {
                    const int h = (i * 4) / dh;
                    for (int st = 0; st < nb; ++st) {
                        const float ls = st_l[st * gs2 + h];
                        const float4 x = *reinterpret_cast<const float4 *>(st_o + (size_t)st * gd + i * 4);
                        kva__fold_state(Mx[e], Lx[e], acc[e], ls, x);
                    }
                }
            }
            __syncthreads(); /* the batch buffer is refilled next */
        }
#pragma unroll
        for (int e = 0; e < EPT; ++e) {
            const int i = tid + e * KVA__DECODE_THREADS;
            if (i < gd / 4) {
                const int h = (i * 4) / dh, d = (i * 4) % dh, qh = hb2 + h;
                const float inv = kva__softmax_inv(Lx[e]);
                float4 o4 = acc[e];
                o4.x *= inv; o4.y *= inv; o4.z *= inv; o4.w *= inv;
                if (to_slot) {
                    *reinterpret_cast<float4 *>(a.partial_o + ((int64_t)dst_slot * Hq + qh) * dh + d) = o4;
                    if (d == 0) a.run_lse[(int64_t)dst_slot * Hq + qh] = kva__softmax_lse(Mx[e], Lx[e]);
                } else {
                    kva__store4<T>((T *)a.o + (int64_t)b * a.o_st + (int64_t)qh * a.o_sh + d, o4);
                    if (a.lse && d == 0) a.lse[(int64_t)b * Hq + qh] = kva__softmax_lse(Mx[e], Lx[e]);
                }
            }
        }
    } else {
        const int E4s = gs2 * dh / 4;
        for (int i = tid; i < E4s; i += KVA__DECODE_THREADS) {
            const int h = (i * 4) / dh, d = (i * 4) % dh, qh = hb2 + h;
            float M = -INFINITY, L = 0.0f;
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
            /* States in batches of MB whose loads are all issued before any is used. */
            constexpr int MB = 8;
            for (int s0 = 0; s0 < count; s0 += MB) {
                float ls[MB];
                float4 x[MB];
#pragma unroll
                for (int j = 0; j < MB; ++j) {
                    const int k = s0 + j < count ? s0 + j : count - 1;
                    const int64_t slot = first + (int64_t)k * stride;
                    ls[j] = __fmul_rn(__ldcg(lse_src + slot * Hq + qh), KVA__LOG2E_F);
                    x[j] = __ldcg(reinterpret_cast<const float4 *>(a.partial_o + (slot * Hq + qh) * dh + d));
                    if (s0 + j >= count) ls[j] = -INFINITY;
                }
#pragma unroll
                for (int j = 0; j < MB; ++j) kva__fold_state(M, L, acc, ls[j], x[j]);
            }
            const float inv = kva__softmax_inv(L);
            acc.x *= inv; acc.y *= inv; acc.z *= inv; acc.w *= inv;
            if (to_slot) {
                *reinterpret_cast<float4 *>(a.partial_o + ((int64_t)dst_slot * Hq + qh) * dh + d) = acc;
                if (d == 0) a.run_lse[(int64_t)dst_slot * Hq + qh] = kva__softmax_lse(M, L);
            } else {
                kva__store4<T>((T *)a.o + (int64_t)b * a.o_st + (int64_t)qh * a.o_sh + d, acc);
                if (a.lse && d == 0) a.lse[(int64_t)b * Hq + qh] = kva__softmax_lse(M, L);
            }
        }
    }
}

/* ---- the shared merge: a split request's chunk blocks merge its states together ----
 * Where every chunk unit of a (request, KV head, sub-group) is its block's last unit (the block has
 * nothing else to do), the blocks that arrive early do not leave: they wait for the last chunk and
 * then each merges a slice of the outputs, so a merge of many states (64 chunks x 8 heads: 256 KB
 * of partial states) is spread over many SMs' L2 bandwidth instead of one block's or a two-level
 * tree's (bench/NOTES.md, "The shared decode merge"). A slice is one query head's 64 output columns
 * (16 float4). The arrival counter holds arrivals (low 16 bits) and withdrawals (high 16 bits): a
 * block that has seen no new arrival for a.merge_wait_ns withdraws (only while chunks are still
 * missing, by compare-and-swap), so the wait cannot deadlock where not every block of the grid is
 * resident at once (a GPU shared with other work), and there it costs one such pause per stall
 * (e.g. per extra round of blocks); once all have arrived, the participants are the n - withdrawals
 * that did not withdraw, the same set for all. Without withdrawals participant t (arrival order)
 * merges slices t, t + n, ...; otherwise slices are claimed from a counter. The last participant to
 * depart resets the three counters (graph replays start from zero): without withdrawals each
 * departs before its slices (KVA__MERGE_EARLY_DEPARTURE), with them after its last claim. Where
 * the shared merge is used: a.shared_merge_min (decode_kernels.h). */
#define KVA__SLICE_COLS 16 /* float4 output columns of a merge slice */

__device__ __forceinline__ unsigned kva__ld_acquire_u32(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
/* atom.add.acq_rel.gpu: a release of the block's earlier writes (through the barrier before it)
 * and an acquire for its later reads in one -- on sm_90 MEMBAR.ALL.GPU, the atomic and an L1
 * invalidation, where __threadfence() on either side is a MEMBAR.SC.GPU each (a sequentially
 * consistent fence, which no counter here needs). The merges' arrivals and the claim path's
 * departures. */
__device__ __forceinline__ unsigned kva__atom_add_acq_rel(unsigned *p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
/* A strong (relaxed, gpu-scope) store: the resets of the shared merge's words, which other
 * blocks' strong reads of the same launch must not race with (kva__merge_shared). */
__device__ __forceinline__ void kva__st_relaxed_u32(unsigned *p, unsigned v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t kva__globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Merges slice `slice` (query head hb + slice / parts, float4 columns (slice % parts) * 16 ..)
 * of the n states at work items first .. first + n - 1 into o and lse. The block's 128 threads
 * are 16 columns x 8 state groups (group g merges states g, g + 8, ..., all its loads issued
 * before they are used), then group 0 combines the 8 partial states through shared memory
 * (`scratch`, 3 KB of the ring, idle: the block has no next unit). */
template <typename T>
__device__ __forceinline__ void kva__merge_slice(const kva__decode_args &a, float *scratch, int tid, int hb,
                                                 int b, int first, int n, int slice) {
    constexpr int GROUPS = KVA__DECODE_THREADS / KVA__SLICE_COLS, MB = 8;
    const int Hq = a.num_qo_heads, dh = a.head_dim, c4 = dh / 4;
    const int parts = (c4 + KVA__SLICE_COLS - 1) / KVA__SLICE_COLS;
    const int h = slice / parts, col = (slice - h * parts) * KVA__SLICE_COLS + (tid % KVA__SLICE_COLS);
    const int grp = tid / KVA__SLICE_COLS, qh = hb + h, d = col * 4;
    float M = -INFINITY, L = 0.0f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (col < c4) {
        for (int s0 = grp; s0 < n; s0 += GROUPS * MB) {
            float ls[MB];
            float4 x[MB];
#pragma unroll
            for (int j = 0; j < MB; ++j) {
                const int k = s0 + GROUPS * j < n ? s0 + GROUPS * j : s0;
                const int64_t slot = first + k;
                ls[j] = __fmul_rn(__ldcg(a.partial_lse + slot * Hq + qh), KVA__LOG2E_F);
                x[j] = __ldcg(reinterpret_cast<const float4 *>(a.partial_o + (slot * Hq + qh) * dh + d));
                if (s0 + GROUPS * j >= n) ls[j] = -INFINITY;
            }
#pragma unroll
            for (int j = 0; j < MB; ++j) kva__fold_state(M, L, acc, ls[j], x[j]);
        }
    }
    float *sm = scratch, *sl = scratch + KVA__DECODE_THREADS;
    float4 *sa = reinterpret_cast<float4 *>(scratch + 2 * KVA__DECODE_THREADS);
    sm[tid] = M;
    sl[tid] = L;
    sa[tid] = acc;
    __syncthreads();
    if (grp == 0 && col < c4) {
        float Mt = -INFINITY;
#pragma unroll
        for (int g = 0; g < GROUPS; ++g) Mt = fmaxf(Mt, sm[tid + g * KVA__SLICE_COLS]);
        const float m_use = Mt == -INFINITY ? 0.0f : Mt;
        float Lt = 0.0f;
        float4 o4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int g = 0; g < GROUPS; ++g) {
            const int i = tid + g * KVA__SLICE_COLS;
            const float f = exp2f(sm[i] - m_use);
            const float4 y = sa[i];
            o4.x += f * y.x; o4.y += f * y.y; o4.z += f * y.z; o4.w += f * y.w;
            Lt += f * sl[i];
        }
        const float inv = kva__softmax_inv(Lt);
        o4.x *= inv; o4.y *= inv; o4.z *= inv; o4.w *= inv;
        kva__store4<T>((T *)a.o + (int64_t)b * a.o_st + (int64_t)qh * a.o_sh + d, o4);
        if (a.lse && d == 0) a.lse[(int64_t)b * Hq + qh] = kva__softmax_lse(Mt, Lt);
    }
    __syncthreads(); /* scratch is rewritten by the next slice */
}

/* The shared merge of one chunk block (see above): arrive, wait for the others (or withdraw),
 * merge this participant's slices. counter / claims / departures: the request's three words,
 * zero between runs. ctl: two ints of the block's shared memory. */
template <typename T>
__device__ __forceinline__ void kva__merge_shared(const kva__decode_args &a, unsigned char *ring, int tid, int hb,
                                                  int gs, int b, int first, int n, unsigned *counter,
                                                  unsigned *claims, unsigned *departures, int *ctl) {
    __syncthreads(); /* the partial-state stores happen before thread 0's release */
    if (tid == 0) {
        const unsigned prev = kva__atom_add_acq_rel(counter, 1u);
        unsigned all = prev + 1u;
        int ticket = (int)(prev & 0xffffu);
        if ((int)(all & 0xffffu) < n) {
            /* wait for the last chunk; withdraw once no chunk has arrived for merge_wait_ns
             * while chunks are missing (>=: a wait of 0 withdraws at the first look, whatever
             * the timer's resolution) */
            uint64_t t0 = kva__globaltimer();
            unsigned seen = all & 0xffffu;
            for (;;) {
                all = kva__ld_acquire_u32(counter);
                if ((int)(all & 0xffffu) == n) break;
                const uint64_t now = kva__globaltimer();
                if ((all & 0xffffu) != seen) {
                    seen = all & 0xffffu; /* progress: the pause starts again */
                    t0 = now;
                } else if (now - t0 >= (uint64_t)a.merge_wait_ns && atomicCAS(counter, all, all + 0x10000u) == all) {
                    ticket = -1;
                    if (a.merge_withdrawals) atomicAdd(a.merge_withdrawals, 1u);
                    break;
                }
                __nanosleep(32);
            }
        }
        /* (no fence before the other chunks' states are read: the last arrival's add is an
         * acquire, a waiter's last look an acquire load) */
        const int withdrawn = (int)(all >> 16);
        ctl[0] = ticket < 0 ? -1 : (withdrawn == 0 ? ticket : n); /* n: claim slices */
        ctl[1] = n - withdrawn;                                     /* participants */
    }
    __syncthreads();
    const int role = ctl[0], participants = ctl[1];
    if (role < 0) return; /* withdrew: the participants merge without this block */
    float *scratch = reinterpret_cast<float *>(ring);
    const int parts = (a.head_dim / 4 + KVA__SLICE_COLS - 1) / KVA__SLICE_COLS, slices = gs * parts;
    if (role < n) {
#if KVA__MERGE_EARLY_DEPARTURE
        /* No block withdrew, so none claims: every participant has seen all arrivals and reads
         * none of the three words again, and it departs before its slices -- the atomic's round
         * trip under them, not after (the last one out resets the words meanwhile). No fence:
         * the departures before the last one's reach its reset through its own (an RMW chain,
         * then program order); the others' last reads of the counter are not ordered before
         * the reset by causality, but each returned the n arrivals and only then let its block
         * depart, so a read returning the reset would have to precede the departure that
         * allowed it (a cycle PTX's no-thin-air axiom rules out), and the resets are strong
         * stores, so they do not race with those strong reads (bench/NOTES.md, "The shared
         * merge's claim path tested") */
        unsigned departed = 0u;
        if (tid == 0) departed = atomicAdd(departures, 1u);
        for (int s = role; s < slices; s += n) kva__merge_slice<T>(a, scratch, tid, hb, b, first, n, s);
        if (tid == 0 && departed == (unsigned)(participants - 1)) {
            kva__st_relaxed_u32(counter, 0u);
            kva__st_relaxed_u32(claims, 0u);
            kva__st_relaxed_u32(departures, 0u);
        }
        return;
#else
        for (int s = role; s < slices; s += n) kva__merge_slice<T>(a, scratch, tid, hb, b, first, n, s);
#endif
    } else {
        for (;;) {
            __syncthreads(); /* every thread has read ctl[0] of the last claim */
            if (tid == 0) ctl[0] = (int)atomicAdd(claims, 1u);
            __syncthreads();
            const int s = ctl[0];
            if (s >= slices) break;
            kva__merge_slice<T>(a, scratch, tid, hb, b, first, n, s);
        }
    }
    /* (claims were made -- there were withdrawals: the departure's release orders this block's
     * claims before it, its acquire the last one's resets after every departure, as no claim may
     * reach the claim counter after its reset; bench/NOTES.md, "Shared-merge review fixes") */
    if (tid == 0 && kva__atom_add_acq_rel(departures, 1u) == (unsigned)(participants - 1)) {
        /* every participant has seen all arrivals and made its last claim; no block reads these
         * words again in this launch (withdrawn ones left before the last arrival) */
        kva__st_relaxed_u32(counter, 0u);
        kva__st_relaxed_u32(claims, 0u);
        kva__st_relaxed_u32(departures, 0u);
    }
}

#endif /* KVA_DECODE_MERGE_CUH */
