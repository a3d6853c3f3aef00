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
     * dispatch, and the compiler vectorises the bit manipulations (4-9x the per-element switch). */
    const float *sf = (const float *)src;
    const uint16_t *sh = (const uint16_t *)src;
    float *df = (float *)dst;
    uint16_t *dh = (uint16_t *)dst;
    switch (src_dtype * 3 + dst_dtype) {
    case KVA_F32 * 3 + KVA_F16:
        for (size_t i = 0; i < n; ++i) dh[i] = kva__f32_to_f16(sf[i]);
        break;
    case KVA_F32 * 3 + KVA_BF16:
        for (size_t i = 0; i < n; ++i) dh[i] = kva__f32_to_bf16(sf[i]);
        break;
    case KVA_F16 * 3 + KVA_F32:
        for (size_t i = 0; i < n; ++i) df[i] = kva__f16_to_f32(sh[i]);
        break;
    case KVA_BF16 * 3 + KVA_F32:
        for (size_t i = 0; i < n; ++i) df[i] = kva__bf16_to_f32(sh[i]);
        break;
    case KVA_F16 * 3 + KVA_BF16:
        for (size_t i = 0; i < n; ++i) dh[i] = kva__f32_to_bf16(kva__f16_to_f32(sh[i]));
        break;
    default: /* KVA_BF16 -> KVA_F16 */
        for (size_t i = 0; i < n; ++i) dh[i] = kva__f32_to_f16(kva__bf16_to_f32(sh[i]));
        break;
    }
    return KVA_OK;
}
