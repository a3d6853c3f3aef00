/* dtype.c -- dtype facts and host conversion. */
#include "dtype_convert.h"
#include "internal.h"

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
    for (size_t i = 0; i < n; ++i)
        kva__store_f32(dst, dst_dtype, (int64_t)i, kva__load_f32(src, src_dtype, (int64_t)i));
    return KVA_OK;
}
