/*
 * variant_alibi.cuh -- the built-in ALiBi variant (kva_variant_create_alibi): a linear bias by
 * distance, one slope per query head (Press et al., "Train Short, Test Long"). Caller data:
 * f32 slopes[num_qo_heads] in device memory (kva_alibi_slopes). Embedded in the library and
 * compiled like any caller's source; kva_variant_alibi_source() returns this text.
 */
/* (float)kv_pos - (float)q_pos is the exact distance (positions < 2^24) and lets the compiler
 * convert each key's and each query's position once per tile instead of once per score: an
 * int-to-float conversion runs at a quarter of the FMA rate, so per score this is one FADD and
 * one FFMA. */
float kva_alibi(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user) {
    const float *slopes = (const float *)user;
    return score + slopes[qo_head] * ((float)kv_pos - (float)q_pos);
}
