# Thin wrapper over CMake. `make test` is the test command of README.md.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTHON ?= $(shell command -v python3 2>/dev/null)
PY_FLAGS = $(if $(PYTHON),-DPython_EXECUTABLE=$(PYTHON),)

.PHONY: all build test test-asan clean run bench install-check

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

run: build
	./$(BUILD)/kvattn run

bench: build
	./$(BUILD)/kvattn bench

# `cmake --install` into a temporary prefix; build examples/decode_step.c against it (CMake and
# pkg-config, shared and static).
install-check: build
	@bash scripts/check-install.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan
