/* decode_bf16.cu -- bf16 instantiations of the decode kernel (decode_kernel.cuh), one file per
 * element type so the builds run in parallel. */
#include "decode_kernel.cuh"

KVA__DECODE_INSTANTIATE(__nv_bfloat16, 64, kva__decode_bf16_d64)
KVA__DECODE_INSTANTIATE(__nv_bfloat16, 128, kva__decode_bf16_d128)
KVA__DECODE_INSTANTIATE(__nv_bfloat16, 256, kva__decode_bf16_d256)
/* (whether these kernels wait for a programmatic primary: cuda_context.cu launches them as
 * dependents only if every decode file says so) */
int kva__decode_bf16_pdl(void) { return KVA__DECODE_PDL; }
