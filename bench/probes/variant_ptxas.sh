#!/usr/bin/env bash
# variant_ptxas.sh -- ptxas's registers and spills of a variant's prefill or decode kernel, without a GPU:
# the NVRTC program variant_compile.c builds (the library's defines, the prelude, the modifier,
# the kernel header), compiled with nvcc for sm_90a instead; ptxas's performance advisories too
# ("C7511 ... wgmma ... serialized": the wgmma pipeline serialised, bench/NOTES.md v6.40). For comparing a kernel change's
# effect on variant builds (bench/NOTES.md, 2026-11-29: the unconditional modifier).
# The defines below copy variant_compile.c's program head (compile_module) by hand, the fast tanh
# for prefill modules only as there: keep them in step.
# Usage: bench/probes/variant_ptxas.sh [softcap|identity|alibi] [hopper|hopper-turns|wgmma|mma|decode] [64|128|256] [tree]
# (decode: the module's one-N-tile decode kernel, partial rowmax -- KVA__VMOD_DECODE's first slot)
# (tree: a source tree with src/ and include/, default this one; e.g. a `git worktree` of a base)
# PROBE_T=f16 compiles the f16 instantiation (default bf16); PROBE_SMEM_RECORDS=1 as the library
# built with -DKVA__HP_SMEM_RECORDS=1; PROBE_LANE_RECORDS=1 with lane records (variant builds
# never take them: variant_compile.c; the library's own kernels do by default).
set -euo pipefail
mod=${1:-softcap}; kern=${2:-hopper}; D=${3:-128}; tree=${4:-$(cd "$(dirname "$0")/../.." && pwd)}
T=__nv_bfloat16; [ "${PROBE_T:-bf16}" = f16 ] && T=__half # (PROBE_T=f16: the f16 kernel)
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
case $mod in
  softcap)  fn=softcap; extra='#define KVA_VARIANT_PINGPONG 1'
            body='__device__ float softcap(float score, int32_t q, int32_t k, int32_t h, const void *user) {
    const float cap = *(const float *)user; (void)q; (void)k; (void)h;
    return cap * kva_tanhf(score * (1.0f / cap)); }' ;;
  identity) fn=identity; extra=''
            body='__device__ float identity(float s, int32_t q, int32_t k, int32_t h, const void *u) {
    (void)q; (void)k; (void)h; (void)u; return s; }' ;;
  alibi)    fn=kva_alibi; extra='#define KVA__FN_IS_KVA_ALIBI 1'
            body=$(sed 's/^float kva_alibi/__device__ float kva_alibi/' "$tree/src/cuda/variant_alibi.cuh") ;;
  *) echo "modifier: softcap, identity or alibi" >&2; exit 2 ;;
esac
warps=8; [ "$D" = 64 ] && warps=12
case $kern in
  hopper) hdr=prefill_hopper.cuh; inst="template __global__ void kva__prefill_hopper_kernel<$T, $D>(const __grid_constant__ kva__hopper_prefill_args);" ;;
  hopper-turns) # (a d128 module's second TMA build, with the consumers' turns: KVA__VMOD_PF_TMA_TURNS)
          hdr=prefill_hopper.cuh; inst="template __global__ void kva__prefill_hopper_kernel<$T, $D, $D, 1>(const __grid_constant__ kva__hopper_prefill_args);" ;;
  wgmma)  hdr=prefill_kernel.cuh; inst="template __global__ void kva__prefill_kernel<$T, $D, 1, $warps, 64, true>(const __grid_constant__ kva__prefill_args);" ;;
  mma)    mt=2; w=4; [ "$D" = 256 ] && { mt=1; w=8; }
          hdr=prefill_kernel.cuh; inst="template __global__ void kva__prefill_kernel<$T, $D, $mt, $w, 64, false>(const __grid_constant__ kva__prefill_args);" ;;
  decode) hdr=decode_kernel.cuh; inst="template __global__ void kva__decode_kernel<$T, $D, 1, false>(const __grid_constant__ kva__decode_args);" ;;
  *) echo "kernel: hopper, hopper-turns, wgmma, mma or decode" >&2; exit 2 ;;
esac
# (KVA__VARIANT_FAST_TANH: the 16-bit prefill modules only, as variant_compile.c defines it)
fast_tanh='#define KVA__VARIANT_FAST_TANH 1'; [ "$kern" = decode ] && fast_tanh=''
cat >"$out/v.cu" <<X
#define KVA_SCORE_MOD_FN $fn
#define KVA__HP_CWG_D64 3
#define KVA__HP_QBUFS 3
#define KVA__HP_ORING 1
#define KVA__HP_ALIBI_TURNS 0
#define KVA__HP_SMEM_RECORDS ${PROBE_SMEM_RECORDS:-0}
#define KVA__HP_LANE_RECORDS ${PROBE_LANE_RECORDS:-0}
#define KVA__DECODE_PDL 1
$fast_tanh
$extra
#include "cuda_common.cuh"
#include "variant_prelude.cuh"
$body
#include "$hdr"
$inst
X
nvcc -std=c++17 --use_fast_math -O3 -arch=sm_90a -I"$tree/include" -I"$tree/src" -I"$tree/src/cuda" -cubin \
    -Xptxas -v -o "$out/v.cubin" "$out/v.cu" 2>&1 | grep -E "error|Compiling entry function|registers|spill|Performance Loss"
