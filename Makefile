# actcap — build, test, demo, bench. Every target installs what it needs first (make deps).
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
PY := /usr/bin/python3
APT_PACKAGES := build-essential cmake pkg-config libtorch-dev libopenblas0-pthread \
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev \
  libpcre2-dev libicu-dev python3-torch python3-numpy python3-pytest

.PHONY: deps build test demo bench clean format sanitize

# Idempotent: apt-get runs only when a package is missing.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/CMakeCache.txt: CMakeLists.txt | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	ACTCAP=$(abspath $(BUILD))/actcap $(PY) -m pytest -q tests/python tests/integration

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

# The unit suite under AddressSanitizer + UndefinedBehaviorSanitizer (the writer thread and the
# executor are exercised by the extract tests in the same binary).
sanitize: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACTCAP_SANITIZE=address,undefined
	cmake --build build-asan -j $(JOBS) --target actcap_tests
	ASAN_OPTIONS=detect_leaks=0:alloc_dealloc_mismatch=0 UBSAN_OPTIONS=print_stacktrace=1 build-asan/actcap_tests --gtest_brief=1

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD)
