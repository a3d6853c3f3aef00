/* validate.h -- argument checks shared by every attention entry point (src/api). */
#ifndef KVA_VALIDATE_H
#define KVA_VALIDATE_H

#include "../common/internal.h"

/* Checks heads, head_dim support on ctx's device, and variants the device can run. */
kva_status kva__check_params(const kva_context *ctx, const kva_attn_params *params);
/* Checks that ctx's device runs this head_dim; `what` names the argument ("limits.head_dim"). */
kva_status kva__check_head_dim(const kva_context *ctx, const char *what, int32_t head_dim);
/* Checks a tensor view of tokens x heads x head_dim: dtype, 16-byte alignment of data and
 * strides, and strides whose offsets cannot overflow. `what` names it. */
kva_status kva__check_tensor(const char *what, kva_tensor t, kva_dtype dtype, int64_t tokens,
                             int32_t heads, int32_t head_dim);
/* Checks that p (may be NULL) is aligned to `align` bytes, the size of the elements the kernels
 * load and store through it (f32 LSE arrays: 4). `what` names it. */
kva_status kva__check_aligned(const char *what, const void *p, size_t align);
/* kva__check_tensor for an output, and its (token, head) rows may not share elements (threads
 * writing different rows would race and one result would be lost). */
kva_status kva__check_output(const char *what, kva_tensor t, kva_dtype dtype, int64_t tokens,
                             int32_t heads, int32_t head_dim);
/* Checks a page pool against params and the plan's page size / pool size (and, as for tensors,
 * strides whose offsets cannot overflow). */
kva_status kva__check_pages(const kva_kv_pages *pages, const kva_attn_params *params,
                            int32_t page_size, int32_t min_num_pages);
/* Checks that a plan is one of ours, of the given kind, for these params. */
kva_status kva__check_plan(const kva_plan *plan, int kind, const kva_attn_params *params);

#endif
