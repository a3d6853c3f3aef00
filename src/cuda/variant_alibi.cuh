/*
 * variant_alibi.cuh -- the built-in ALiBi variant (kva_variant_create_alibi): a linear bias by
 * distance, one slope per query head (Press et al., "Train Short, Test Long"). Caller data:
 * f32 slopes[num_qo_heads] in device memory (kva_alibi_slopes). Embedded in the library and
 * compiled like any caller's source; kva_variant_alibi_source() returns this text.
 */
/* The distance through kva_int_to_float (the prelude): exact for |kv_pos - q_pos| < 2^22 (4M
 * tokens), and per score one IADD, one FADD and one FFMA on the full-rate pipes instead of an
 * int-to-float conversion at a quarter rate (NVVM folds (float)k - (float)q into one conversion of
 * k - q per score, so writing it that way does not help). */
/* (tells the kernels that the modifier is exactly this, with these caller data: when the variant's
 * function is kva_alibi itself, the Hopper prefill and the decode kernel fold the bias into their
 * own arithmetic; the other prefill kernels call kva_alibi) */
#define KVA_VARIANT_ALIBI_SLOPES 1
float kva_alibi(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user) {
    const float *slopes = (const float *)user;
    return score + slopes[qo_head] * kva_int_to_float(kv_pos - q_pos);
}
