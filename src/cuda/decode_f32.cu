/* decode_f32.cu -- f32 instantiations of the decode kernel (decode_kernel.cuh), one file per
 * element type so the builds run in parallel. */
#include "decode_kernel.cuh"

KVA__DECODE_INSTANTIATE(float, 64, kva__decode_f32_d64)
KVA__DECODE_INSTANTIATE(float, 128, kva__decode_f32_d128)
KVA__DECODE_INSTANTIATE(float, 256, kva__decode_f32_d256)
/* (whether these kernels wait for a programmatic primary: cuda_context.cu launches them as
 * dependents only if every decode file says so) */
int kva__decode_f32_pdl(void) { return KVA__DECODE_PDL; }
