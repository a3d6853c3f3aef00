/* decode_f32.cu -- f32 instantiations of the decode kernel (decode_kernel.cuh), one file per
 * element type so the builds run in parallel. */
#include "decode_kernel.cuh"

KVA__DECODE_INSTANTIATE(float, 64, kva__decode_f32_d64)
KVA__DECODE_INSTANTIATE(float, 128, kva__decode_f32_d128)
KVA__DECODE_INSTANTIATE(float, 256, kva__decode_f32_d256)
