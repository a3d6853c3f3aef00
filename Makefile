# Thin wrapper over CMake. `make test` is the test command of README.md.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all build test test-asan clean run bench

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
	@echo "== the GPU prefill sweep on the CPU backend (checks the sweep itself; ASan + UBSan) =="
	KVA_TEST_QUICK=1 KVA_TEST_PREFILL_DEVICE=cpu ./build-asan/kvattn_tests cuda_prefill

run: build
	./$(BUILD)/kvattn run

bench: build
	./$(BUILD)/kvattn bench

clean:
	rm -rf $(BUILD) build-asan
