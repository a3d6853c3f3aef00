/* prefill_hopper_f16.cu -- f16 instantiations of the warp-specialised Hopper prefill kernel
 * (prefill_hopper.cuh), in their own file so the builds run in parallel. */
#include "prefill_hopper.cuh"

KVA__PREFILL_HOPPER_INSTANTIATE(__half, kva__prefill_hopper_f16)
