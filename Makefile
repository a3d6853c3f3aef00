# Thin wrapper over CMake. `make test` is the test command of README.md.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTHON ?= $(shell command -v python3 2>/dev/null)
PY_FLAGS = $(if $(PYTHON),-DPython_EXECUTABLE=$(PYTHON),)

FUZZ_TIME ?= 600
FUZZ_TARGETS = fuzz_planner fuzz_cache fuzz_block_table fuzz_merge

.PHONY: all build test test-asan test-tsan test-aarch64 test-no-avx fuzz fuzz-ci fuzz-build clean \
	run bench install-check

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
	# (not the fork test: qemu-user asserts when a guest with threads forks, qemu_plugin_vcpu_init_hook)
	KVA_TEST_QUICK=1 qemu-aarch64 -L /usr/aarch64-linux-gnu ./build-aarch64/kvattn_tests -thread_pool_survives_fork

# The same x86-64 binary on an emulated CPU without AVX (qemu-x86_64 -cpu Nehalem): dispatch must
# pick the generic variant and nothing outside the AVX variants may use AVX. CPU tests, quick.
test-no-avx: build
	KVA_TEST_QUICK=1 qemu-x86_64 -cpu Nehalem ./$(BUILD)/kvattn_tests cpu decode prefill attention

# libFuzzer targets (fuzz/, clang): each runs FUZZ_TIME seconds from its committed seed corpus
# (fuzz/corpus/<name>, read only) plus a scratch corpus in build-fuzz/ that grows across runs.
# A finding stops the run and leaves crash-* in build-fuzz/; replay: build-fuzz/fuzz_x crash-...
fuzz-build:
	@command -v clang >/dev/null 2>&1 || bash scripts/install-deps.sh
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVA_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j $(JOBS)

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	    name=$${t#fuzz_}; mkdir -p build-fuzz/corpus-$$name; \
	    echo "== $$t for $(FUZZ_TIME) s"; \
	    (cd build-fuzz && ./$$t corpus-$$name ../fuzz/corpus/$$name -max_total_time=$(FUZZ_TIME) \
	        -max_len=512 -print_final_stats=1 2>&1 | grep -E "^(Done|stat::number_of_executed_units|==|fuzz check)|ERROR|SUMMARY|runtime error") \
	        || true; \
	    if ls build-fuzz/crash-* build-fuzz/leak-* build-fuzz/timeout-* >/dev/null 2>&1; then \
	        echo "$$t found a failing input:"; ls build-fuzz/crash-* build-fuzz/leak-* build-fuzz/timeout-* 2>/dev/null; exit 1; fi; \
	done

# CI: one minute per target.
fuzz-ci:
	$(MAKE) fuzz FUZZ_TIME=60

# A ThreadSanitizer build (CPU) that runs the threads test (several contexts, several threads)
# and the worker pool's tests (src/common/thread_pool.c: C11 atomics and pthreads, which TSan
# sees natively).
test-tsan:
	@command -v clang >/dev/null 2>&1 || bash scripts/install-deps.sh
	CC=clang cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVA_TSAN=ON -DKVA_CUDA=OFF >/dev/null
	cmake --build build-tsan -j $(JOBS) --target kvattn_tests
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ./build-tsan/kvattn_tests threads_ thread_pool

run: build
	./$(BUILD)/kvattn run

bench: build
	./$(BUILD)/kvattn bench

# `cmake --install` into a temporary prefix; build examples/decode_step.c against it (CMake and
# pkg-config, shared and static).
install-check: build
	@bash scripts/check-install.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-aarch64 build-fuzz build-tsan
