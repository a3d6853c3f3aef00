# Thin wrapper over CMake. `make test` is the test command of README.md.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTHON ?= $(shell command -v python3 2>/dev/null)
PY_FLAGS = $(if $(PYTHON),-DPython_EXECUTABLE=$(PYTHON),)

.PHONY: all build test test-asan test-aarch64 test-no-avx clean run bench install-check

all: build

build:
	@command -v cmake >/dev/null 2>&1 || bash scripts/install-deps.sh
	@echo "== configure: cmake -S . -B $(BUILD) $(CMAKE_FLAGS)"
	@mkdir -p $(BUILD)
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(PY_FLAGS) $(CMAKE_FLAGS) >$(BUILD)/configure.log 2>&1 \
		|| { cat $(BUILD)/configure.log; exit 1; }
	@grep "kvattn:" $(BUILD)/configure.log || true
	@echo "== build: library, kvattn command, tests, example, Python extension ($(JOBS) jobs)"
	@GNUMAKEFLAGS=--no-print-directory cmake --build $(BUILD) -j $(JOBS)

# The Python suite (pytest python/tests), then the C suite; ends with the C runner's summary.
test: build
	@PYTHON=$(PYTHON) bash scripts/run-tests.sh $(BUILD)

# CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer (no CUDA in this build).
test-asan:
	@command -v cmake >/dev/null 2>&1 || bash scripts/install-deps.sh
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVA_SANITIZE=ON -DKVA_CUDA=OFF -DKVA_PYTHON=OFF >/dev/null
	cmake --build build-asan -j $(JOBS)
	KVA_TEST_QUICK=1 ./build-asan/kvattn_tests
	@echo "== the GPU prefill sweep on the CPU backend (checks the sweep itself; ASan + UBSan) =="
	KVA_TEST_QUICK=1 KVA_TEST_PREFILL_DEVICE=cpu ./build-asan/kvattn_tests cuda_prefill

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

# `cmake --install` into a temporary prefix; build examples/decode_step.c against it (CMake and
# pkg-config, shared and static).
install-check: build
	@bash scripts/check-install.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-aarch64
