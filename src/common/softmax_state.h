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

#define KVA_LOG2E 1.4426950408889634f
#define KVA_LN2 0.6931471805599453f

/* Natural-log LSE of a state in log2 units; -inf when empty. */
static inline float kva__state_lse(float m_log2, float d) {
    if (d <= 0.0f || m_log2 == -INFINITY) return -INFINITY;
    return (m_log2 + log2f(d)) * KVA_LN2;
}

/* Weight exp(lse_a - lse_b) that is safe when both are -inf (gives 0). */
static inline float kva__lse_weight(float lse_part, float lse_total) {
    if (lse_part == -INFINITY) return 0.0f;
    return expf(lse_part - lse_total);
}

#endif /* KVA_SOFTMAX_STATE_H */
