#!/usr/bin/env bash
# Installs what kvattn needs to build and test on a Debian machine: a C compiler with OpenMP,
# make and CMake (>= 3.20), and for the aarch64 CI step (`make test-aarch64`) the cross compiler
# and qemu user-mode emulation. The CUDA backend is built only if nvcc is on PATH (not installed
# here).
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || need+=(make)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${need[@]}"
fi
echo "dependencies: $(cc --version | head -1); $(cmake --version | head -1); nvcc: $(command -v nvcc || echo none)"
echo "aarch64: $(aarch64-linux-gnu-gcc --version | head -1); $(qemu-aarch64 --version | head -1)"
