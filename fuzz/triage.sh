#!/usr/bin/env bash
# Groups crash reproducers by their first diagnostic line (sanitizer report, uncaught exception,
# FUZZ_CHECK, timeout), with one example file per group and the first in-repo stack frame.
#   fuzz/triage.sh BUILD_DIR TARGET [FILES...]   (default: BUILD_DIR/artifacts/TARGET/*)
set -uo pipefail
build=${1:?build dir}
target=${2:?target}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
files=("$@")
[ ${#files[@]} -gt 0 ] || files=("$build/artifacts/$target"/*)
export ASAN_OPTIONS=${ASAN_OPTIONS:-handle_abort=1:detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
tmp=$(mktemp)
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  out=$("$build/$target" -runs=1 -timeout=10 -rss_limit_mb=2048 "$f" 2>&1)
  key=$(grep -m1 -E 'runtime error:|what\(\):|FUZZ_CHECK failed|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' <<<"$out" \
        | sed -E "s/'[^']*'/'…'/g; s/0x[0-9a-f]+/0x../g; s/[0-9]+/N/g; s/==N==//" | cut -c1-200)
  frame=$(grep -m1 -E "#[0-9]+ .* $root/(src|cli|include)/" <<<"$out" | sed -E 's/^ *#[0-9]+ 0x[0-9a-f]+ in //' | cut -c1-200)
  printf '%s\t%s\t%s\n' "${key:-no crash}" "$frame" "$f" >>"$tmp"
done
sort "$tmp" | awk -F'\t' '{n[$1]++; if (!($1 in ex)) {ex[$1]=$3; fr[$1]=$2}}
  END {for (k in n) printf "%5d  %s\n       at %s\n       e.g. %s\n", n[k], k, fr[k], ex[k]}'
rm -f "$tmp"
