#!/usr/bin/env bash
# gpu-check.sh -- everything a GPU machine run needs, in one go, from the repository root:
#   1. build for sm_90a (KVA_CUDA_ARCHS=90a) into $BUILD (default build-gpu),
#   2. the GPU tests (kvattn_tests cuda*: decode sweep, prefill (cuda_prefill*), graphs, merge,
#      cache, errors, variants (cuda_variant*: NVRTC)) against the float64 reference, and the
#      variants example,
#   3. the same under compute-sanitizer memcheck, and racecheck, on the small sweep
#      (KVA_TEST_QUICK=1; prefill: the cuda_prefill_quick subset),
#   4. the Python package's tests (python/tests with torch on CUDA: streams, graph capture, the
#      transformers integration against sdpa on CPU f32 and GPU bf16) and the host overhead of a
#      decode run from Python (python -m kvattn.bench --device cuda),
#   5. the benchmark (bench/bench_torch.py: decode table -- read ceiling, ours vs PyTorch SDPA,
#      graph replays -- and prefill table -- bf16 GEMM ceiling, ours ragged / paged / dense vs
#      SDPA flash and cuDNN; both tables printed at the end, numbers in bench.json (in logs.tgz); the board's
#      power, SM clock and throttle reasons sampled meanwhile into bench-power.csv; then the
#      special-function unit's ex2 / tanh rates, bench/probes/mufu_rate.cu, into mufu_rate.log),
#   6. a summary, printed last.
# Logs go to $OUT (default ./gpu-check-out; packed, see "Logs" below). Knobs: GPU_CHECK_SOAK=S adds a soak of S seconds
# (kvattn run --duration, prefix sharing on; host and device memory must stay flat),
# GPU_CHECK_E2E=0 skips the kvattn check/run steps, GPU_CHECK_VARIANTS=0 the cuda_variant tests (or names
# the ones to run, each under GPU_CHECK_VARIANT_TIMEOUT seconds), GPU_CHECK_SANITIZE=0 skips step 3,
# GPU_CHECK_PYTHON=0 skips step 4, GPU_CHECK_BENCH=0 skips step 5, GPU_CHECK_BENCH_ARGS passes
# options to bench_torch.py (e.g. "--quick --shapes 1x8192,64x4096", "--prefill-only",
# "--decode-only"), GPU_CHECK_TESTS selects tests (default "cuda", which includes cuda_prefill*; 0 skips them),
# GPU_CHECK_TRACE=1 adds the Hopper prefill kernel's per-item phase trace (bench/hopper_trace, its
# own build, with bench/decode_trace, the decode kernel's per-block times, run before it;
# GPU_CHECK_TRACE_DIMS head dims, default "64 128 256"; GPU_CHECK_TRACE_VARIANT=alibi,
# softcap or identity traces that variant's module instead; GPU_CHECK_TRACE_SASS=1 adds its kernels'
# SASS, trace-sass.txt).
#
# Paired A/B rounds (a change against a base revision, both built and timed in one run, as
# bench/NOTES.md decides every kernel change):
#   scripts/gpu-check.sh --ab-prepare REV   (here, with git: writes REV's versions of the files that
#                                           differ into gpu-ab-base/, ignored by git)
#   GPU_CHECK_AB=1 scripts/gpu-check.sh     (on the device, gpu-ab-base/ carried along: builds the
#                                           base tree and this one, then GPU_CHECK_AB_ROUNDS (3)
#                                           alternated rounds of bench_torch.py GPU_CHECK_AB_ARGS
#                                           (default: prefill, --quick, 512 / 2048 tokens, bf16 d128
#                                           and d64); GPU_CHECK_AB_CUDA_FLAGS adds -D options to the
#                                           new build only; nothing else runs)
#   GPU_CHECK_AB_SIDES="a=-DX=0;b=-DX=1"    (instead of one new build: one build of this tree per
#                                           named flag set, all timed in each round beside the base;
#                                           each bench call is cut at GPU_CHECK_AB_TIMEOUT s, 240)
#   GPU_CHECK_AB_CMD="python3 x.py --build {build}"  (instead of bench_torch.py: any command, {build}
#                                           replaced by each side's build directory; its table
#                                           lines ("| ...") are printed per round)
#
# Logs: with GPU_CHECK_PACK=1 (the default) every log is written to a scratch folder and packed into
# $OUT/logs.tgz after each step, beside $OUT/summary.txt (the summary so far) and $OUT/device.txt: a
# device call returns at most 8 files from $OUT, and a call cut by its time limit still returns
# what the finished steps wrote. GPU_CHECK_PACK=0 writes the logs to $OUT as files.
# Time (H200, 2026-11-28, warm build): tests 93 s, wgmma / mma.sync sweeps 63 / 53 s, memcheck
# 154 s, racecheck 48 + 19 s, e2e 31 s, python ~80 s, variants ~400 s (prefill sweeps 124 + 94 s),
# bench ~200 s (+ the wgmma / mma.sync tables unless GPU_CHECK_BENCH_MMA=0), a cold build ~45 s:
# the whole script is three 600 s device calls. GPU_CHECK_TESTS=0 skips the main test run, the
# path sweeps and the variants example, so e.g.
#   1. GPU_CHECK_VARIANTS=0 GPU_CHECK_E2E=0 GPU_CHECK_PYTHON=0 GPU_CHECK_BENCH=0   (~480 s cold)
#   2. GPU_CHECK_TESTS=0 GPU_CHECK_SANITIZE=0 GPU_CHECK_PYTHON=0 GPU_CHECK_BENCH=0 (variants, e2e)
#   3. GPU_CHECK_TESTS=0 GPU_CHECK_SANITIZE=0 GPU_CHECK_VARIANTS=0 GPU_CHECK_E2E=0 (python, bench)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = "--ab-prepare" ]; then
    rev=${2:?"--ab-prepare needs a base revision"}
    git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "gpu-check.sh: no revision $rev" >&2; exit 2; }
    rm -rf gpu-ab-base && mkdir gpu-ab-base || exit 1
    n=0
    while IFS= read -r f; do
        n=$((n + 1))
        if git cat-file -e "$rev:$f" 2>/dev/null; then
            mkdir -p "gpu-ab-base/$(dirname "$f")" && git show "$rev:$f" >"gpu-ab-base/$f"
        else
            echo "$f" >>gpu-ab-base/.added # (not in the base: removed from its tree)
        fi
    done < <(git diff --name-only "$rev" -- . ':!gpu-ab-base')
    echo "gpu-ab-base/: $n files as of $(git rev-parse --short "$rev") (carry it to the device with the tree)"
    exit 0
fi
OUT=${OUT:-$PWD/gpu-check-out}
BUILD=${BUILD:-build-gpu}
TESTS=${GPU_CHECK_TESTS:-cuda}
mkdir -p "$OUT"
status=0
summary=()
FINAL_OUT=$OUT
if [ "${GPU_CHECK_PACK:-1}" != 0 ]; then
    OUT=$(mktemp -d) # (the logs; packed into $FINAL_OUT/logs.tgz after each step)
fi
pack() {
    printf '%s\n' "${summary[@]}" >"$FINAL_OUT/summary.txt"
    [ "$OUT" = "$FINAL_OUT" ] && return 0
    cp "$OUT/device.txt" "$FINAL_OUT/" 2>/dev/null
    # (exit status 1: a file changed while it was read, e.g. a sampler still writing)
    tar -czf "$FINAL_OUT/logs.tgz.part" -C "$OUT" .
    [ $? -le 1 ] && mv "$FINAL_OUT/logs.tgz.part" "$FINAL_OUT/logs.tgz"
}
note() { summary+=("$1"); echo "== $1"; pack; }
trap pack EXIT

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader \
    | tee "$OUT/device.txt"

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
t0=$(date +%s)

if [ "${GPU_CHECK_AB:-0}" != 0 ]; then
    [ -d gpu-ab-base ] || { echo "GPU_CHECK_AB: no gpu-ab-base/ (scripts/gpu-check.sh --ab-prepare REV)" >&2; exit 2; }
    # (a fixed path inside './build*', which is not copied into it; its build directory is wiped
    # every time: the copies keep their files' times, so on a warm machine an object built from
    # another base revision could look newer than its source and be linked unseen)
    base_src=$PWD/build-ab-src
    rm -rf "$base_src" "$BUILD-ab-base" && mkdir -p "$base_src" || exit 1
    tar --exclude=./gpu-ab-base --exclude='./build*' -cf - . | tar -x -C "$base_src" && cp -r gpu-ab-base/. "$base_src/"
    if [ -f gpu-ab-base/.added ]; then
        while IFS= read -r f; do rm -f "$base_src/$f"; done <gpu-ab-base/.added
    fi
    ab_configure() { # src build [cuda flags]
        cmake -S "$1" -B "$2" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_CUDA_ARCHS=90a \
            -DPython_EXECUTABLE="$(command -v python3)" ${3:+"-DCMAKE_CUDA_FLAGS=$3"} >>"$OUT/ab-build-$(basename "$2").log" 2>&1
    }
    ab_build() { # src build [cuda flags]: a side's build directory that does not configure
        # (another source tree's, left on a warm machine) is wiped and configured afresh
        : >"$OUT/ab-build-$(basename "$2").log"
        { ab_configure "$@" || { rm -rf "$2" && ab_configure "$@"; }; } &&
            cmake --build "$2" -j "$(nproc)" >>"$OUT/ab-build-$(basename "$2").log" 2>&1
    }
    # sides: name -> build dir and CUDA flags (the base first, then this tree once per flag set)
    sides=(base); declare -A side_dir=([base]="$BUILD-ab-base") side_flags=([base]="")
    if [ -n "${GPU_CHECK_AB_SIDES:-}" ]; then
        IFS=';' read -r -a specs <<<"$GPU_CHECK_AB_SIDES"
        for spec in "${specs[@]}"; do
            n=${spec%%=*}; sides+=("$n"); side_dir[$n]="$BUILD-ab-$n"; side_flags[$n]=${spec#*=}
        done
    else
        sides+=(new); side_dir[new]=$BUILD; side_flags[new]=${GPU_CHECK_AB_CUDA_FLAGS:-}
    fi
    pids=()
    for n in "${sides[@]}"; do
        src=.; [ "$n" = base ] && src=$base_src
        ab_build "$src" "${side_dir[$n]}" "${side_flags[$n]}" & pids+=($!)
    done
    for i in "${!sides[@]}"; do
        wait "${pids[$i]}" || { note "A/B: ${sides[$i]} build FAILED"; exit 1; }
    done
    note "A/B builds: ok ($(( $(date +%s) - t0 )) s): ${sides[*]}"
    # shellcheck disable=SC2086
    for r in $(seq 1 "${GPU_CHECK_AB_ROUNDS:-3}"); do
        for side in "${sides[@]}"; do
            if [ -n "${GPU_CHECK_AB_CMD:-}" ]; then
                cmd=${GPU_CHECK_AB_CMD//\{build\}/${side_dir[$side]}}
                timeout "${GPU_CHECK_AB_TIMEOUT:-240}" bash -c "$cmd" >"$OUT/ab-$side-$r.log" 2>&1 ||
                    { status=1; note "A/B: $side round $r FAILED"; }
                echo "== $side, round $r"
                grep -E '^\|' "$OUT/ab-$side-$r.log" | cut -c1-150
                pack
                continue
            fi
            timeout "${GPU_CHECK_AB_TIMEOUT:-240}" python3 bench/bench_torch.py --build "${side_dir[$side]}" \
                ${GPU_CHECK_AB_ARGS:---prefill-only --quick --no-extra-rows --seqs 512,2048 --prefill-sets bf16:128,bf16:64} \
                >"$OUT/ab-$side-$r.log" 2>&1 || { status=1; note "A/B: $side round $r FAILED"; }
            echo "== $side, round $r"
            grep -E '^\| (bf16|f16) \||^\| [A-Za-z0-9].*us \|' "$OUT/ab-$side-$r.log" | cut -c1-150
            pack
        done
    done
    printf '%s\n' "${summary[@]}"
    exit $status
fi
if cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_CUDA_ARCHS=90a \
        -DKVA_VERBOSE_PTXAS=ON -DPython_EXECUTABLE="$(command -v python3)" \
        >"$OUT/build.log" 2>&1 &&
   cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1; then
    note "build: ok ($(( $(date +%s) - t0 )) s)"
    grep -A2 "Compiling entry function '_Z18kva__decode_kernel" "$OUT/build.log" \
        | grep -E "registers|spill" | sort | uniq -c >"$OUT/ptxas.txt" || true
    # prefill kernels (any entry function with "prefill" in its mangled name)
    grep -A3 -E "Compiling entry function '[^']*prefill" "$OUT/build.log" \
        | grep -E "registers|spill" | sort | uniq -c | sed 's/^/prefill: /' >>"$OUT/ptxas.txt" || true
    # (e.g. C7511: a serialised wgmma pipeline; scripts/check-ptxas.sh fails CI on them)
    grep -E "Performance Loss" "$OUT/build.log" | sort -u | sed 's/^/ADVISORY: /' >>"$OUT/ptxas.txt" || true
else
    tail -40 "$OUT/build.log"
    note "build: FAILED (see build.log)"
    printf '%s\n' "${summary[@]}"
    exit 1
fi

run_tests() { # name, log, command...
    local name=$1 log=$2
    shift 2
    local t
    t=$(date +%s)
    "$@" >"$OUT/$log" 2>&1
    local rc=$?
    local line
    line=$(grep -E "passed, .* failed" "$OUT/$log" | tail -1)
    if [ $rc -ne 0 ]; then
        status=1
        grep -E "FAIL|: .*off|Invalid|Race|ERROR|error|\.c:[0-9]+:" "$OUT/$log" | head -30
        note "$name: FAILED rc=$rc ${line} ($(( $(date +%s) - t )) s)"
    else
        note "$name: ok ${line} ($(( $(date +%s) - t )) s)"
    fi
}

# Every test command runs under a time limit: a kernel stuck on a barrier must fail the step,
# not the machine's whole allowance.
TLIM=${GPU_CHECK_TEST_TIMEOUT:-900}
# KVA_PREFILL_TMA_STRICT=1: the Hopper prefill path may not fall back to the wgmma kernel.
if [ "$TESTS" != 0 ]; then
    run_tests "tests" tests.log env KVA_PREFILL_TMA_STRICT=1 timeout "$TLIM" "./$BUILD/kvattn_tests" $TESTS -cuda_variant
fi
# Variants (NVRTC at run time; the prefill sweeps drive the float64 reference through a C
# callback and take minutes), under their own limit.
# One command per test, each under its own limit (GPU_CHECK_VARIANT_TIMEOUT seconds, default 300):
# a sweep that runs long costs its own step, not the others' results. GPU_CHECK_VARIANTS names
# the tests (default: all eleven; 0 skips the step).
VARIANT_TESTS=${GPU_CHECK_VARIANTS:-"cuda_variant_bench cuda_variant_cache cuda_variant_decode cuda_variant_errors
    cuda_variant_graph_replay cuda_variant_prefill_paged cuda_variant_prefill_ragged cuda_variant_prefill_wgmma
    cuda_variant_prefill_mma cuda_variant_alibi_tiny_scale cuda_variant_alibi_barriers_below_base"}
[ "$VARIANT_TESTS" = 1 ] && VARIANT_TESTS="cuda_variant"
if [ "$VARIANT_TESTS" != 0 ]; then
    : >"$OUT/tests-variants.log"
    for vt in $VARIANT_TESTS; do
        run_tests "tests ($vt)" "tests-$vt.log" env KVA_PREFILL_TMA_STRICT=1 timeout "${GPU_CHECK_VARIANT_TIMEOUT:-300}" \
            "./$BUILD/kvattn_tests" "$vt"
        cat "$OUT/tests-$vt.log" >>"$OUT/tests-variants.log"
    done
    grep -E "^    (decode|prefill|first use)" "$OUT/tests-variants.log" || true
fi
if [ "$TESTS" != 0 ]; then
    # The prefill sweep again on the wgmma kernel (the Hopper fallback) and on the mma.sync kernels.
    run_tests "tests (prefill, wgmma path)" tests-wgmma.log env KVA_PREFILL_PATH=wgmma timeout "$TLIM" \
        "./$BUILD/kvattn_tests" cuda_prefill cuda_score_range
    run_tests "tests (prefill, mma.sync path)" tests-mma.log env KVA_PREFILL_PATH=mma timeout "$TLIM" \
        "./$BUILD/kvattn_tests" cuda_prefill cuda_score_range

    # The variants example (NVRTC at run time: compile, then the GPU against the CPU callback).
    run_tests "variants example" variants.log timeout "$TLIM" "./$BUILD/variants"
    grep -E "max \|gpu|broken" "$OUT/variants.log" || true
fi

if [ "${GPU_CHECK_SANITIZE:-1}" != 0 ]; then
    run_tests "memcheck" memcheck.log env KVA_TEST_QUICK=1 KVA_PREFILL_TMA_STRICT=1 timeout "$TLIM" compute-sanitizer --tool memcheck \
        --leak-check no --error-exitcode 9 "./$BUILD/kvattn_tests" cuda_decode cuda_merge cuda_cache cuda_graph \
        cuda_prefill cuda_score_range threads_cuda cuda_variant
    grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1
    run_tests "racecheck" racecheck.log env KVA_TEST_QUICK=1 KVA_PREFILL_TMA_STRICT=1 timeout "$TLIM" compute-sanitizer --tool racecheck \
        --error-exitcode 9 "./$BUILD/kvattn_tests" cuda_decode_sweep cuda_decode_long \
        cuda_decode_head_dims cuda_decode_large_groups cuda_decode_global_rowmax_matches \
        cuda_decode_merge_tree \
        cuda_prefill_quick
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUT/racecheck.log" | tail -1
    run_tests "racecheck (prefill, mma.sync path)" racecheck-mma.log env KVA_TEST_QUICK=1 KVA_PREFILL_PATH=mma \
        timeout "$TLIM" compute-sanitizer --tool racecheck --error-exitcode 9 "./$BUILD/kvattn_tests" cuda_prefill_quick
    run_tests "synccheck (prefill)" synccheck.log env KVA_TEST_QUICK=1 KVA_PREFILL_TMA_STRICT=1 timeout "$TLIM" compute-sanitizer --tool synccheck \
        --error-exitcode 9 "./$BUILD/kvattn_tests" cuda_prefill_quick
fi

# End to end through the command: one shape against the float64 reference, then a short
# serving simulation (continuous batching, preemption, sampled verification) on the GPU.
if [ "${GPU_CHECK_E2E:-1}" != 0 ]; then
    run_tests "kvattn check" kvattn-check.log "./$BUILD/kvattn" check --device cuda
    run_tests "kvattn run" run.log "./$BUILD/kvattn" run --device cuda --requests 48 --pages 600
    tail -25 "$OUT/run.log"
    # Prefix sharing (forks, copy-on-write, refcounts) under preemption, verified on the GPU.
    run_tests "kvattn run (prefix sharing)" run-sharing.log "./$BUILD/kvattn" run --device cuda \
        --requests 48 --shared-prefix 512 --prefix-groups 2 --samples 2
    tail -25 "$OUT/run-sharing.log"
fi

# Soak (GPU_CHECK_SOAK=seconds, off by default): host RSS and device memory must stay flat.
if [ "${GPU_CHECK_SOAK:-0}" != 0 ]; then
    run_tests "kvattn run (soak ${GPU_CHECK_SOAK} s)" soak.log "./$BUILD/kvattn" run --device cuda \
        --duration "$GPU_CHECK_SOAK" --shared-prefix 512 --prefix-groups 2 --samples 2
    grep -E "^soak|verified|sharing|PASS|FAIL" "$OUT/soak.log" | tail -8
fi

if [ "${GPU_CHECK_PYTHON:-1}" != 0 ]; then
    if [ ! -f "$BUILD/python/kvattn/_ext.abi3.so" ]; then
        note "python: SKIPPED (extension not built: no Python development headers)"
    elif ! python3 -c "import pytest" 2>/dev/null; then
        note "python: SKIPPED (no pytest on this machine)"
    else
        run_tests "python tests" python.log env PYTHONPATH="$PWD/$BUILD/python" python3 -m pytest -q -rs \
            -p no:cacheprovider python/tests
        grep -E "passed|failed|SKIPPED" "$OUT/python.log" | tail -8
    fi
    if [ -f "$BUILD/python/kvattn/_ext.abi3.so" ]; then
        PYTHONPATH="$PWD/$BUILD/python" python3 -m kvattn.bench --device cuda --json "$OUT/host_overhead.json" \
            >"$OUT/host_overhead.log" 2>&1 && note "host overhead: $(tail -1 "$OUT/host_overhead.log")" \
            || note "host overhead: FAILED (see host_overhead.log)"
        cat "$OUT/host_overhead.log"
    fi
fi

# Both tables (decode, then prefill; ~2-3 minutes).
if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
    t=$(date +%s)
    # The board's power, SM clock and throttle reasons every 250 ms while the tables run: the long
    # prefill rows reach the power cap (bench/NOTES.md), which moves them from run to run.
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader \
        -lms 250 >"$OUT/bench-power.csv" 2>/dev/null &
    smi_pid=$!
    # shellcheck disable=SC2086
    if PYTHONUNBUFFERED=1 python3 bench/bench_torch.py --build "$BUILD" --json "$OUT/bench.json" \
            ${GPU_CHECK_BENCH_ARGS:-} >"$OUT/bench.log" 2>&1; then
        kill "$smi_pid" 2>/dev/null
        note "bench: ok ($(( $(date +%s) - t )) s) $(grep -E '^prefill rows:' "$OUT/bench.log" | tail -1)"
    else
        status=1
        kill "$smi_pid" 2>/dev/null
        tail -20 "$OUT/bench.log"
        note "bench: FAILED (see bench.log) $(grep -E '^prefill rows:' "$OUT/bench.log" | tail -1)"
    fi
    # samples under load (SM clock above 1000 MHz): power and clock ranges, how many had the
    # software power cap (reason bit 0x4) active
    awk -F', ' '$2 + 0 > 1000 { n++; c = $2 + 0; w = $3 + 0;
            if (n == 1 || c < cmin) cmin = c; if (c > cmax) cmax = c; if (w > wmax) wmax = w;
            if (index("4567cdefCDEF", substr($4, length($4), 1))) cap++ }
        END { if (n) note = sprintf("bench power: %d loaded samples, SM clock %d-%d MHz, up to %.0f W, power cap active in %d",
                                    n, cmin, cmax, wmax, cap); print note }' "$OUT/bench-power.csv" >"$OUT/bench-power.txt" 2>/dev/null
    [ -s "$OUT/bench-power.txt" ] && note "$(cat "$OUT/bench-power.txt")"
    sed -n '/^## kvattn/,$p' "$OUT/bench.log"
    # The special-function unit's rates (ex2, tanh: the softmax's and the soft cap's), the
    # ceiling a capped softmax is held to (bench/probes/mufu_rate.cu, ~3 s)
    if nvcc -O3 -arch=sm_90a -o "$BUILD/mufu_rate" bench/probes/mufu_rate.cu >"$OUT/mufu_rate.log" 2>&1 &&
       "./$BUILD/mufu_rate" >>"$OUT/mufu_rate.log" 2>&1; then
        note "special-function unit: $(grep -E 'tanh.approx|ex2.approx' "$OUT/mufu_rate.log" | tr -s ' ' | tr '\n' ';')"
    else
        note "special-function unit probe: FAILED (see mufu_rate.log)"
    fi
    # The other prefill paths beside it (d = 128 rows), for the path comparison.
    if [ "${GPU_CHECK_BENCH_MMA:-1}" != 0 ]; then
        KVA_PREFILL_PATH=wgmma PYTHONUNBUFFERED=1 python3 bench/bench_torch.py --build "$BUILD" --prefill-only \
            --prefill-sets bf16:128 --no-extra-rows --sustained 0 --json "$OUT/bench-wgmma.json" >"$OUT/bench-wgmma.log" 2>&1 ||
            note "bench (wgmma path): FAILED"
        sed -n '/^## kvattn/,$p' "$OUT/bench-wgmma.log" | grep -E "^\| bf16 \| 128" | sed 's/^/wgmma: /'
        KVA_PREFILL_PATH=mma PYTHONUNBUFFERED=1 python3 bench/bench_torch.py --build "$BUILD" --prefill-only \
            --prefill-sets bf16:128 --no-extra-rows --sustained 0 --json "$OUT/bench-mma.json" >"$OUT/bench-mma.log" 2>&1 ||
            note "bench (mma.sync path): FAILED"
        sed -n '/^## kvattn/,$p' "$OUT/bench-mma.log" | grep -E "^\| bf16 \| 128" | sed 's/^/mma.sync: /'
        pack
    fi
fi

# Where the Hopper prefill kernel's cycles go per work item, and a small decode batch's time per
# block (GPU_CHECK_TRACE=1, off by default): a separate measurement build (KVA_HP_TRACE,
# KVA_DECODE_TRACE) whose kernels record their traces, printed per phase.
if [ "${GPU_CHECK_TRACE:-0}" != 0 ]; then
    t=$(date +%s)
    if cmake -S . -B "$BUILD-trace" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_CUDA_ARCHS=90a \
            -DKVA_PYTHON=OFF -DKVA_HP_TRACE=ON -DKVA_DECODE_TRACE=ON >"$OUT/trace-build.log" 2>&1 &&
       cmake --build "$BUILD-trace" -j "$(nproc)" --target hopper_trace decode_trace >>"$OUT/trace-build.log" 2>&1; then
        run_tests "decode trace" decode-trace.log timeout "$TLIM" "./$BUILD-trace/decode_trace"
        cat "$OUT/decode-trace.log"
        # shellcheck disable=SC2086
        run_tests "hopper trace" hopper-trace.log env KVA_PREFILL_TMA_STRICT=1 timeout "$TLIM" \
            "./$BUILD-trace/hopper_trace" ${GPU_CHECK_TRACE_VARIANT:+--variant "$GPU_CHECK_TRACE_VARIANT"} \
            ${GPU_CHECK_TRACE_DIMS:-64 128 256}
        cat "$OUT/hopper-trace.log"
        # (GPU_CHECK_TRACE_SASS=1: the trace build's kernels as SASS, to place a trace point's
        # cycles among instructions: each point is a clock read and a 64-bit global store 8 x
        # point bytes into its item's record)
        if [ "${GPU_CHECK_TRACE_SASS:-0}" != 0 ]; then
            cuobjdump -sass "./$BUILD-trace/hopper_trace" >"$OUT/trace-sass.txt" 2>&1 ||
                note "trace SASS: cuobjdump FAILED (see trace-sass.txt)"
        fi
    else
        status=1
        note "trace build (hopper_trace, decode_trace): FAILED (see trace-build.log, $(( $(date +%s) - t )) s)"
    fi
fi

echo
echo "== summary ($(cat "$OUT/device.txt"))"
cat "$OUT/ptxas.txt" 2>/dev/null | head -20
printf '%s\n' "${summary[@]}"
exit $status
