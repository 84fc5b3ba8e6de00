#!/usr/bin/env bash
# Runs one libFuzzer target, or replays reproducers.
#   fuzz/run.sh BUILD_DIR SECONDS TARGET        fuzz TARGET for SECONDS
#   fuzz/run.sh BUILD_DIR regress TARGET...     run each target over fuzz/regressions/TARGET/
# The committed seeds (fuzz/corpus/TARGET/) are copied into a working corpus under
# BUILD_DIR/corpus/TARGET/ that grows across runs; crashes go to BUILD_DIR/artifacts/TARGET/,
# the log to BUILD_DIR/logs/TARGET.log, and one line per run to BUILD_DIR/logs/summary.txt.
# FUZZ_SEED=N fixes libFuzzer's random seed; FUZZ_FRESH=1 starts from the committed seeds alone
# (BUILD_DIR/corpus-fresh/TARGET/, emptied first). With both, a run starts from the inputs and
# random sequence a clean checkout starts from (fuzz-smoke, CI); a longer local run covers it.
# Exit status: non-zero when the target crashed, leaked, timed out or ran out of memory.
set -uo pipefail

build=${1:?build dir}
mode=${2:?seconds or regress}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
export ASAN_OPTIONS=${ASAN_OPTIONS:-handle_abort=1:abort_on_error=1:detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ "$mode" = regress ]; then
  status=0
  for target in "$@"; do
    dir=$root/fuzz/regressions/$target
    compgen -G "$dir/*" >/dev/null || continue
    for f in "$dir"/*; do
      if "$build/$target" -runs=1 -timeout=10 -rss_limit_mb=2048 "$f" >"$build/regress.log" 2>&1; then
        echo "ok    $target $(basename "$f")"
      else
        echo "FAIL  $target $(basename "$f"):" >&2
        grep -m3 -E 'runtime error:|what\(\):|FUZZ_CHECK|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' \
          "$build/regress.log" >&2
        status=1
      fi
    done
  done
  exit $status
fi

target=${1:?target}
seconds=$mode
case $target in
  fuzz_safetensors) max_len=4096 ;;
  fuzz_config) max_len=4096 ;;
  fuzz_tokenizer_json) max_len=8192 ;;
  fuzz_tokenizer_encode) max_len=1024 ;;
  fuzz_device_map) max_len=2048 ;;
  fuzz_small_parsers) max_len=512 ;;
  fuzz_output_folder) max_len=4096 ;;
  fuzz_corpus) max_len=2048 ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac

corpus=$build/corpus/$target
if [ "${FUZZ_FRESH:-0}" = 1 ]; then
  corpus=$build/corpus-fresh/$target
  rm -rf "$corpus"
fi
artifacts=$build/artifacts/$target
logs=$build/logs
mkdir -p "$corpus" "$artifacts" "$logs"
# Seeds into the working corpus (existing files kept: the corpus grows across runs).
cp -n "$root/fuzz/corpus/$target/"* "$corpus/" 2>/dev/null || true
args=(-max_total_time="$seconds" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048
      -print_final_stats=1 -artifact_prefix="$artifacts/")
[ -f "$root/fuzz/dict/$target.dict" ] && args+=(-dict="$root/fuzz/dict/$target.dict")
[ -n "${FUZZ_SEED:-}" ] && args+=(-seed="$FUZZ_SEED")
# FUZZ_FORK=1: keep going after crashes/timeouts/OOMs (each is saved to the artifacts folder and
# still fails the run) -- for long runs while known bugs are unfixed.
[ "${FUZZ_FORK:-0}" = 1 ] && args+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
before=$(ls "$artifacts" | wc -l)

log=$logs/$target.log
echo "== $target: ${seconds}s (log: $log)"
"$build/$target" "${args[@]}" "$corpus" >"$log" 2>&1
rc=$?

last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1)
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
[ -n "$execs" ] || execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
found=$(( $(ls "$artifacts" | wc -l) - before ))
[ $rc -eq 0 ] && [ $found -gt 0 ] && rc=1
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
units=$(ls "$corpus" | wc -l)
seed=$(sed -n 's/^INFO: Seed: *//p' "$log" | head -1)  # libFuzzer's own, random or FUZZ_SEED
line="$(date -u +%FT%TZ) $target seconds=$seconds seed=${seed:-?} execs=${execs:-?} cov=${cov:-?} ft=${ft:-?} corpus=$units new_artifacts=$found rc=$rc"
echo "$line" | tee -a "$logs/summary.txt"
if [ $rc -ne 0 ]; then
  echo "FAIL: $target (exit $rc); reproducers in $artifacts/ ($found new), end of log:" >&2
  tail -n 40 "$log" >&2
  # What a reader of a truncated CI log needs, last: the failed check and the input itself.
  echo "== $target: what failed" >&2
  grep -m5 -A3 -E 'FUZZ_CHECK failed|runtime error:|what\(\):|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' \
    "$log" | cut -c1-400 >&2
  for f in $(ls -t "$artifacts" | head -n "$found"); do
    echo "== $target: reproducer $f ($(stat -c %s "$artifacts/$f") bytes), base64 (first 3 KiB):" >&2
    head -c 3072 "$artifacts/$f" | base64 -w 100 >&2
  done
  exit 1
fi
