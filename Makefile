# Thin wrapper over CMake. `make test` is the test command of README.md.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all build test test-asan test-aarch64 test-no-avx clean run bench

all: build

build:
	@command -v cmake >/dev/null 2>&1 || bash scripts/install-deps.sh
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

test: build
	./$(BUILD)/kvattn_tests

# CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer (no CUDA in this build).
test-asan:
	@command -v cmake >/dev/null 2>&1 || bash scripts/install-deps.sh
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVA_SANITIZE=ON -DKVA_CUDA=OFF >/dev/null
	cmake --build build-asan -j $(JOBS)
	KVA_TEST_QUICK=1 ./build-asan/kvattn_tests

# The CPU backend cross-compiled for aarch64 (NEON and generic variants), quick tests under
# qemu-aarch64 (scripts/install-deps.sh installs both).
test-aarch64:
	@command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1 || bash scripts/install-deps.sh
	cmake -S . -B build-aarch64 -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=OFF \
		-DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake >/dev/null
	cmake --build build-aarch64 -j $(JOBS) --target kvattn_tests
	KVA_TEST_QUICK=1 qemu-aarch64 -L /usr/aarch64-linux-gnu ./build-aarch64/kvattn_tests

# The same x86-64 binary on an emulated CPU without AVX (qemu-x86_64 -cpu Nehalem): dispatch must
# pick the generic variant and nothing outside the AVX variants may use AVX. CPU tests, quick.
test-no-avx: build
	KVA_TEST_QUICK=1 qemu-x86_64 -cpu Nehalem ./$(BUILD)/kvattn_tests cpu decode prefill attention

run: build
	./$(BUILD)/kvattn run

bench: build
	./$(BUILD)/kvattn bench

clean:
	rm -rf $(BUILD) build-asan build-aarch64
