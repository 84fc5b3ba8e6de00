# actcap — build, test, demo, bench. Every target installs what it needs first (make deps).
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
PY := /usr/bin/python3
APT_PACKAGES := build-essential cmake pkg-config libtorch-dev libopenblas0-pthread \
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev \
  libpcre2-dev libicu-dev python3-torch python3-numpy python3-pytest python3-pytest-xdist \
  python3-dev pybind11-dev python3-pybind11 python3-setuptools python3-wheel python3-pip python3-venv \
  libopenmpi-dev openmpi-bin

.PHONY: deps build test demo bench clean format sanitize sanitize-address sanitize-thread ci-extra gpu-bundle torch2-check

# Idempotent: apt-get runs only when a package is missing. Node.js and npm (the tokenizer parity
# test's reference, tests/python/test_tokenizer_parity.py) are looked for as commands, not packages:
# an existing install from elsewhere (e.g. nodesource's nodejs, which ships npm) is kept, and
# Debian's `nodejs` / `npm` are installed only for a command that is missing.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/CMakeCache.txt: CMakeLists.txt | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PY)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@echo "== examples/embed.cpp against the installed package (find_package(actcap))"
	rm -rf $(BUILD)/install $(BUILD)/example-installed
	cmake --install $(BUILD) --prefix $(abspath $(BUILD))/install > /dev/null
	cmake -S examples -B $(BUILD)/example-installed -DCMAKE_PREFIX_PATH=$(abspath $(BUILD))/install > /dev/null
	cmake --build $(BUILD)/example-installed -j $(JOBS)
	$(BUILD)/example-installed/embed $(BUILD)/example-installed/out
	ACTCAP=$(abspath $(BUILD))/actcap $(PY) -m pytest -q -n $(JOBS) tests/python tests/integration

demo: build
	$(BUILD)/actcap extract demo --input data/demo_corpus.txt --devices 3 \
	  --capture 'transformer.h.*' --out $(BUILD)/demo-out --overwrite --shard-size 1MiB
	$(BUILD)/actcap verify $(BUILD)/demo-out
	@echo
	@echo "Activations of every block of the demo model, split over 3 virtual devices, are in $(BUILD)/demo-out/"
	@echo "(manifest.json lists the shards and their checksums). Load one with numpy alone:"
	@echo
	@echo "  import json, struct, numpy as np"
	@echo "  f = open('$(BUILD)/demo-out/shard-00000.safetensors', 'rb').read(); n = struct.unpack('<Q', f[:8])[0]; h = json.loads(f[8:8 + n])"
	@echo "  a = np.frombuffer(f[8 + n:], np.uint8)[slice(*h['transformer.h.3']['data_offsets'])].view(np.float32).reshape(h['transformer.h.3']['shape']); print(a.shape)"

bench: build
	$(PY) bench/run_bench.py --actcap $(BUILD)/actcap

# Sanitizer runs of the unit suite (it includes in-process extract runs, so the writer thread and
# the executor are exercised): AddressSanitizer + UndefinedBehaviorSanitizer, then ThreadSanitizer.
# LibTorch itself is not instrumented; OpenMP stays at one thread under TSan (libgomp is not
# instrumented either, so its barriers would read as races).
sanitize: sanitize-address sanitize-thread

# Built with clang in the fuzz build (fuzz/CMakeLists.txt), sharing its instrumented library.
sanitize-address: fuzz-build
	ASAN_OPTIONS=detect_leaks=0:alloc_dealloc_mismatch=0:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(FUZZ_BUILD)/actcap_tests --gtest_brief=1

sanitize-thread: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" -DACTCAP_SANITIZE=thread -DACTCAP_BUILD_PYTHON=OFF
	cmake --build build-tsan -j $(JOBS) --target actcap_tests
	OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 build-tsan/actcap_tests --gtest_brief=1

# The GPU check kit (scripts/gpu-check.sh): the Debian packages our build needs that the GPU
# machine lacks (it has CUDA PyTorch, CMake, ninja, a compiler, no package registry), downloaded
# here into $(GPU_BUNDLE)/ (ignored), to travel with the working tree and unpack there into a
# private prefix. Needs `apt-get update` to have run.
GPU_BUNDLE ?= gpu-bundle
GPU_BUNDLE_PACKAGES := nlohmann-json3-dev libcli11-dev libxxhash-dev libxxhash0 libpcre2-dev \
  libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu-dev libicu72 libgtest-dev \
  libgmock-dev pkgconf pkgconf-bin libpkgconf3 python3-pytest python3-pluggy python3-iniconfig \
  python3-packaging python3-py python3-attr

gpu-bundle:
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)
	cd $(GPU_BUNDLE) && apt-get download $(GPU_BUNDLE_PACKAGES)
	@du -sh $(GPU_BUNDLE); ls $(GPU_BUNDLE)

# The build and the tests against LibTorch 2.x on this CPU machine (scripts/torch2-check.sh): Debian
# sid's libtorch-dev and python3-torch in a root made with debootstrap under build-torch2/ (needs
# root and deb.debian.org; not part of CI). Report: build-torch2/report/report.md.
torch2-check:
	scripts/torch2-check.sh build-torch2/report

# What CI runs after `make test`: sanitizers, fuzz regressions and a short fuzz of every target.
ci-extra: sanitize fuzz-regress fuzz-smoke

include fuzz/fuzz.mk

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD)
