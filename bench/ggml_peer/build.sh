#!/bin/sh
# build.sh -- builds ggml's CPU backend at a pinned commit in a temporary directory and links
# fa_peer.c against it: ggml's flash attention as a peer for `kvattn bench` (see fa_peer.c).
# ggml is never a dependency of kvattn, its build or its tests; nothing here touches them.
#
#   bench/ggml_peer/build.sh [WORKDIR]   (default: a new mktemp -d directory)
#   GGML_SRC=/path/to/ggml               use this git checkout instead of cloning (it is checked
#                                        out at the pinned commit in a clone of its own)
#   GGML_CMAKE_ARGS="-DGGML_NATIVE=OFF"  extra ggml CMake options; this one gives ggml's
#                                        portable x86 build (AVX2 + FMA + F16C, no AVX-512)
# Prints the path of the fa_peer binary last. ggml builds as it does by default: Release,
# GGML_NATIVE (-march=native), OpenMP threads; CUDA and every other backend off.
set -eu

GGML_COMMIT=d99724f2b141fed9e1a9f402213506c081433465
GGML_URL=https://github.com/ggml-org/ggml
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-$(mktemp -d /tmp/ggml-peer.XXXXXX)}
mkdir -p "$work"
src="$work/ggml"

if [ ! -d "$src" ]; then
    git clone -q "${GGML_SRC:-$GGML_URL}" "$src"
fi
git -C "$src" checkout -q "$GGML_COMMIT"

cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF ${GGML_CMAKE_ARGS:-} >"$work/cmake.log"
cmake --build "$work/build" -j "${JOBS:-2}" --target ggml-cpu ggml-base ggml >"$work/build.log"

libs=$(find "$work/build" -name 'libggml*.a' | sort)
gcc -std=c11 -O2 -Wall -Wextra -I"$src/include" "$here/fa_peer.c" -o "$work/fa_peer" \
    -Wl,--start-group $libs -Wl,--end-group -fopenmp -lstdc++ -lm -lpthread
echo "ggml $(git -C "$src" rev-parse --short=12 HEAD)"
grep -m1 'CPU backend variant' "$work/cmake.log" || true
echo "$work/fa_peer"
