/*
 * variant_sources.h -- the example attention variants (examples/variants.c, tests/test_cuda_variant.c),
 * each written once: KVA_EX_DEFINE_* expands to a C function, and KVA_EX_SOURCE(...) turns the
 * same text into the CUDA C source handed to kva_variant_create. So the GPU variant and the CPU
 * score_mod callback (the float64 reference's modifier in the tests) are one piece of code:
 *
 *     KVA_EX_DEFINE_DOC_MASK(doc_mask_cpu, void)                 C callback: kva_score_mod_fn
 *     kva_variant_create(ctx, KVA_EX_SOURCE_DOC_MASK, "doc_mask", ...)   the same on the GPU
 *
 * Caller data (score_mod_user): a host pointer for the callback, a device copy for the variant.
 * The function bodies use only integer and float arithmetic, kva_tanhf (the prelude's tanh: the
 * built-in soft cap's in each kernel; tanhf here on the CPU) and kva_masked() (-INFINITY), so both
 * sides compute the same scores (to the 16-bit kernels' tolerance).
 */
#ifndef KVA_EXAMPLE_VARIANT_SOURCES_H
#define KVA_EXAMPLE_VARIANT_SOURCES_H

#include <math.h>
#include <stdint.h>

#define KVA_EX_STR_(...) #__VA_ARGS__
#define KVA_EX_STR(...) KVA_EX_STR_(__VA_ARGS__)

/* ---- T5-style bucketed relative bias (Raffel et al., 2020) ----------------------------------
 * The distance q_pos - kv_pos (>= 0 under a causal mask; negative distances share bucket 0) maps
 * to one of 32 buckets through a table the caller fills (exact below 16, logarithmic up to 128:
 * kva_ex_t5_buckets), and each (query head, bucket) has a learned bias. Caller data:
 * int32 bucket_of[128] followed by f32 bias[num_qo_heads][32]. (The source text is stringified,
 * so its sizes are literals: 128 distances, 32 buckets.) */
#define KVA_EX_T5_BUCKETS 32
#define KVA_EX_T5_MAX_DISTANCE 128
#define KVA_EX_T5_BODY(NAME, CONST)                                                            \
    float NAME(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, CONST void *user) {  \
        const int32_t *bucket_of = (const int32_t *)user;                                       \
        const float *bias = (const float *)user + 128;                                          \
        int32_t d = q_pos - kv_pos;                                                             \
        if (d < 0) d = 0;                                                                       \
        const int32_t b = d < 128 ? bucket_of[d] : 31;                                          \
        return score + bias[qo_head * 32 + b];                                                  \
    }
#define KVA_EX_DEFINE_T5(NAME, CONST) KVA_EX_T5_BODY(NAME, CONST)
#define KVA_EX_SOURCE_T5 KVA_EX_STR(KVA_EX_T5_BODY(t5_bias, const))

/* T5's bucketing (relative_attention_bidirectional = false): distances below half the buckets
 * are exact, the rest logarithmic up to the max distance. Computed once on the host, so the
 * device never evaluates a logarithm whose rounding could differ from the CPU's. */
static inline void kva_ex_t5_buckets(int32_t *bucket_of) {
    const int32_t exact = KVA_EX_T5_BUCKETS / 2;
    for (int32_t d = 0; d < KVA_EX_T5_MAX_DISTANCE; ++d) {
        if (d < exact) {
            bucket_of[d] = d;
        } else {
            int32_t b = exact + (int32_t)(log((double)d / exact) / log((double)KVA_EX_T5_MAX_DISTANCE / exact) *
                                          (KVA_EX_T5_BUCKETS - exact));
            bucket_of[d] = b < KVA_EX_T5_BUCKETS - 1 ? b : KVA_EX_T5_BUCKETS - 1;
        }
    }
}

/* ---- document mask ----------------------------------------------------------------------------
 * Several documents packed into one sequence: a query sees only keys of its own document.
 * Caller data: int32 doc_id[position] covering every position of the sequence. */
#define KVA_EX_DOC_MASK_BODY(NAME, CONST)                                                      \
    float NAME(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, CONST void *user) {  \
        const int32_t *doc = (const int32_t *)user;                                             \
        (void)qo_head;                                                                          \
        return doc[kv_pos] == doc[q_pos] ? score : kva_masked();                                \
    }
#define KVA_EX_DEFINE_DOC_MASK(NAME, CONST) KVA_EX_DOC_MASK_BODY(NAME, CONST)
#define KVA_EX_SOURCE_DOC_MASK KVA_EX_STR(KVA_EX_DOC_MASK_BODY(doc_mask, const))

/* ---- soft cap as a snippet --------------------------------------------------------------------
 * cap * tanh(score / cap) (Gemma 2), the built-in kva_attn_params.logits_soft_cap written as a
 * modifier: the cap is caller data (one float), to compare the snippet with the built-in path. */
#define KVA_EX_SOFTCAP_BODY(NAME, CONST)                                                       \
    float NAME(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, CONST void *user) {  \
        const float cap = *(const float *)user;                                                 \
        (void)q_pos;                                                                            \
        (void)kv_pos;                                                                           \
        (void)qo_head;                                                                          \
        return cap * kva_tanhf(score * (1.0f / cap));                                           \
    }
#define KVA_EX_DEFINE_SOFTCAP(NAME, CONST) KVA_EX_SOFTCAP_BODY(NAME, CONST)
/* (a tanh per score: heavy enough that the Hopper prefill's ping-pong turns pay; kvattn.h) */
#define KVA_EX_SOURCE_SOFTCAP "#define KVA_VARIANT_PINGPONG 1\n" KVA_EX_STR(KVA_EX_SOFTCAP_BODY(softcap, const))

/* ---- ALiBi --------------------------------------------------------------------------------------
 * Built in (kva_variant_create_alibi, src/cuda/variant_alibi.cuh: caller data f32
 * slopes[num_qo_heads]); its CPU twin (the same value: the built-in converts the distance with
 * kva_int_to_float, exact below 2^22): */
#define KVA_EX_ALIBI_BODY(NAME, CONST)                                                         \
    float NAME(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, CONST void *user) {  \
        const float *slopes = (const float *)user;                                              \
        return score + slopes[qo_head] * (float)(kv_pos - q_pos);                               \
    }
#define KVA_EX_DEFINE_ALIBI(NAME, CONST) KVA_EX_ALIBI_BODY(NAME, CONST)

/* The prelude's kva_tanhf and kva_masked, for the CPU side of the same text. (The text is
 * macro-expanded before it is stringified, so it names no macro such as INFINITY.) */
static inline float kva_tanhf(float x) { return tanhf(x); }
static inline float kva_masked(void) { return -INFINITY; }

#endif /* KVA_EXAMPLE_VARIANT_SOURCES_H */
