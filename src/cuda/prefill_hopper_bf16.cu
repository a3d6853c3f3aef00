/* prefill_hopper_bf16.cu -- bf16 instantiations of the warp-specialised Hopper prefill kernel
 * (prefill_hopper.cuh), in their own file so the builds run in parallel. */
#include "prefill_hopper.cuh"

KVA__PREFILL_HOPPER_INSTANTIATE(__nv_bfloat16, kva__prefill_hopper_bf16)
