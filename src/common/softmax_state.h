/*
 * softmax_state.h -- the online-softmax state (m, d) and its merge, the one numerical primitive
 * shared by every CPU kernel and the merge of split-KV partial results (seed 004's state_t).
 *
 * We keep scores in log2 units (s * log2(e)) so the hot loops use exp2; lse in natural log
 * is (m + log2(d)) / log2(e). An empty state has m = -inf, d = 0.
 */
#ifndef KVA_SOFTMAX_STATE_H
#define KVA_SOFTMAX_STATE_H

#include <math.h>
#include <stdint.h>

#define KVA_LOG2E 1.4426950408889634f
#define KVA_LN2 0.6931471805599453f

/* Natural-log LSE of a state in log2 units; -inf when empty. */
static inline float kva__state_lse(float m_log2, float d) {
    if (m_log2 != m_log2 || d != d) return NAN; /* an overflowed row stays visibly wrong */
    if (d <= 0.0f || m_log2 == -INFINITY) return -INFINITY;
    return (m_log2 + log2f(d)) * KVA_LN2;
}

/* Weight exp(lse_a - lse_b) that is safe when both are -inf (gives 0). */
static inline float kva__lse_weight(float lse_part, float lse_total) {
    if (lse_part == -INFINITY) return 0.0f;
    return expf(lse_part - lse_total);
}

/* Factor exp2(m_old - m_new) that rescales a running state when its max (log2 units) grows
 * from m_old to m_new >= m_old: 0 for an empty state (m_old = -inf), 1 while both are -inf. */
static inline float kva__rescale_log2(float m_old, float m_new) {
    if (m_old == m_new) return 1.0f;
    if (m_old == -INFINITY) return 0.0f;
    return exp2f(m_old - m_new);
}

/* LSE of a union of n disjoint states, log(sum_i exp(lse[i * stride])): the normaliser of the
 * merged state. -inf when every state is empty (or n == 0); NaN if any state is NaN;
 * max-subtracted, so no overflow. */
static inline float kva__lse_combine(const float *lse, int64_t stride, int32_t n) {
    float m = -INFINITY;
    for (int32_t i = 0; i < n; ++i) {
        if (lse[i * stride] != lse[i * stride]) return NAN; /* NaN (overflowed state) propagates */
        if (lse[i * stride] > m) m = lse[i * stride];
    }
    if (m == -INFINITY) return -INFINITY;
    float sum = 0.0f;
    for (int32_t i = 0; i < n; ++i) {
        float x = lse[i * stride];
        if (x != -INFINITY) sum += expf(x - m);
    }
    return m + logf(sum);
}

/* Merging states (v_i, lse_i) -- each v_i normalised over its own keys -- is
 *     lse = kva__lse_combine(lse_i),   v = sum_i kva__lse_weight(lse_i, lse) * v_i,
 * where states with weight 0 (lse_i = -inf) must be skipped rather than multiplied, so that
 * whatever an empty state holds never turns into NaN. A row whose states are all empty gets
 * v = 0, lse = -inf. */

#endif /* KVA_SOFTMAX_STATE_H */
