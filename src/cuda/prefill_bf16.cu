/* prefill_bf16.cu -- bf16 instantiations of the tensor-core prefill kernel (prefill_kernel.cuh),
 * one file per element type so the builds run in parallel. */
#include "prefill_kernel.cuh"

KVA__PREFILL_INSTANTIATE(__nv_bfloat16, kva__prefill_bf16)
