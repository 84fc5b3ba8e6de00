#!/usr/bin/env bash
# The GPU check kit (issue 15; DEVELOPERS.md "GPU checks"). Runs on a machine with CUDA PyTorch,
# CMake and a C++ compiler but no package registry (the device tool's GPU machine), from the root of
# a checkout that carries gpu-bundle/ (`make gpu-bundle`, run where Debian's apt works):
#
#   scripts/gpu-check.sh REPORT_DIR [STAGE ...]
#
# Stages, in order (default: all): unpack configure build unit doctor compare mixed repro python bench.
# unpack   the bundle's .debs into a private prefix (build-gpu/prefix), .pc files re-pointed there;
#          never over /
# configure  CMake against python3's torch (torch.utils.cmake_prefix_path) and the prefix, into
#          build-gpu/ (Ninja when present), warnings not errors (a newer compiler and LibTorch)
# build    every target, every core
# unit     the unit suite (CUDA tests run when a device is present)
# doctor   `actcap doctor` over cuda:0 and cpu
# compare  `actcap compare` of every architecture's tiny model: cuda:0 alone, and cuda:0 + cpu
# mixed    an extract split over cuda:0,cpu:1,cpu:2, verified
# repro    `actcap repro`
# python   the Python package's tests (test_package_*.py; the CUDA ones need transformers and
#          accelerate) against build-gpu/python
# bench    bench/gpu_bench.py (actcap vs transformers on gpt2-small, Llama-3.2-1B and 8B shapes, bf16;
#          capture cost; device->host GB/s) into REPORT_DIR/bench.md and bench.json, its own time
#          budget GPU_BENCH_BUDGET (default 180 s) under the stage timeout GPU_BENCH_TIMEOUT
#          (default 240 s); its tables are appended to report.md
#
# Writes REPORT_DIR/report.md (a line per stage: status, seconds, the log's tail on failure) and
# REPORT_DIR/logs.txt (every stage's log). Touches nothing outside the checkout and REPORT_DIR.
# Environment: PYTHON (default python3), JOBS (default nproc), GPU_BUNDLE (default gpu-bundle),
# GPU_BUILD (default build-gpu; relative paths are inside the checkout), GPU_CMAKE_ARGS (more
# configure arguments, e.g. -DCMAKE_CXX_STANDARD=20), GPU_CHECK_TIMEOUT per stage in seconds (default 420;
# the bench stage has its own, GPU_BENCH_TIMEOUT), GPU_BENCH_ARGS (more bench/gpu_bench.py arguments,
# e.g. --quick).
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: scripts/gpu-check.sh REPORT_DIR [STAGE ...]" >&2
  exit 2
fi
REPORT=$(mkdir -p "$1" && cd "$1" && pwd)
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
BUNDLE=${GPU_BUNDLE:-gpu-bundle}
BUILD=${GPU_BUILD:-build-gpu}
STAGE_TIMEOUT=${GPU_CHECK_TIMEOUT:-420}
BENCH_TIMEOUT=${GPU_BENCH_TIMEOUT:-240}
BENCH_BUDGET=${GPU_BENCH_BUDGET:-180}
case $BUILD in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
case $BUNDLE in /*) ;; *) BUNDLE="$ROOT/$BUNDLE" ;; esac
PREFIX="$BUILD/prefix"
LOGS="$BUILD/logs"
ALL_STAGES="unpack configure build unit doctor compare mixed repro python bench"
STAGES=${*:-$ALL_STAGES}
mkdir -p "$LOGS"
: > "$REPORT/logs.txt"

{
  echo "# actcap GPU check"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "- machine: $(nproc) cores; $(uname -srm)"
  echo "- python: $($PYTHON -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1 | tail -1)"
  command -v nvidia-smi > /dev/null && echo "- gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
  echo "- compiler: $(${CXX:-c++} --version 2>&1 | head -1); cmake: $(cmake --version 2>&1 | head -1); ninja: $(ninja --version 2>/dev/null || echo none)"
  echo "- nvcc: $( (command -v nvcc > /dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | grep -i release | head -1 || echo 'not found')"
  echo "- python headers and pybind11: $($PYTHON - 2>&1 <<'PY' | tail -1
import os, re, sysconfig
inc = sysconfig.get_paths().get("include") or ""
have = os.path.exists(os.path.join(inc, "Python.h"))
try:
    import torch
    p = os.path.join(os.path.dirname(torch.__file__), "include", "pybind11", "detail", "common.h")
    if os.path.exists(p):
        v = ".".join(re.findall(r"#define PYBIND11_VERSION_(?:MAJOR|MINOR|PATCH) (\S+)", open(p).read()))
        torch_pb = "torch's pybind11 " + v
    else:
        torch_pb = "torch ships no pybind11"
except Exception as e:
    torch_pb = f"torch cannot be imported ({type(e).__name__})"
try:
    import pybind11
    pip_pb = "pybind11 package " + pybind11.__version__
except Exception:
    pip_pb = "no pybind11 package"
print(f"Python.h {'found' if have else 'MISSING'} in {inc}; {torch_pb}; {pip_pb}")
PY
)"
  echo
  echo "| stage | status | seconds |"
  echo "| --- | --- | ---: |"
} > "$REPORT/report.md"

FAILURES=""
TAILS=""

# run_stage NAME CMD...: the command's output goes to the stage's log; a line in the report.
run_stage() {
  local name=$1
  shift
  local log="$LOGS/$name.log" start=$SECONDS rc limit=$STAGE_TIMEOUT
  [ "$name" = bench ] && limit=$BENCH_TIMEOUT
  echo "== $name: $*" | tee "$log"
  # the stage function runs in a child bash (exported below) so that timeout can stop it
  timeout "$limit" bash -c "$*" >> "$log" 2>&1
  rc=$?
  local secs=$((SECONDS - start)) status=ok
  if [ $rc -eq 124 ]; then status="timed out (${limit} s)"; elif [ $rc -ne 0 ]; then status="FAILED (exit $rc)"; fi
  echo "| $name | $status | $secs |" >> "$REPORT/report.md"
  { echo "===== $name ($status, $secs s)"; cat "$log"; echo; } >> "$REPORT/logs.txt"
  echo "   $name: $status, $secs s"
  if [ "$status" != ok ]; then
    FAILURES="$FAILURES $name"
    TAILS="$TAILS"$'\n'"### $name"$'\n\n```\n'"$(tail -n 30 "$log")"$'\n```\n'
  fi
  return $rc
}

stage_unpack() {
  local debs=("$BUNDLE"/*.deb)
  if [ ! -e "${debs[0]}" ]; then
    echo "no .deb files in $BUNDLE/: run \`make gpu-bundle\` where apt works and carry $BUNDLE"
    return 1
  fi
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  for d in "${debs[@]}"; do
    echo "unpack $(basename "$d")"
    dpkg-deb -x "$d" "$PREFIX" || return 1
  done
  # pkg-config files name /usr as their prefix: point them at the private one.
  local pc
  for pc in "$PREFIX"/usr/lib/*/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc; do
    [ -e "$pc" ] || continue
    sed -i -E "s#^(prefix[[:space:]]*=[[:space:]]*)/usr[[:space:]]*\$#\\1$PREFIX/usr#" "$pc"
  done
  ls "$PREFIX"/usr/lib/*/pkgconfig/ "$PREFIX"/usr/share/pkgconfig/ 2>/dev/null
}

prefix_env() {
  local multiarch
  multiarch=$(ls -d "$PREFIX"/usr/lib/*-linux-gnu 2>/dev/null | head -1)
  export PKG_CONFIG_PATH="$multiarch/pkgconfig:$PREFIX/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! command -v pkg-config > /dev/null && [ -x "$PREFIX/usr/bin/pkgconf" ]; then
    export PKG_CONFIG="$PREFIX/usr/bin/pkgconf"
  fi
}

stage_configure() {
  prefix_env
  local torch_prefix generator=()
  torch_prefix=$($PYTHON -c 'import os, torch.utils as u; p = u.cmake_prefix_path; print(p if os.path.isdir(p) else "")') || return 1
  command -v ninja > /dev/null && generator=(-G Ninja)
  local pkgconf_arg=()
  [ -n "${PKG_CONFIG:-}" ] && pkgconf_arg=(-DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG")
  # The Python package needs Python's headers: without them the rest still builds and is checked
  # (the python stage then fails, saying why).
  local python_arg=()
  if ! $PYTHON -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    echo "no Python.h for $PYTHON: configuring without the Python package (-DACTCAP_BUILD_PYTHON=OFF)"
    python_arg=(-DACTCAP_BUILD_PYTHON=OFF)
    rm -rf "$BUILD/python"  # an earlier run's package must not be tested as this one's
  fi
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="${torch_prefix:+$torch_prefix;}$PREFIX/usr" \
    -DPython_EXECUTABLE="$(command -v "$PYTHON")" -DACTCAP_WERROR=OFF "${pkgconf_arg[@]}" \
    "${python_arg[@]}" ${GPU_CMAKE_ARGS:-}
}

# Warnings stay warnings here (ACTCAP_WERROR=OFF); those in actcap's own files are listed in the
# report, since the default build (-Werror) would stop on them with this compiler.
stage_build() {
  prefix_env
  cmake --build "$BUILD" -j "$JOBS"
  local rc=$? own
  own=$(grep -E "^($ROOT/|(\.\./)+)?(src|cli|include|python|tests|bench|examples)/[^:]+:[0-9]+:[0-9]+: warning:" "$LOGS/build.log" | sort -u)
  if [ -n "$own" ]; then
    echo "$own" > "$BUILD/own-warnings.txt"
  else
    rm -f "$BUILD/own-warnings.txt"
  fi
  return $rc
}

stage_python() {
  prefix_env
  if [ ! -d "$BUILD/python/actcap" ]; then
    echo "no Python package in $BUILD/python (configure found no Python.h for $PYTHON; see its log)"
    return 1
  fi
  ACTCAP="$BUILD/actcap" CI=true PYTHONUNBUFFERED=1 $PYTHON -m pytest -q -p no:cacheprovider \
    tests/python/test_package_cuda.py tests/python/test_package_capture.py tests/python/test_package_engine.py -rs
}

stage_unit() { prefix_env; "$BUILD/actcap_tests" --gtest_brief=1; }

# Every architecture's tiny model, made once.
models() {
  local arch
  for arch in gpt2 llama mistral qwen2 qwen3 olmo2 gemma2 gemma3_text gemma3 gpt_neox phi3; do
    [ -f "$BUILD/models/$arch/config.json" ] ||
      "$BUILD/actcap" init-model --arch "$arch" --preset tiny --seed 1 --out "$BUILD/models/$arch" > /dev/null || return 1
    echo "$arch"
  done
}

stage_doctor() { prefix_env; "$BUILD/actcap" doctor --devices cuda:0,cpu:1; }

stage_compare() {
  prefix_env
  local arch rc=0 list
  list=$(models) || return 1
  for arch in $list; do
    for devices in cuda:0 cuda:0,cpu:1; do
      echo "--- $arch --devices $devices"
      "$BUILD/actcap" compare "$BUILD/models/$arch" --tokens "1,2,3,4,5,6,7;8,9,10" --devices "$devices" || rc=1
    done
  done
  return $rc
}

stage_mixed() {
  prefix_env
  "$BUILD/actcap" extract demo --input data/demo_corpus.txt --devices cuda:0,cpu:1,cpu:2 \
    --capture 'transformer.h.*' --out "$BUILD/mixed-out" --overwrite --shard-size 1MiB &&
    "$BUILD/actcap" verify "$BUILD/mixed-out"
}

stage_repro() { prefix_env; "$BUILD/actcap" repro; }

# The GPU benchmark: writes bench.md (its tables, appended to report.md at the end) and bench.json.
# Checkpoints are cached in $BUILD/gpu-bench-models for a rerun on the same machine.
stage_bench() {
  prefix_env
  rm -f "$REPORT/bench.md" "$REPORT/bench.json"
  # exec: the stage timeout's SIGTERM reaches the benchmark, which still writes its report
  PYTHONUNBUFFERED=1 exec $PYTHON bench/gpu_bench.py --actcap "$BUILD/actcap" --python-dir "$BUILD/python" \
    --models-dir "$BUILD/gpu-bench-models" --budget-s "$BENCH_BUDGET" \
    --out "$REPORT/bench.md" --json-out "$REPORT/bench.json" ${GPU_BENCH_ARGS:-}
}

export ROOT PYTHON JOBS BUNDLE BUILD PREFIX LOGS REPORT BENCH_BUDGET
export -f prefix_env models stage_unpack stage_configure stage_build stage_unit stage_doctor \
  stage_compare stage_mixed stage_repro stage_python stage_bench

status=0
for s in $STAGES; do
  case " $ALL_STAGES " in *" $s "*) ;; *) echo "unknown stage '$s' (stages: $ALL_STAGES)" >&2; exit 2 ;; esac
  # configure and build need the ones before them; the checks after build run regardless of
  # each other's results.
  if ! run_stage "$s" "stage_$s"; then
    status=1
    case $s in unpack | configure | build) echo "stopping: later stages need $s" ; break ;; esac
  fi
done

{
  echo
  if [ -z "$FAILURES" ]; then echo "All stages passed."; else echo "Failed:$FAILURES"; fi
  if [ -s "$BUILD/own-warnings.txt" ]; then
    echo
    echo "Warnings in actcap's own code ($(wc -l < "$BUILD/own-warnings.txt"); the default -Werror build stops on them):"
    echo '```'
    head -n 40 "$BUILD/own-warnings.txt" | sed -E "s#^($ROOT/|(\.\./)+)##"
    echo '```'
  fi
  printf '%s\n' "$TAILS"
  if [ -s "$REPORT/bench.md" ]; then
    echo
    cat "$REPORT/bench.md"
  fi
} >> "$REPORT/report.md"
echo "report: $REPORT/report.md"
exit $status
