/* dtype.c -- dtype facts and host conversion. */
#include "dtype_convert.h"
#include "internal.h"

#include <string.h>

size_t kva_dtype_size(kva_dtype dtype) {
    switch (dtype) {
    case KVA_F32: return 4;
    case KVA_F16: return 2;
    case KVA_BF16: return 2;
    }
    return 0;
}

const char *kva_dtype_name(kva_dtype dtype) {
    switch (dtype) {
    case KVA_F32: return "f32";
    case KVA_F16: return "f16";
    case KVA_BF16: return "bf16";
    }
    return "?";
}

/* kva_convert's loop over n elements of `src` (typed pointer) into `dst`, in blocks through a
 * local buffer of the destination type. */
#define CONVERT_BLOCKS(src, dst, n, DST_T, conv)                                           \
    do {                                                                                    \
        enum { BLOCK = 512 };                                                               \
        DST_T tmp_[BLOCK];                                                                  \
        for (size_t b_ = 0; b_ < (n); b_ += BLOCK) {                                        \
            const size_t m_ = (n) - b_ < BLOCK ? (n) - b_ : BLOCK;                          \
            for (size_t i_ = 0; i_ < m_; ++i_) tmp_[i_] = conv((src)[b_ + i_]);             \
            memcpy((DST_T *)(dst) + b_, tmp_, m_ * sizeof(DST_T));                          \
        }                                                                                   \
    } while (0)

static inline uint16_t f16_to_bf16(uint16_t h) { return kva__f32_to_bf16(kva__f16_to_f32(h)); }
static inline uint16_t bf16_to_f16(uint16_t h) { return kva__f32_to_f16(kva__bf16_to_f32(h)); }

kva_status kva_convert(const void *src, kva_dtype src_dtype, void *dst, kva_dtype dst_dtype,
                       size_t n) {
    /* (unknown dtypes are refused even for no elements: a caller's bug, whatever the count) */
    if (!kva__dtype_valid(src_dtype) || !kva__dtype_valid(dst_dtype))
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_convert: unknown dtype (%d -> %d)",
                         (int)src_dtype, (int)dst_dtype);
    if (n == 0) return KVA_OK;
    KVA_CHECK_NULL(src);
    KVA_CHECK_NULL(dst);
    /* elements are loaded and stored as float / uint16_t: natural alignment */
    if ((uintptr_t)src % kva_dtype_size(src_dtype) != 0 ||
        (uintptr_t)dst % kva_dtype_size(dst_dtype) != 0)
        return kva__fail(KVA_ERR_BAD_SHAPE,
                         "kva_convert: src (%p) and dst (%p) must be aligned to their elements "
                         "(%zu and %zu bytes)",
                         src, dst, kva_dtype_size(src_dtype), kva_dtype_size(dst_dtype));
    if (src_dtype == dst_dtype) {
        memmove(dst, src, n * kva_dtype_size(src_dtype));
        return KVA_OK;
    }
    /* One loop per pair of dtypes, the conversions inlined with constant dtypes: no per-element
     * dispatch, and the compiler vectorises the bit manipulations (2-8x the per-element switch).
     * Each block is converted into a local buffer, then copied out: the loop's loads and stores
     * cannot alias, and narrowing in place (dst == src) is safe by construction -- a block's
     * output lands on source elements that this or an earlier block already read. */
    const float *sf = (const float *)src;
    const uint16_t *sh = (const uint16_t *)src;
    switch (src_dtype * 3 + dst_dtype) {
    case KVA_F32 * 3 + KVA_F16: CONVERT_BLOCKS(sf, dst, n, uint16_t, kva__f32_to_f16); break;
    case KVA_F32 * 3 + KVA_BF16: CONVERT_BLOCKS(sf, dst, n, uint16_t, kva__f32_to_bf16); break;
    case KVA_F16 * 3 + KVA_F32: CONVERT_BLOCKS(sh, dst, n, float, kva__f16_to_f32); break;
    case KVA_BF16 * 3 + KVA_F32: CONVERT_BLOCKS(sh, dst, n, float, kva__bf16_to_f32); break;
    case KVA_F16 * 3 + KVA_BF16: CONVERT_BLOCKS(sh, dst, n, uint16_t, f16_to_bf16); break;
    default: CONVERT_BLOCKS(sh, dst, n, uint16_t, bf16_to_f16); break; /* KVA_BF16 -> KVA_F16 */
    }
    return KVA_OK;
}

#undef CONVERT_BLOCKS
