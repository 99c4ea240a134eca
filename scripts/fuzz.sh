#!/usr/bin/env bash
# Fuzzes every decoder of network bytes for longer than `meson test --suite fuzz` does: builds
# the libFuzzer targets of test/fuzz with clang under ASan + UBSan in build-fuzz (BUILD_DIR to
# change), runs each for the given seconds on all cores (libFuzzer -fork), and prints per target
# the executions, coverage (cov/ft), corpus size and crashes (crash/timeout/oom).
# Corpus, logs and crash artifacts stay in <build>/fuzz/<target>/, kept between runs; the seeds
# in test/fuzz/corpus are only read. Exits non-zero if any target crashed.
# Usage: scripts/fuzz.sh [seconds-per-target (default 300)] [target...]   e.g. 60 handle connect
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-300}
[ $# -gt 0 ] && shift
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: seconds must be a positive integer" >&2; exit 2; }
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for source in test/fuzz/fuzz_*.cpp; do
    name=${source#test/fuzz/fuzz_}
    targets+=("${name%.cpp}")
  done
fi

scripts/deps.sh
build=${BUILD_DIR:-build-fuzz}
options=(-Dtests=enabled -Dfuzz=enabled "-Db_sanitize=address,undefined" -Db_lundef=false
         -Dbuildtype=debugoptimized)
if [ -d "$build/meson-private" ]; then
  meson configure "$build" "${options[@]}" >/dev/null
else
  CC=clang CXX=clang++ meson setup "$build" "${options[@]}" >/dev/null
fi
ninja -C "$build" "${targets[@]/#/test/fuzz/fuzz_}"

export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
jobs=$(nproc)
artifacts() { find "$1" -maxdepth 1 -type f | sort; }

failed=0
rows=()
for target in "${targets[@]}"; do
  dir=$build/fuzz/$target
  mkdir -p "$dir/corpus" "$dir/artifacts"
  artifacts "$dir/artifacts" >"$dir/artifacts.before"
  echo "fuzz: $target for ${seconds}s on $jobs cores (log: $dir/log.txt)" >&2
  set +e
  "$build/test/fuzz/fuzz_$target" -fork="$jobs" -ignore_crashes=1 -max_total_time="$seconds" \
    -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$dir/artifacts/" \
    "$dir/corpus" "test/fuzz/corpus/$target" >"$dir/log.txt" 2>&1
  status=$?
  set -e
  # Fork mode's status line: "#RUNS: cov: N ft: N corp: N exec/s N oom/timeout/crash: a/b/c ..."
  read -r runs cov ft problems < <(awk '/^#[0-9]+: cov:/ {
      runs = substr($1, 2, length($1) - 2); cov = $3; ft = $5; problems = $11 }
      END { print (runs == "" ? "-" : runs), (cov == "" ? "-" : cov), (ft == "" ? "-" : ft),
                  (problems == "" ? "0/0/0" : problems) }' "$dir/log.txt")
  units=$(find "$dir/corpus" -type f | wc -l)
  new=$(artifacts "$dir/artifacts" | comm -13 "$dir/artifacts.before" -)
  found=$(grep -c . <<<"$new" || true)
  IFS=/ read -r ooms timeouts crashes <<<"$problems"
  bad=$(( ooms + timeouts + crashes ))
  [ "$found" -gt "$bad" ] && bad=$found
  if [ "$bad" -ne 0 ] || [ "$status" -ne 0 ]; then
    failed=1
    echo "fuzz: $target: $crashes crashes, $timeouts timeouts, $ooms ooms (exit $status)" >&2
    if [ "$found" -gt 0 ]; then
      echo "fuzz: $found new artifacts in $dir/artifacts, the first:" >&2
      head -n 5 <<<"$new" | sed 's/^/  /' >&2
    fi
    grep -m 5 -E 'ERROR: |fuzz property broken|runtime error' "$dir/log.txt" >&2 || true
    echo "fuzz: reproduce with $build/test/fuzz/fuzz_$target <artifact>" >&2
  fi
  rows+=("$(printf '%-16s %12s %6s %7s %8s %8s' "$target" "$runs" "$cov" "$ft" "$units" \
            "$crashes/$timeouts/$ooms")")
done

printf '%-16s %12s %6s %7s %8s %8s\n' target runs cov ft corpus 'crash/timeout/oom'
printf '%s\n' "${rows[@]}"
exit "$failed"
