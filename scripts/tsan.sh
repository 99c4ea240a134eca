#!/usr/bin/env bash
# loom's thread-safety check: installs what is missing (Debian 12), builds with clang under
# ThreadSanitizer in build-tsan/ and runs the tests that drive communicators from several
# threads at once (p2p-threads-* on every local provider) plus a few single-threaded two-process
# tests that exercise the shared lanes' locking (a window of mixed sizes, 64 communicators on 4
# lanes, control messages carried between a process's lanes). Arguments replace that list of tests (e.g. `scripts/tsan.sh p2p-threads-tcp`) or add
# `meson test` options. Ends with one line "N passed, N failed[, N skipped]"; exits non-zero on
# any failure or data race.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

build=${BUILD_DIR:-build-tsan}
# libFuzzer targets are left out: -fsanitize=fuzzer does not combine with thread.
options=(-Dtests=enabled -Db_sanitize=thread -Db_lundef=false -Dbuildtype=debugoptimized
         -Dfuzz=disabled)
if [ -d "$build/meson-private" ]; then
  meson configure "$build" "${options[@]}" >/dev/null
else
  CC=clang CXX=clang++ meson setup "$build" "${options[@]}" >/dev/null
fi
ninja -C "$build"

tests=()
if [ $# -gt 0 ]; then
  tests=("$@")
else
  # Those of the list this build has (epmr is built only where its build dependencies are).
  listed=$(meson test -C "$build" --no-rebuild --list 2>/dev/null)
  for t in p2p-threads-tcp p2p-threads-shm p2p-threads-epmr p2p-window-tcp mux-grouped64-tcp \
           p2p-carried-tcp; do
    grep -q " / $t\$" <<<"$listed" && tests+=("$t")
  done
fi

# halt_on_error: the first report fails the test (the forked peer's too: run_pair reports its
# exit status). TSan's slowdown is 5-15x: the multiplier stretches meson's per-test timeouts.
# No suppressions: libfabric is not instrumented (its own accesses are invisible to TSan) and
# synchronizes with pthread locks, which TSan intercepts; nothing in it has needed one.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
# One test at a time: each runs two processes of several polling threads, and under TSan's
# slowdown parallel runs on a small machine only starve each other into timeouts.
meson test -C "$build" --print-errorlogs --num-processes 1 --timeout-multiplier 3 "${tests[@]}" \
  2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

scripts/summary.sh "$log" "$status"
exit "$status"
