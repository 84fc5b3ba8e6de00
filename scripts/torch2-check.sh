#!/usr/bin/env bash
# Builds and tests actcap against LibTorch 2.x on this CPU machine (DEVELOPERS.md "LibTorch 2.x
# without a GPU"): Debian's libtorch-dev and python3-torch from a newer suite (default sid: at the
# time of writing LibTorch 2.14, GCC 16, pybind11 3.1, Python 3.14) in a root made with
# debootstrap under build-torch2/ (ignored), so that a change that breaks the 2.x build or its
# behaviour is found here, not in the GPU machine's few minutes. CMake and compilers of the other
# suite, Debian's CPU LibTorch: what it cannot see is CUDA itself (the GPU kit, scripts/gpu-check.sh).
#
#   scripts/torch2-check.sh REPORT_DIR [STAGE ...]
#
# Stages, in order (default: all):
# root    debootstrap the suite into TORCH2_ROOT (once; kept and reused) and install the build's
#         packages there, and transformers and accelerate where the suite has them (apt-get,
#         network to deb.debian.org; again only when one is missing)
# build   the working tree (tracked files and untracked ones git does not ignore) copied into the
#         root's /src (its build/ kept, so a rerun rebuilds what changed), configured (Release,
#         warnings are errors as in `make build`) and built with JOBS jobs: CLI, unit suite,
#         benchmarks, Python extension
# unit    the unit suite (ctest: the GoogleTest binary and the embed example)
# python  tests/python and tests/integration under the suite's python3 and torch (pytest -n JOBS;
#         TORCH2_PYTEST_ARGS adds arguments, e.g. "-k package")
#
# Writes REPORT_DIR/report.md (versions, a line per stage: status, seconds, the failing log's tail)
# and REPORT_DIR/logs.txt. Needs root (debootstrap, chroot, mounts); the mounts (/proc, /dev, /sys) live
# in a private mount namespace (unshare) and end with the stage. Exit status 0 when every stage
# run passed, 1 otherwise, 2 for bad usage.
# Environment: TORCH2_SUITE (default sid; trixie has LibTorch 2.6), TORCH2_ROOT (default
# build-torch2/$TORCH2_SUITE), TORCH2_MIRROR (default http://deb.debian.org/debian), JOBS (default
# nproc), TORCH2_STAGE_TIMEOUT seconds per stage (default 3600).
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: scripts/torch2-check.sh REPORT_DIR [STAGE ...]" >&2
  exit 2
fi
REPORT=$(mkdir -p "$1" && cd "$1" && pwd)
shift
CHECKOUT=$(cd "$(dirname "$0")/.." && pwd)
cd "$CHECKOUT"
SUITE=${TORCH2_SUITE:-sid}
ROOTFS=${TORCH2_ROOT:-build-torch2/$SUITE}
case $ROOTFS in /*) ;; *) ROOTFS="$CHECKOUT/$ROOTFS" ;; esac
MIRROR=${TORCH2_MIRROR:-http://deb.debian.org/debian}
JOBS=${JOBS:-$(nproc)}
STAGE_TIMEOUT=${TORCH2_STAGE_TIMEOUT:-3600}
ALL_STAGES="root build unit python"
STAGES=${*:-$ALL_STAGES}
for s in $STAGES; do
  case " $ALL_STAGES " in *" $s "*) ;; *) echo "unknown stage '$s' (stages: $ALL_STAGES)" >&2; exit 2 ;; esac
done
if [ "$(id -u)" != 0 ]; then
  echo "scripts/torch2-check.sh needs root (debootstrap, chroot, mounts)" >&2
  exit 2
fi
# What the build and the tests need, as `make deps` installs them on bookworm (Open MPI for the
# ranked extract's mpirun tests; Node.js for the tokenizer parity test's reference).
PACKAGES="g++ cmake make ninja-build pkg-config libtorch-dev libopenblas0-pthread python3-torch
  python3-numpy nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev libpcre2-dev libicu-dev python3-pytest python3-pytest-xdist python3-dev pybind11-dev
  python3-pybind11 python3-setuptools python3-wheel python3-pip python3-venv git nodejs npm
  libopenmpi-dev openmpi-bin"
# Installed where the suite has them (sid: transformers 5.12, accelerate 1.14, tokenizers 0.23;
# bookworm, trixie: none). Only where they import: test_transformers_parity.py runs actcap against
# transformers' own modeling code, test_package_transformers.py the Python package on its models
# (accelerate's offload included), the GPU benchmark's smoke run its HF arms, and
# test_tokenizer_parity.py and test_tokenizer_pipelines_rust.py compare actcap's tokenizer with the
# Rust `tokenizers` library.
OPTIONAL_PACKAGES="python3-transformers python3-accelerate python3-tokenizers"
: > "$REPORT/logs.txt"

# Runs a command inside the root, with /proc, /dev and /sys (Open MPI's UCX reads /sys/class/net)
# mounted in a mount namespace of its own.
in_root() {
  unshare --mount --propagation private bash -c '
    set -e
    r=$1; shift
    mount -t proc proc "$r/proc"
    mount --rbind /dev "$r/dev"
    mount --rbind /sys "$r/sys"
    exec chroot "$r" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      LANG=C.UTF-8 NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt "$@"' in_root "$ROOTFS" "$@"
}

stage_root() {
  if [ ! -x "$ROOTFS/usr/bin/apt-get" ]; then
    command -v debootstrap > /dev/null || {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap || return
    }
    rm -rf "$ROOTFS" && mkdir -p "$(dirname "$ROOTFS")"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$ROOTFS" "$MIRROR" || return
  fi
  cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
  # This machine's own certificate authorities (a proxy's, for the npm registry) trusted there too;
  # Node.js reads them through NODE_EXTRA_CA_CERTS (in_root).
  if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
    mkdir -p "$ROOTFS/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
    in_root update-ca-certificates > /dev/null || return
  fi
  # A mirror frozen at an earlier date than this machine's clock serves an "expired" Release file.
  echo 'Acquire::Check-Valid-Until "false";' > "$ROOTFS/etc/apt/apt.conf.d/99actcap-no-valid-until"
  # shellcheck disable=SC2086
  in_root bash -c 'installed() { dpkg-query -W -f="\${Status}\n" "$1" 2>/dev/null | grep -q "^install ok installed"; }
      missing=$(for p in '"$(echo $PACKAGES)"'; do installed $p || echo $p; done)
      optional=$(for p in '"$(echo $OPTIONAL_PACKAGES)"'; do installed $p || echo $p; done)
      [ -z "$missing$optional" ] && { echo "every package present"; exit 0; }
      apt-get update -qq || exit
      if [ -n "$missing" ]; then
        echo "installing:" $missing
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing || exit
      fi
      for p in $optional; do
        if apt-cache policy "$p" 2>/dev/null | grep -q "Candidate: [^(]"; then
          echo "installing (optional): $p"
          DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" || exit
        else
          echo "not in this suite (optional): $p"
        fi
      done'
}

stage_build() {
  local src="$ROOTFS/src" next="$ROOTFS/src.next"
  rm -rf "$next" && mkdir -p "$next" || return
  # tar keeps the files' times, so that the kept build/ rebuilds only what changed
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -x -C "$next" || return
  # ...and touches each file whose bytes differ from the copy build/ was built from: a file edited
  # while that build ran keeps a time older than the objects built from its earlier bytes.
  if [ -d "$src" ]; then
    (cd "$next" && find . -type f -print0) | while IFS= read -r -d '' f; do
      cmp -s "$next/$f" "$src/$f" || touch "$next/$f"
    done
  fi
  [ -d "$src/build" ] && mv "$src/build" "$next/build"
  rm -rf "$src" && mv "$next" "$src" || return
  in_root bash -c "cd /src && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPython_EXECUTABLE=/usr/bin/python3 && cmake --build build -j $JOBS"
}

stage_unit() {
  in_root bash -c "cd /src/build && ctest --output-on-failure -j $JOBS"
}

stage_python() {
  in_root bash -c "cd /src && ACTCAP=/src/build/actcap python3 -m pytest -q -rs -n $JOBS -p no:cacheprovider \
      tests/python tests/integration ${TORCH2_PYTEST_ARGS:-}"
}

versions() {
  [ -x "$ROOTFS/usr/bin/apt-get" ] || { echo "- root: not made yet"; return; }
  echo "- suite: $SUITE ($ROOTFS)"
  in_root bash -c 'v() { dpkg-query -W -f="\${Version}" "$1" 2>/dev/null || echo none; }
    echo "- libtorch-dev $(v libtorch-dev), python3-torch $(v python3-torch), g++ $(g++ -dumpfullversion 2>/dev/null || echo none), cmake $(v cmake), pybind11 $(v pybind11-dev), python3 $(v python3)"
    echo "- transformers $(v python3-transformers), accelerate $(v python3-accelerate), tokenizers $(v python3-tokenizers)"' 2>&1
}

declare -A RESULT SECONDS_TAKEN
failed=0
started=$(date -u '+%Y-%m-%d %H:%M UTC')
export -f in_root stage_root stage_build stage_unit stage_python
export ROOTFS SUITE MIRROR JOBS PACKAGES OPTIONAL_PACKAGES
for s in $STAGES; do
  log="$REPORT/$s.log"
  start=$SECONDS
  echo "== $s" | tee -a "$REPORT/logs.txt"
  timeout "$STAGE_TIMEOUT" bash -c "stage_$s" > "$log" 2>&1
  rc=$?
  cat "$log" >> "$REPORT/logs.txt"
  SECONDS_TAKEN[$s]=$((SECONDS - start))
  if [ $rc = 0 ]; then RESULT[$s]=ok; else RESULT[$s]="FAILED (exit $rc)"; failed=1; fi
  echo "   ${RESULT[$s]}, ${SECONDS_TAKEN[$s]} s"
  if [ $rc != 0 ]; then
    case $s in root | build) echo "stopping: later stages need $s"; break ;; esac
  fi
done

{
  echo "# actcap against LibTorch 2.x (scripts/torch2-check.sh)"
  echo
  echo "- started: $started; commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')"
  echo "- machine: $(nproc) cores, $JOBS jobs"
  versions
  echo
  echo "| stage | result | seconds |"
  echo "| --- | --- | ---: |"
  for s in $STAGES; do
    echo "| $s | ${RESULT[$s]:-not run} | ${SECONDS_TAKEN[$s]:-} |"
  done
  for s in $STAGES; do
    case ${RESULT[$s]:-} in
      FAILED*)
        echo
        echo "## $s: the log's end"
        echo
        echo '```'
        tail -40 "$REPORT/$s.log"
        echo '```'
        ;;
    esac
  done
  for s in unit python; do
    [ -n "${RESULT[$s]:-}" ] || continue  # run this time (an earlier run's log may be there)
    line=$(grep -E '(tests passed|passed|failed)' "$REPORT/$s.log" | tail -1)
    [ -n "$line" ] && echo "- $s: $line"
  done
} > "$REPORT/report.md"
cat "$REPORT/report.md"
exit $failed
