#!/usr/bin/env bash
# Installs what kvattn needs to build and test on a Debian machine: a C compiler,
# make, CMake (>= 3.20) and pkg-config; for the aarch64 CI step (`make test-aarch64`) the cross
# compiler and qemu user-mode emulation (qemu-x86_64 of the same package runs `make test-no-avx`);
# clang with libFuzzer for the fuzzers (`make fuzz`) and ThreadSanitizer (`make
# test-tsan`); for the Python package and its tests, Python 3 with its development headers and
# pip, then python/requirements-test.txt from PyPI (numpy, pytest, matplotlib). The CUDA backend
# is built only if nvcc is on PATH (not installed here).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || need+=(make)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if ! command -v python3 >/dev/null 2>&1; then
    need+=(python3 python3-dev python3-pip python3-venv)
elif ! python3 -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
    need+=(python3-dev)
fi
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# The fuzzers and the TSan build need clang with libFuzzer; the rest builds with gcc.
command -v clang >/dev/null 2>&1 || need+=(clang)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
    need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${need[@]}"
fi
echo "dependencies: $(cc --version | head -1); $(cmake --version | head -1); nvcc: $(command -v nvcc || echo none)"
echo "aarch64: $(aarch64-linux-gnu-gcc --version | head -1); $(qemu-aarch64 --version | head -1)"
if ! python3 -c 'import numpy, pytest, matplotlib' 2>/dev/null; then
    echo "installing python/requirements-test.txt (PyPI)"
    # Debian's own python3 refuses system-wide pip installs (PEP 668) unless told otherwise.
    python3 -m pip install -q -r python/requirements-test.txt 2>/dev/null ||
        python3 -m pip install -q --break-system-packages -r python/requirements-test.txt
fi
echo "dependencies: $(cc --version | head -1); $(cmake --version | head -1); $(python3 --version);" \
     "nvcc: $(command -v nvcc || echo none)"
