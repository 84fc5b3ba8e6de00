#!/usr/bin/env bash
# The GPU check kit (issue 15; DEVELOPERS.md "GPU checks"). Runs on a machine with CUDA PyTorch,
# CMake and a C++ compiler but no package registry (the device tool's GPU machine), from the root of
# a checkout that carries gpu-bundle/ (`make gpu-bundle`, run where Debian's apt works):
#
#   scripts/gpu-check.sh REPORT_DIR [STAGE ...]
#
# Stages, in order (default: all): unpack configure build unit doctor compare mixed repro python bench
# transformers.
# unpack   the bundle's .debs into a private prefix (build-gpu/prefix), .pc files re-pointed there;
#          never over /
# configure  CMake against python3's torch (torch.utils.cmake_prefix_path) and the prefix, into
#          build-gpu/ (Ninja when present), warnings not errors (a newer compiler and LibTorch), no
#          MPI; where no nvcc is found (a pip torch ships none, and its TorchConfig.cmake stops
#          without a CUDA toolkit), or torch's own package fails, through
#          scripts/torch_cmake_shim.py instead (actcap includes no CUDA header)
# build    the CLI, the unit suite and actcap_hash_bench, every core (the Python extension is built
#          by `python`, so that a failure there stops no C++ check); then each program's first
#          NEEDED library must be libstdc++ (cmake/LibstdcxxFirst.cmake: pip's LibTorch exports
#          copies of libstdc++ symbols, and binding to them crashed the first GPU run), the
#          extension's too in `python`
# unit     the unit suite; its Cuda.* tests (tests/unit/test_cuda.cpp) fail, not skip, without a GPU;
#          on a crash the log names the test and has the backtrace (run again under cuda-gdb or gdb);
#          then actcap_hash_bench --device cuda:0 (bench/hash_bench.cpp) into REPORT_DIR/hash-bench.txt
# doctor   `actcap doctor` over cuda:0 and cpu
# compare  `actcap compare` of every architecture's tiny model against the CPU: cuda:0 alone, and
#          cuda:0 + cpu:1, within 1e-4 (f32); three architectures in bf16 within 1e-1
# mixed    an extract split over cuda:0,cpu:1,cpu:2, verified
# repro    `actcap repro --on cuda:0 cuda:0,cpu:1,cpu:2`: clone and SafeCapturer exact
# python   builds the Python extension, then the Python package's tests (test_package_*.py)
#          against build-gpu/python, with ACTCAP_REQUIRE_CUDA=1: the CUDA ones fail, not skip,
#          without a device, transformers or accelerate; pytest from the bundle where python3 has none;
#          a crash of pytest itself gets a backtrace as in `unit`
# bench    bench/gpu_bench.py (actcap vs transformers on gpt2-small, Llama-3.2-1B and 8B shapes, bf16;
#          capture cost; device->host GB/s) into REPORT_DIR/bench.md and bench.json, its own time
#          budget GPU_BENCH_BUDGET (default 180 s) under the stage timeout GPU_BENCH_TIMEOUT
#          (default 240 s); its tables are appended to report.md. Its exit status 3 (a model not
#          run or a target not measured, e.g. for lack of time) is reported as "incomplete", not
#          as passed: the summary says "Incomplete: bench" instead of "All stages passed."
# transformers  actcap against the machine's transformers on the CPU, after the benchmark so that it
#          never takes the benchmark's time (skipped when the deadline is reached):
#          tests/python/test_transformers_parity.py and test_package_transformers.py, with
#          pytest-xdist over JOBS workers where it imports; "not run" (not a failure) where the
#          machine has no transformers >= 5, which they are written for
#
# Writes REPORT_DIR/report.md (a line per stage: status, seconds, the log's tail on failure; its
# summary is written even when the script is stopped by SIGTERM/SIGINT) and REPORT_DIR/logs.txt
# (every stage's log). Touches nothing outside the checkout and REPORT_DIR: temporary files go to
# build-gpu/tmp (TMPDIR), the bundle's libraries are on LD_LIBRARY_PATH only for cmake and actcap's
# own programs (not for the system's tools).
# Environment: PYTHON (default python3), JOBS (default nproc), GPU_BUNDLE (default gpu-bundle),
# GPU_BUILD (default build-gpu; relative paths are inside the checkout), GPU_CMAKE_ARGS (more
# configure arguments, e.g. -DCMAKE_CXX_STANDARD=20), GPU_CHECK_TIMEOUT per stage in seconds (default 420;
# the bench stage has its own, GPU_BENCH_TIMEOUT), GPU_BENCH_ARGS (more bench/gpu_bench.py arguments,
# e.g. --quick), GPU_CHECK_DEADLINE (seconds for the whole run: each stage's timeout and the bench's
# budget shrink to what is left, and a stage with under 20 s left is skipped, so that the report is
# complete inside the device tool's limit), GPU_TORCH_SHIM (1: always configure through the shim;
# 0: never).
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
ALL_STAGES="unpack configure build unit doctor compare mixed repro python bench transformers"
STAGES=${*:-$ALL_STAGES}
for s in $STAGES; do
  case " $ALL_STAGES " in *" $s "*) ;; *) echo "unknown stage '$s' (stages: $ALL_STAGES)" >&2; exit 2 ;; esac
done
DEADLINE=${GPU_CHECK_DEADLINE:-0}
# The f32 checks (unit, compare) need IEEE float32 GEMMs: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (set in
# NVIDIA's NGC images) turns TF32 on in LibTorch, 1e-3 off the CPU. Unset for every stage; reported.
TF32_ENV="TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=${TORCH_ALLOW_TF32_CUBLAS_OVERRIDE-unset} (unset for the run), NVIDIA_TF32_OVERRIDE=${NVIDIA_TF32_OVERRIDE-unset}"
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
mkdir -p "$LOGS" "$BUILD/tmp"
export TMPDIR="$BUILD/tmp"
: > "$REPORT/logs.txt"

{
  echo "# actcap GPU check"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "- machine: $(nproc) cores; $(uname -srm)"
  echo "- python: $($PYTHON -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1 | tail -1)"
  command -v nvidia-smi > /dev/null && echo "- gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
  # EXCLUSIVE_PROCESS would refuse the bench's CLI runs a second context (its child holds one)
  command -v nvidia-smi > /dev/null && echo "- gpu compute mode: $(timeout 10 nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>&1 | head -1)"
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
  echo "- pytest: $($PYTHON -c 'import pytest; print(pytest.__version__)' 2>/dev/null || echo "none (the bundle's is used)")"
  echo "- transformers, accelerate: $($PYTHON -c '
import importlib
out = []
for m in ("transformers", "accelerate"):
    try:
        out.append(importlib.import_module(m).__version__)
    except Exception as e:
        out.append(f"not importable ({type(e).__name__})")
print(", ".join(out))' 2>&1 | tail -1)"
  echo "- TF32 environment: $TF32_ENV"
  echo
  echo "| stage | status | seconds |"
  echo "| --- | --- | ---: |"
} > "$REPORT/report.md"

FAILURES=""
INCOMPLETE=""
NOT_RUN=""
TAILS=""
CURRENT=
STAGE_PID=

# The report's summary, also when the script is stopped (the device tool's timeout sends SIGTERM).
finish() {
  trap - TERM INT
  if [ -n "${STAGE_PID:-}" ]; then
    kill -TERM "$STAGE_PID" 2> /dev/null  # timeout passes it on to the stage
    wait "$STAGE_PID" 2> /dev/null
    record_stage "$CURRENT" "stopped ($1)" $((SECONDS - STAGE_START))
  fi
  {
    echo
    if [ -n "${1:-}" ]; then echo "Stopped by $1 during stage ${CURRENT:-none}: later stages did not run."; fi
    if [ -n "$FAILURES" ]; then echo "Failed:$FAILURES"; fi
    if [ -n "$INCOMPLETE" ]; then echo "Incomplete:$INCOMPLETE (ran, but not everything was measured: see its report)"; fi
    if [ -n "$NOT_RUN" ]; then echo "Not run:$NOT_RUN (this machine lacks what they check: see the table)"; fi
    if [ -z "$FAILURES$INCOMPLETE" ] && [ -z "${1:-}" ]; then
      if [ -n "$NOT_RUN" ]; then echo "All stages that ran passed."; else echo "All stages passed."; fi
    fi
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
}
trap 'finish SIGTERM; exit 143' TERM
trap 'finish SIGINT; exit 130' INT

# run_stage NAME CMD...: the command's output goes to the stage's log; a line in the report.
run_stage() {
  local name=$1
  shift
  local log="$LOGS/$name.log" start=$SECONDS rc limit=$STAGE_TIMEOUT
  STAGE_START=$SECONDS
  [ "$name" = bench ] && limit=$BENCH_TIMEOUT
  if [ "$DEADLINE" -gt 0 ]; then
    local left=$((DEADLINE - SECONDS))
    if [ $left -lt 20 ]; then
      echo "| $name | skipped (GPU_CHECK_DEADLINE=$DEADLINE s reached) | 0 |" >> "$REPORT/report.md"
      echo "   $name: skipped, deadline"
      FAILURES="$FAILURES $name(skipped)"
      return 1
    fi
    [ $left -lt "$limit" ] && limit=$left
    # the bench stops itself inside its budget and writes its report: leave it time for that
    [ "$name" = bench ] && [ $((limit - 20)) -lt "$BENCH_BUDGET" ] && BENCH_BUDGET=$((limit - 20))
  fi
  export BENCH_BUDGET
  echo "== $name: $*" | tee "$log"
  # the stage function runs in a child bash (exported below) so that timeout can stop it; -k: a
  # process that ignores SIGTERM (stuck in a driver call) is killed 20 s later. In the background
  # and waited for, so that a SIGTERM to this script runs its trap at once (bash defers traps
  # until a foreground command ends); the trap stops the stage.
  export STAGE_END=$(($(date +%s) + limit))  # what backtrace_of_crash may still use
  timeout -k 20 "$limit" bash -c "$*" >> "$log" 2>&1 &
  STAGE_PID=$!
  wait $STAGE_PID
  rc=$?
  STAGE_PID=
  local status=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status="timed out (${limit} s)"
  elif [ "$name" = transformers ] && [ $rc -eq 4 ]; then
    status="not run: $(tail -n 1 "$log")"
    rc=0
  elif [ "$name" = bench ] && [ $rc -eq 3 ]; then
    status="incomplete (exit 3: a model not run or a target not measured)"
  elif [ $rc -ne 0 ]; then
    status="FAILED (exit $rc)"
  fi
  record_stage "$name" "$status" $((SECONDS - start))
  return $rc
}

# record_stage NAME STATUS SECONDS: its line in the report, its log in logs.txt, and on anything
# but ok, its name in the failures (or, incomplete or not run, in those) and its log's tail in the
# summary.
record_stage() {
  local name=$1 status=$2 secs=$3 log="$LOGS/$1.log"
  echo "| $name | $status | $secs |" >> "$REPORT/report.md"
  { echo "===== $name ($status, $secs s)"; cat "$log"; echo; } >> "$REPORT/logs.txt"
  echo "   $name: $status, $secs s"
  if [ "$status" != ok ]; then
    case $status in
      incomplete*) INCOMPLETE="$INCOMPLETE $name" ;;
      "not run"*) NOT_RUN="$NOT_RUN $name" ;;
      *) FAILURES="$FAILURES $name" ;;
    esac
    TAILS="$TAILS"$'\n'"### $name ($status)"$'\n\n```\n'"$(tail -n 60 "$log")"$'\n```\n'
  fi
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
  PREFIX_LIBS=$multiarch
  if ! command -v pkg-config > /dev/null && [ -x "$PREFIX/usr/bin/pkgconf" ]; then
    export PKG_CONFIG="$PREFIX/usr/bin/pkgconf"
  fi
}

# with_libs CMD...: CMD with the bundle's libraries first on LD_LIBRARY_PATH (cmake, the linker and
# actcap's programs need them; the system's own tools, linked against their own, are run without).
with_libs() { LD_LIBRARY_PATH="$PREFIX_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

# A nvcc for CMake's CUDA checks, where one is found (PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda).
find_nvcc() {
  local c
  for c in "$(command -v nvcc 2> /dev/null)" "${CUDA_HOME:-/nonexistent}/bin/nvcc" \
    "${CUDA_PATH:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

stage_configure() {
  prefix_env
  local torch_info torch_prefix generator=() torch_cuda nvcc shim=${GPU_TORCH_SHIM:-}
  # torch's CMake prefix (empty when it has none) and its CUDA version (empty: a CPU torch)
  torch_info=$($PYTHON -c 'import os, torch, torch.utils as u; p = u.cmake_prefix_path
print(p if os.path.isdir(p) else ""); print(torch.version.cuda or "")') || return 1
  torch_prefix=$(sed -n 1p <<< "$torch_info")
  torch_cuda=$(sed -n 2p <<< "$torch_info")
  if [ -z "$shim" ]; then
    shim=0
    if [ -n "$torch_cuda" ] && ! nvcc=$(find_nvcc); then
      echo "torch is built with CUDA $torch_cuda but no nvcc is found (PATH, CUDA_HOME, /usr/local/cuda):"
      echo "torch's own TorchConfig.cmake would stop without a CUDA toolkit; configuring through scripts/torch_cmake_shim.py"
      shim=1
    elif [ -n "$torch_cuda" ]; then
      echo "nvcc for CMake's CUDA checks: $nvcc"
      export CUDACXX=${CUDACXX:-$nvcc}
    fi
  fi
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
  # MPI off: a GPU image's MPI (HPC-X, Open MPI) is not what is checked here.
  local common=(-S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
    -DPython_EXECUTABLE="$(command -v "$PYTHON")" -DACTCAP_WERROR=OFF -DACTCAP_MPI=OFF
    "${pkgconf_arg[@]}" "${python_arg[@]}")
  local rc=1
  if [ "$shim" != 1 ]; then
    # the cache only: the object files of an earlier build stay (a rerun rebuilds what changed)
    rm -f "$BUILD/CMakeCache.txt"
    with_libs cmake "${common[@]}" -DCMAKE_PREFIX_PATH="${torch_prefix:+$torch_prefix;}$PREFIX/usr" ${GPU_CMAKE_ARGS:-}
    rc=$?
    if [ $rc -ne 0 ]; then
      keep_configure_log
      [ -z "${GPU_TORCH_SHIM:-}" ] || return $rc  # GPU_TORCH_SHIM=0: no second try
      echo "configuring with torch's own CMake package failed (above); again through scripts/torch_cmake_shim.py"
    fi
  fi
  if [ $rc -ne 0 ]; then
    $PYTHON scripts/torch_cmake_shim.py "$BUILD/torch-shim" || return 1
    rm -f "$BUILD/CMakeCache.txt"
    with_libs cmake "${common[@]}" -DTorch_DIR="$BUILD/torch-shim" -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
      ${GPU_CMAKE_ARGS:-} || { rc=$?; keep_configure_log; return $rc; }
  fi
}

# CMake's own record of a failed configure (compiler and CUDA checks) goes into the report folder.
keep_configure_log() {
  local f
  for f in "$BUILD/CMakeFiles/CMakeConfigureLog.yaml" "$BUILD/CMakeFiles/CMakeError.log"; do
    [ -f "$f" ] && cp "$f" "$REPORT/configure-$(basename "$f")"
  done
  return 0
}

# Warnings stay warnings here (ACTCAP_WERROR=OFF); those in actcap's own files are listed in the
# report, since the default build (-Werror) would stop on them with this compiler.
own_warnings() {
  grep -hE "^($ROOT/|(\.\./)+)?(src|cli|include|python|tests|bench|examples)/[^:]+:[0-9]+:[0-9]+: warning:" "$@" 2> /dev/null | sort -u
}

# libstdcxx_first FILE...: the shared libstdc++ is each file's first NEEDED library
# (cmake/LibstdcxxFirst.cmake); otherwise parts of it bind to the copies of libstdc++ symbols that
# pip's LibTorch exports, and it crashes (docs/gpu.md).
libstdcxx_first() {
  local f first
  command -v readelf > /dev/null || { echo "no readelf: the NEEDED order is not checked"; return 0; }
  for f in "$@"; do
    first=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | head -n 1)
    if [ "${first%%.so*}" != libstdc++ ]; then
      echo "$f: its first NEEDED library is '$first', not libstdc++.so.6: it would bind to the copies of"
      echo "libstdc++ symbols pip's LibTorch exports and crash (cmake/LibstdcxxFirst.cmake; configure's log"
      echo "says which libstdc++ it found: set ACTCAP_LIBSTDCXX through GPU_CMAKE_ARGS)"
      return 1
    fi
    echo "$f: libstdc++ is its first NEEDED library"
  done
}

stage_build() {
  prefix_env
  rm -f "$BUILD/own-warnings.txt"
  with_libs cmake --build "$BUILD" -j "$JOBS" --target actcap actcap_tests actcap_hash_bench
  local rc=$?
  own_warnings "$LOGS/build.log" > "$BUILD/own-warnings.txt"
  [ $rc -eq 0 ] || return $rc
  libstdcxx_first "$BUILD/actcap" "$BUILD/actcap_tests" "$BUILD/actcap_hash_bench"
}

# pytest_pythonpath: the PYTHONPATH under which $PYTHON imports pytest: the bundle's, after the
# machine's own packages, where it has none (said on stderr); fails, saying so, with neither.
pytest_pythonpath() {
  local pypath=${PYTHONPATH:-}
  if ! $PYTHON -c 'import pytest' 2> /dev/null; then
    [ -d "$PREFIX/usr/lib/python3/dist-packages/pytest" ] || {
      echo "$PYTHON has no pytest and the bundle none (make gpu-bundle)" >&2
      return 1
    }
    echo "$PYTHON has no pytest: the bundle's (after the machine's own packages on sys.path)" >&2
    pypath="${pypath:+$pypath:}$PREFIX/usr/lib/python3/dist-packages"
  fi
  echo "$pypath"
}

stage_python() {
  prefix_env
  if ! grep -q "^ACTCAP_BUILD_PYTHON:BOOL=ON" "$BUILD/CMakeCache.txt" 2> /dev/null; then
    echo "no Python package: configure found no Python.h for $PYTHON (see its log)"
    return 1
  fi
  with_libs cmake --build "$BUILD" -j "$JOBS" --target actcap_python
  local rc=$?
  own_warnings "$LOGS/python.log" "$BUILD/own-warnings.txt" > "$BUILD/own-warnings.new"
  mv "$BUILD/own-warnings.new" "$BUILD/own-warnings.txt"
  [ $rc -eq 0 ] || return $rc
  libstdcxx_first "$BUILD"/python/actcap/_core*.so || return 1
  local pypath
  pypath=$(pytest_pythonpath) || return 1
  local tests=(tests/python/test_package_cuda.py tests/python/test_package_capture.py
    tests/python/test_package_engine.py) rc
  export ACTCAP="$BUILD/actcap" CI=true ACTCAP_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1 PYTHONPATH="$pypath" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  with_libs $PYTHON -m pytest -q -p no:cacheprovider --continue-on-collection-errors "${tests[@]}" -rs
  rc=$?
  # pytest itself killed (a crash in native code): faulthandler printed the Python stack above
  [ $rc -gt 128 ] && backtrace_of_crash "$(command -v "$PYTHON")" -m pytest -q -p no:cacheprovider \
    -p no:faulthandler "${tests[@]}"
  return $rc
}

# ACTCAP_REQUIRE_CUDA=1: the Cuda.* tests (tests/unit/test_cuda.cpp) fail, not skip, without a GPU.
# The whole output goes to build-gpu/unit-output.txt; the log gets what --gtest_brief would show
# and, on a crash, the test that was running and the crash's backtrace.
stage_unit() {
  prefix_env
  local out="$BUILD/unit-output.txt" rc
  ACTCAP_REQUIRE_CUDA=1 with_libs "$BUILD/actcap_tests" > "$out" 2>&1
  rc=$?
  grep -vE '^\[ RUN      \]|^\[       OK \]|^\[----------\]|^$' "$out" | tail -n 150
  if [ $rc -gt 128 ]; then
    echo "killed by signal $((rc - 128)) during $(grep '^\[ RUN ' "$out" | tail -n 1 | awk '{print $NF}')"
    ACTCAP_REQUIRE_CUDA=1 backtrace_of_crash "$BUILD/actcap_tests" --gtest_brief=1
  fi
  # The hashes that check data leaving the GPU, timed (bench/hash_bench.cpp; it also fails when the
  # GPU's device hash differs from the host's): a few seconds.
  echo "== actcap_hash_bench --device cuda:0 (also in hash-bench.txt)"
  if ! with_libs "$BUILD/actcap_hash_bench" --device cuda:0 --sizes 16,128 --rounds 5 \
    > "$REPORT/hash-bench.txt" 2>&1; then
    [ $rc -eq 0 ] && rc=1
  fi
  cat "$REPORT/hash-bench.txt"
  return $rc
}

# backtrace_of_crash CMD...: CMD run again under cuda-gdb (or gdb) after it died of a signal, for
# the native stack the log does not show (the first GPU run needed a second lease for it). Bounded
# by what is left of the stage; the bundle's libraries reach the program only, not the debugger.
backtrace_of_crash() {
  local dbg left out="$BUILD/crash-debugger.txt"
  dbg=$(command -v cuda-gdb || command -v gdb) || { echo "(no cuda-gdb or gdb for a backtrace)"; return 0; }
  left=$((${STAGE_END:-0} - $(date +%s) - 15))
  [ $left -gt 120 ] && left=120
  if [ $left -lt 15 ]; then
    echo "(no time left in the stage for a backtrace)"
    return 0
  fi
  echo "--- again under $(basename "$dbg") (up to $left s), for the backtrace: $*"
  timeout -k 5 "$left" "$dbg" -q -batch -ex 'set pagination off' -ex 'set print thread-events off' \
    -ex "set environment LD_LIBRARY_PATH=$PREFIX_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    -ex run -ex 'bt 30' --args "$@" > "$out" 2>&1 < /dev/null
  if grep -q "received signal" "$out"; then
    grep -m 1 -A 34 "received signal" "$out"
  else
    echo "(no crash under the debugger this time; its output's end:)"
    tail -n 5 "$out"
  fi
}

# Every architecture's tiny model, made once.
models() {
  local arch
  for arch in gpt2 llama mistral qwen2 qwen3 smollm3 olmo olmo2 olmo3 gemma gemma2 gemma3_text gemma3 gpt_neox gptj gpt_neo opt phi phi3 mixtral \
      qwen2_moe qwen3_moe olmoe gpt_oss deepseek_v3 deepseek_v2; do
    [ -f "$BUILD/models/$arch/config.json" ] ||
      with_libs "$BUILD/actcap" init-model --arch "$arch" --preset tiny --seed 1 --out "$BUILD/models/$arch" > /dev/null || return 1
    echo "$arch"
  done
}

stage_doctor() { prefix_env; with_libs "$BUILD/actcap" doctor --devices cuda:0,cpu:1; }

# Against the CPU reference: f32 within 1e-4 of each tensor's largest magnitude (the GPU's kernels
# round differently, so bit equality is not the bar here); bf16 compute within 1e-1 (docs/execution.md).
stage_compare() {
  prefix_env
  local arch rc=0 list
  list=$(models) || return 1
  for arch in $list; do
    for devices in cuda:0 cuda:0,cpu:1; do
      echo "--- $arch --devices $devices"
      with_libs "$BUILD/actcap" compare "$BUILD/models/$arch" --tokens "1,2,3,4,5,6,7;8,9,10" \
        --capture '**' '**:input' --devices "$devices" --tolerance 1e-4 || rc=1
    done
  done
  for arch in gpt2 llama gemma3_text; do
    echo "--- $arch --devices cuda:0,cpu:1 --compute-dtype bf16"
    with_libs "$BUILD/actcap" compare "$BUILD/models/$arch" --tokens "1,2,3,4,5,6,7;8,9,10" \
      --devices cuda:0,cpu:1 --compute-dtype bf16 --tolerance 1e-1 || rc=1
  done
  return $rc
}

stage_mixed() {
  prefix_env
  with_libs "$BUILD/actcap" extract demo --input data/demo_corpus.txt --devices cuda:0,cpu:1,cpu:2 \
    --capture 'transformer.h.*' --out "$BUILD/mixed-out" --overwrite --shard-size 1MiB &&
    with_libs "$BUILD/actcap" verify "$BUILD/mixed-out"
}

# The seed's reproduction on cuda:0 and on cuda:0 + two virtual CPUs: clone and safe must be exact
# (repro itself exits 0 whatever it finds: the naive capture is meant to be corrupted).
stage_repro() {
  prefix_env
  with_libs "$BUILD/actcap" repro --on cuda:0 cuda:0,cpu:1,cpu:2 --json > "$BUILD/repro.json" &&
    $PYTHON - "$BUILD/repro.json" << 'PY'
import json, sys
variants = json.load(open(sys.argv[1]))["variants"]
for v in variants:
    counted = f"{v['mismatched']}/{v['total']} mismatched" if v["mismatched"] is not None else ""
    print(f"{v['device_list']:<20} {v['name']:<8} {counted}"
          + (f"{'; ' if counted else ''}stopped: {v['error'][:90]}" if v["error"] else ""))
bad = [f"{v['device_list']} {v['name']}: {v['mismatched']} mismatched, {v['error']}"
       for v in variants if v["name"] in ("clone", "safe") and v["mismatched"] != 0]
bad += [f"{v['device_list']} naive: no corruption shown"
        for v in variants if v["name"] == "naive" and not v["mismatched"]]
print("\n".join(bad) or "clone and safe exact on every device list; naive corrupted")
sys.exit(1 if bad else 0)
PY
}

# The GPU benchmark: writes bench.md (its tables, appended to report.md at the end) and bench.json.
# Checkpoints are cached in $BUILD/gpu-bench-models for a rerun on the same machine.
stage_bench() {
  prefix_env
  rm -f "$REPORT/bench.md" "$REPORT/bench.json"
  # exec: the stage timeout's SIGTERM reaches the benchmark, which still writes its report; no
  # network here: transformers must not try one
  ACTCAP_COMMIT=$(git rev-parse --short HEAD 2> /dev/null) PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    LD_LIBRARY_PATH="$PREFIX_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec $PYTHON bench/gpu_bench.py --actcap "$BUILD/actcap" --python-dir "$BUILD/python" \
    --models-dir "$BUILD/gpu-bench-models" --budget-s "$BENCH_BUDGET" \
    --out "$REPORT/bench.md" --json-out "$REPORT/bench.json" ${GPU_BENCH_ARGS:-}
}

# actcap's hook points and Python package against the machine's transformers (a version other than
# the sid root's of `make torch2-check`), on the CPU: the Python extension `python` built. Without
# transformers >= 5 (what the tests are written for) every test would skip and pytest pass: exit 4,
# reported as not run, with the reason.
stage_transformers() {
  prefix_env
  local version pypath parallel=()
  version=$($PYTHON -c 'import transformers; print(transformers.__version__)' 2> /dev/null)
  case $version in
    [5-9].* | [1-9][0-9]*.*) ;;
    *)
      echo "no transformers >= 5 for $PYTHON (${version:-none}): the tests are written for 5.x"
      return 4
      ;;
  esac
  pypath=$(pytest_pythonpath) || return 1
  PYTHONPATH="$pypath" $PYTHON -c 'import xdist' 2> /dev/null && parallel=(-n "$JOBS")
  ACTCAP="$BUILD/actcap" CI=true PYTHONUNBUFFERED=1 PYTHONPATH="$pypath" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    with_libs $PYTHON -m pytest -q -p no:cacheprovider "${parallel[@]}" -rs \
    tests/python/test_transformers_parity.py tests/python/test_package_transformers.py
}

export ROOT PYTHON JOBS BUNDLE BUILD PREFIX LOGS REPORT BENCH_BUDGET
export -f prefix_env with_libs find_nvcc keep_configure_log own_warnings libstdcxx_first \
  backtrace_of_crash models pytest_pythonpath stage_unpack \
  stage_configure stage_build stage_unit stage_doctor stage_compare stage_mixed stage_repro \
  stage_python stage_bench stage_transformers

status=0
for s in $STAGES; do
  CURRENT=$s
  # configure and build need the ones before them; the checks after build run regardless of
  # each other's results.
  if ! run_stage "$s" "stage_$s"; then
    status=1
    case $s in unpack | configure | build) echo "stopping: later stages need $s" ; break ;; esac
  fi
done
CURRENT=
finish
exit $status
