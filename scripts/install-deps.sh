#!/usr/bin/env bash
# Installs what kvattn needs to build and test on a Debian machine: a C compiler with OpenMP,
# make and CMake (>= 3.20), and clang with libFuzzer and OpenMP for the fuzzers. The CUDA backend is built only if nvcc is on PATH (not installed here).
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || need+=(make)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
# The fuzzers (make fuzz) need clang with libFuzzer and OpenMP; the rest builds with gcc.
command -v clang >/dev/null 2>&1 || need+=(clang)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
    need+=(libclang-rt-14-dev)
ls /usr/lib/llvm-*/lib/libomp.so >/dev/null 2>&1 || need+=(libomp-dev)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${need[@]}"
fi
echo "dependencies: $(cc --version | head -1); $(cmake --version | head -1); nvcc: $(command -v nvcc || echo none)"
