#!/usr/bin/env bash
# check-ptxas.sh -- the sm_90a prefill kernels compile without ptxas's performance advisories
# ("Potential Performance Loss"), on a machine without a GPU (nvcc only), and the decode kernels
# stay within their register and spill budgets ("Decode kernels' budgets" below). One such as "C7511 ...
# wgmma.mma_async instructions are serialized ..." means ptxas gave up overlapping the tensor
# cores' work: the kernels still pass every test, but run far slower (native ALiBi +55% on an
# H200, bench/NOTES.md v6.40), which only a GPU benchmark would show otherwise; others (e.g. about
# setmaxnreg) fail it too.
# Checks the library's translation units with wgmma kernels and the NVRTC programs of three
# variants (built-in ALiBi, the soft-cap snippet, an identity modifier) on the Hopper TMA kernel
# (d64, d128, d256; at d128 also the build with the consumers' turns that a module without them
# adds -- the snippet asks for the turns itself, so it has none) and on the wgmma kernel (d128),
# bf16, and native ALiBi's Hopper builds in f16 too, through bench/probes/variant_ptxas.sh.
# Then the decode kernels' register and spill budgets (below). Exits 1 on an advisory, a failed
# compile or a decode kernel over its budget; without nvcc it says so and exits 0 (nothing to
# check). ~2-4 min.
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
# Decode kernels' budgets (ptxas -v, sm_90a): every decode kernel of the library (bf16, f16, f32)
# spills nothing and keeps no stack frame -- except the two-N-tile d256 kernels, which spill (known,
# bench/NOTES.md) --, and the d64 kernels keep the blocks per SM they run with: at most 128 registers
# with one N tile (4 blocks of 128 threads; their shared memory would allow 4-5), 168 with two (3
# blocks). At d128 / d256 shared memory holds a kernel to 2 / 1 blocks per SM, so its registers
# may grow to 255. The decode kernels of three variants' modules (built-in ALiBi, the soft-cap
# snippet, identity; bf16, one N tile, d64 and d128) the same. (The two-N-tile d256 kernels' stack
# frames and spills are exempt without a ceiling: 104-120 bytes of stack today.) (2026-12-01: a change that left the
# built-in ALiBi's decode module an 8-byte stack frame cost its 8 x 4096 decode a point on an H200.)
dbudget() { # $1: a label, $2: ptxas -v output; prints and returns 1 on a kernel over its budget
    awk -v what="$1" '
        /Compiling entry function/ { match($0, /_Z[^'"'"' ]*/); n = substr($0, RSTART, RLENGTH) }
        /bytes stack frame/ { st = $1 + 0; sp = $5 + $9 }
        /Used [0-9]+ registers/ {
            regs = $5 + 0; d = 0; nt = 0
            if (match(n, /Li[0-9]+ELi[0-9]+E/)) { split(substr(n, RSTART, RLENGTH), f, /Li|E/); d = f[2] + 0; nt = f[4] + 0 }
            if (n !~ /kva__decode_kernel/ || d == 0) next
            lim = d == 64 ? (nt == 1 ? 128 : 168) : 255
            if ((st > 0 || sp > 0) && !(d == 256 && nt == 2)) { printf "%s: decode d%d NT%d: %d bytes stack frame, %d bytes of spill stores + loads\n", what, d, nt, st, sp; bad = 1 }
            if (regs > lim) { printf "%s: decode d%d NT%d: %d registers (budget %d)\n", what, d, nt, regs, lim; bad = 1 }
            k++
        }
        END { if (k == 0) { printf "%s: no decode kernel found in ptxas output\n", what; bad = 1 } exit bad }' <<<"$2"
}
dk=0
dcheck() { # $1: a label; the rest: the command that compiles it with ptxas -v
    local what=$1 log
    shift
    dk=$((dk + 1))
    if ! log=$("$@" 2>&1); then
        tail -n 20 <<<"$log"
        echo "check-ptxas: $what did not compile"
        bad=1
    elif ! dbudget "$what" "$log"; then
        echo "check-ptxas: $what: a decode kernel over its budget (above)"
        bad=1
    fi
}
for tu in decode_bf16 decode_f16 decode_f32; do
    dcheck "src/cuda/$tu.cu" nvcc -std=c++17 --use_fast_math -O3 -arch=sm_90a -Iinclude -Isrc -Isrc/cuda -cubin \
        -Xptxas -v "src/cuda/$tu.cu" -o "$out/$tu.cubin"
done
for spec in "alibi decode 64" "alibi decode 128" "softcap decode 64" "softcap decode 128" \
    "identity decode 64" "identity decode 128"; do
    # shellcheck disable=SC2086
    dcheck "variant ${spec%% *} (${spec#* })" env PROBE_T=bf16 bench/probes/variant_ptxas.sh $spec
done
[ $bad = 0 ] && echo "check-ptxas: no ptxas advisory in the sm_90a prefill kernels (4 library files + 2 option builds, $builds variant builds); decode kernels within their register / spill budgets ($dk builds)"
exit $bad
