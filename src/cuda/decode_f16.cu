/* decode_f16.cu -- f16 instantiations of the decode kernel (decode_kernel.cuh), one file per
 * element type so the builds run in parallel. */
#include "decode_kernel.cuh"

KVA__DECODE_INSTANTIATE(__half, 64, kva__decode_f16_d64)
KVA__DECODE_INSTANTIATE(__half, 128, kva__decode_f16_d128)
KVA__DECODE_INSTANTIATE(__half, 256, kva__decode_f16_d256)
