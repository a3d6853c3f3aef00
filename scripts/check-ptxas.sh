#!/usr/bin/env bash
# check-ptxas.sh -- the sm_90a prefill kernels compile without ptxas's performance advisories
# ("Potential Performance Loss"), on a machine without a GPU (nvcc only). One such as "C7511 ...
# wgmma.mma_async instructions are serialized ..." means ptxas gave up overlapping the tensor
# cores' work: the kernels still pass every test, but run far slower (native ALiBi +55% on an
# H200, bench/NOTES.md v6.40), which only a GPU benchmark would show otherwise; others (e.g. about
# setmaxnreg) fail it too.
# Checks the library's translation units with wgmma kernels and the NVRTC programs of three
# variants (built-in ALiBi, the soft-cap snippet, an identity modifier) on the Hopper TMA kernel
# (d64, d128, d256; at d128 also the build with the consumers' turns that a module without them
# adds -- the snippet asks for the turns itself, so it has none) and on the wgmma kernel (d128),
# bf16, and native ALiBi's Hopper builds in f16 too, through bench/probes/variant_ptxas.sh.
# Exits 1 on an advisory or a failed compile; without nvcc it says so and exits 0 (nothing to
# check). ~1-3 min.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
command -v nvcc >/dev/null || { echo "check-ptxas: no nvcc, skipped"; exit 0; }
out=$(mktemp -d) || exit 1
trap 'rm -rf "$out"' EXIT
bad=0
# (the last two: the Hopper kernel's capped builds with the raw-max softmax and at d64 too, and the
# kernel with the cap a run-time flag everywhere -- options off in the library, compiled here so
# that they keep building)
for spec in prefill_bf16 prefill_f16 prefill_hopper_bf16 prefill_hopper_f16 \
    "prefill_hopper_bf16 -DKVA__HP_CAP_RAW_MAX=1 -DKVA__HP_CAP_D64=1" \
    "prefill_hopper_f16 -DKVA__HP_CAP_KERNEL=0"; do
    tu=${spec%% *}; def=; [ "$spec" != "$tu" ] && def=${spec#* }
    # shellcheck disable=SC2086
    if ! nvcc -std=c++17 --use_fast_math -O3 -arch=sm_90a -Iinclude -Isrc -Isrc/cuda $def -cubin -Xptxas -v \
            "src/cuda/$tu.cu" -o "$out/$tu.cubin" >"$out/$tu.log" 2>&1; then
        tail -n 20 "$out/$tu.log"
        echo "check-ptxas: src/cuda/$tu.cu $def did not compile"
        bad=1
    elif grep -q "Performance Loss" "$out/$tu.log"; then
        grep "Performance Loss" "$out/$tu.log"
        echo "check-ptxas: src/cuda/$tu.cu $def: ptxas advisory (above)"
        bad=1
    fi
done
builds=0
for spec in "alibi hopper 64" "alibi hopper 128" "alibi hopper-turns 128" "alibi hopper 256" "alibi wgmma 128" \
    "softcap hopper 64" "softcap hopper 128" "softcap hopper 256" "softcap wgmma 128" \
    "identity hopper 64" "identity hopper 128" "identity hopper-turns 128" "identity hopper 256" "identity wgmma 128" \
    "f16 alibi hopper 64" "f16 alibi hopper 128" "f16 alibi hopper-turns 128" "f16 alibi hopper 256"; do
    t=bf16
    case $spec in f16\ *) t=f16; spec=${spec#f16 } ;; esac
    mod=${spec%% *}; kd=${spec#* }
    builds=$((builds + 1))
    # shellcheck disable=SC2086
    if ! PROBE_T=$t bench/probes/variant_ptxas.sh "$mod" $kd >"$out/v.log" 2>&1; then
        cat "$out/v.log"
        echo "check-ptxas: variant $mod ($kd, $t) did not compile"
        bad=1
    elif grep -q "Performance Loss" "$out/v.log"; then
        grep "Performance Loss" "$out/v.log"
        echo "check-ptxas: variant $mod ($kd, $t): ptxas advisory (above)"
        bad=1
    fi
done
[ $bad = 0 ] && echo "check-ptxas: no ptxas advisory in the sm_90a prefill kernels (4 library files + 2 option builds, $builds variant builds)"
exit $bad
