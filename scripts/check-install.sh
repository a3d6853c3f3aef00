#!/usr/bin/env bash
# check-install.sh BUILD -- installs the build in BUILD into a temporary prefix
# (`cmake --install`) and builds examples/decode_step.c against the installed copy four ways:
# find_package(kvattn) with kvattn::kvattn (shared) and kvattn::kvattn_static, and pkg-config
# with the shared and the static library; each program is run once (CPU). CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PREFIX=$(mktemp -d /tmp/kvattn-prefix.XXXXXX)
WORK=$(mktemp -d /tmp/kvattn-consumer.XXXXXX)
trap 'rm -rf "$PREFIX" "$WORK"' EXIT

cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
echo "installed into a temporary prefix:"
(cd "$PREFIX" && find . -type f -o -type l | sort | sed 's/^\./  /')
if [ -e "$PREFIX/kvattn" ]; then echo "the Python extension leaked into the C install"; exit 1; fi
soname=$(objdump -p "$PREFIX"/lib*/libkvattn.so | awk '/SONAME/ {print $2}')
echo "SONAME: $soname"
[ -n "$soname" ] && [ "$soname" != "libkvattn.so" ]
"$PREFIX/bin/kvattn" --help >/dev/null 2>&1 || "$PREFIX/bin/kvattn" help >/dev/null 2>&1 || true

# 1, 2: CMake
mkdir -p "$WORK/cmake"
cp examples/decode_step.c "$WORK/cmake/"
cat >"$WORK/cmake/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(kvattn_consumer C)
find_package(kvattn 0.1 REQUIRED)
add_executable(decode_step_shared decode_step.c)
target_link_libraries(decode_step_shared PRIVATE kvattn::kvattn)
add_executable(decode_step_static decode_step.c)
target_link_libraries(decode_step_static PRIVATE kvattn::kvattn_static)
if(kvattn_HAS_CUDA)
  # the static library carries CUDA host code: link with the C++ runtime it needs
  target_link_libraries(decode_step_static PRIVATE stdc++)
endif()
CMAKE
cmake -S "$WORK/cmake" -B "$WORK/cmake/build" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$WORK/cmake/build" >/dev/null
"$WORK/cmake/build/decode_step_shared" >"$WORK/out1.txt"
"$WORK/cmake/build/decode_step_static" >"$WORK/out2.txt"
echo "find_package(kvattn): kvattn::kvattn ok, kvattn::kvattn_static ok ($(tail -1 "$WORK/out1.txt"))"

# 3, 4: pkg-config
PKG_CONFIG_PATH="$(dirname "$(find "$PREFIX" -name kvattn.pc)")"
export PKG_CONFIG_PATH
# (pkg-config's flags are meant to split into words)
# shellcheck disable=SC2046
cc -O2 examples/decode_step.c $(pkg-config --cflags --libs kvattn) -Wl,-rpath,"$(pkg-config --variable=libdir kvattn)" \
    -o "$WORK/decode_step_pc"
"$WORK/decode_step_pc" >"$WORK/out3.txt"
libdir=$(pkg-config --variable=libdir kvattn)
# static: the archive in place of -lkvattn, then Libs.private (threads, libm, CUDA runtime)
# shellcheck disable=SC2046
cc -O2 examples/decode_step.c $(pkg-config --cflags kvattn) \
    $(pkg-config --static --libs kvattn | sed "s|-lkvattn|$libdir/libkvattn.a|") -o "$WORK/decode_step_pc_static"
"$WORK/decode_step_pc_static" >"$WORK/out4.txt"
if ldd "$WORK/decode_step_pc_static" | grep -q libkvattn; then
    echo "static pkg-config build still links libkvattn.so"; exit 1
fi
cmp -s "$WORK/out1.txt" "$WORK/out3.txt" && cmp -s "$WORK/out1.txt" "$WORK/out4.txt" && cmp -s "$WORK/out1.txt" "$WORK/out2.txt"
echo "pkg-config kvattn: shared ok, static ok"
echo "install check: ok (4 consumers built and run)"
