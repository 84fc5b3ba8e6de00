# libFuzzer targets (fuzz/README.md). Included from the top-level Makefile:
#   include fuzz/fuzz.mk
# Targets:
#   fuzz-build   install clang + libFuzzer runtime if missing, build every target into build-fuzz/
#   fuzz         run every target FUZZ_SECONDS (default 600) each; fails on any crash
#   fuzz-smoke   FUZZ_SMOKE_SECONDS (default 20) each, seed FUZZ_SMOKE_SEED (1), seeds-only corpus (CI)
#   fuzz-regress run every target once over fuzz/regressions/<target>/ (reproducers of fixed bugs)
#   fuzz-clean   remove build-fuzz/
# Runs can go in parallel (make -j2 fuzz); FUZZ_TARGETS selects a subset.

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 20
FUZZ_SMOKE_SEED ?= 1
FUZZ_JOBS ?= $(shell nproc)
FUZZ_TARGETS ?= fuzz_safetensors fuzz_config fuzz_tokenizer_json fuzz_tokenizer_encode \
  fuzz_device_map fuzz_small_parsers fuzz_output_folder fuzz_corpus
# clang + libFuzzer/ASan/UBSan runtimes, and what the library itself needs.
FUZZ_APT_PACKAGES := clang libclang-rt-14-dev cmake pkg-config libtorch-dev nlohmann-json3-dev \
  libcli11-dev libxxhash-dev libpcre2-dev libicu-dev

.PHONY: fuzz-deps fuzz-build fuzz fuzz-smoke fuzz-regress fuzz-clean

# Idempotent: apt-get runs only when a package is missing.
fuzz-deps:
	@missing=$$(for p in $(FUZZ_APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(FUZZ_BUILD)/CMakeCache.txt: fuzz/CMakeLists.txt | fuzz-deps
	cmake -S fuzz -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=clang++

fuzz-build: fuzz-deps $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(FUZZ_JOBS)

# One rule per target run; FUZZ_RUN_SECONDS comes from fuzz / fuzz-smoke (target-specific
# variables reach prerequisites).
fuzz-run-%: fuzz-build
	FUZZ_SEED=$(FUZZ_RUN_SEED) FUZZ_FRESH=$(FUZZ_RUN_FRESH) fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_RUN_SECONDS) $*

# Exploration: random seed, on the corpus grown by earlier runs.
fuzz: FUZZ_RUN_SECONDS = $(FUZZ_SECONDS)
fuzz: $(addprefix fuzz-run-,$(FUZZ_TARGETS))

# CI: a fixed seed from the committed seeds alone, so every clean checkout starts from the same
# inputs and random sequence (a new finding comes from a change, not from luck), and a local run
# with the same seed and more seconds covers what CI runs.
fuzz-smoke: FUZZ_RUN_SECONDS = $(FUZZ_SMOKE_SECONDS)
fuzz-smoke: FUZZ_RUN_SEED = $(FUZZ_SMOKE_SEED)
fuzz-smoke: FUZZ_RUN_FRESH = 1
fuzz-smoke: $(addprefix fuzz-run-,$(FUZZ_TARGETS))

fuzz-regress: fuzz-build
	fuzz/run.sh $(FUZZ_BUILD) regress $(FUZZ_TARGETS)

fuzz-clean:
	rm -rf $(FUZZ_BUILD)
