/* prefill_f16.cu -- f16 instantiations of the tensor-core prefill kernel (prefill_kernel.cuh),
 * one file per element type so the builds run in parallel. */
#include "prefill_kernel.cuh"

KVA__PREFILL_INSTANTIATE(__half, kva__prefill_f16)
