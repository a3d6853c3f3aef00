#!/usr/bin/env bash
# check-ptxas.sh -- the sm_90a prefill kernels compile without ptxas's performance advisories,
# on a machine without a GPU (nvcc only). An advisory such as "C7511 Potential Performance Loss:
# wgmma.mma_async instructions are serialized ..." means ptxas gave up overlapping the tensor
# cores' work: the kernels still pass every test, but run far slower (native ALiBi +55% on an
# H200, bench/NOTES.md v6.40), which only a GPU benchmark would show otherwise.
# Checks the library's translation units with wgmma kernels and the NVRTC programs of three
# variants (built-in ALiBi, the soft-cap snippet, an identity modifier) on the Hopper TMA kernel
# (d64, d128 with and without the consumers' turns, d256) and on the wgmma kernel (d128), through
# bench/probes/variant_ptxas.sh. Exits 1 on an advisory or a failed compile; ~1-3 min.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
command -v nvcc >/dev/null || { echo "check-ptxas: no nvcc, skipped"; exit 0; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bad=0
for tu in prefill_bf16 prefill_f16 prefill_hopper_bf16 prefill_hopper_f16; do
    if ! nvcc -std=c++17 --use_fast_math -O3 -arch=sm_90a -Iinclude -Isrc -Isrc/cuda -cubin -Xptxas -v \
            "src/cuda/$tu.cu" -o "$out/$tu.cubin" >"$out/$tu.log" 2>&1; then
        tail -n 20 "$out/$tu.log"
        echo "check-ptxas: src/cuda/$tu.cu did not compile"
        bad=1
    elif grep -q "Performance Loss" "$out/$tu.log"; then
        grep "Performance Loss" "$out/$tu.log"
        echo "check-ptxas: src/cuda/$tu.cu: ptxas advisory (above)"
        bad=1
    fi
done
for mod in alibi softcap identity; do
    for kd in "hopper 64" "hopper 128" "hopper-turns 128" "hopper 256" "wgmma 128"; do
        # shellcheck disable=SC2086
        if ! bench/probes/variant_ptxas.sh "$mod" $kd >"$out/v.log" 2>&1; then
            cat "$out/v.log"
            echo "check-ptxas: variant $mod ($kd) did not compile"
            bad=1
        elif grep -q "Performance Loss" "$out/v.log"; then
            grep "Performance Loss" "$out/v.log"
            echo "check-ptxas: variant $mod ($kd): ptxas advisory (above)"
            bad=1
        fi
    done
done
[ $bad = 0 ] && echo "check-ptxas: no ptxas advisory in the sm_90a prefill kernels (4 library files, 15 variant builds)"
exit $bad
