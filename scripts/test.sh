#!/usr/bin/env bash
# loom's test command: installs what is missing (Debian 12), builds with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer, and runs the whole suite on every local provider
# (tcp;ofi_rxm, shm, epmr). Extra arguments go to `meson test` (e.g. a test name, --suite ofi).
# Ends with one line "N passed, N failed[, N skipped]"; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

build=${BUILD_DIR:-build-test}
options=(-Dtests=enabled -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized)
if [ -d "$build/meson-private" ]; then
  meson configure "$build" "${options[@]}" >/dev/null
else
  CC=clang CXX=clang++ meson setup "$build" "${options[@]}" >/dev/null
fi
ninja -C "$build"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
meson test -C "$build" --print-errorlogs --num-processes "$(nproc)" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

count() { awk -v key="$1" '$1 == key ":" { print $2 }' "$log" | tail -n 1; }
ok=$(count Ok); xfail=$(count "Expected"); fail=$(count Fail); upass=$(count Unexpected)
skipped=$(count Skipped); timeout=$(count Timeout)
# "Expected Fail:" and "Unexpected Pass:" have two words before the colon.
xfail=$(awk '/^Expected Fail:/ { print $3 }' "$log" | tail -n 1)
upass=$(awk '/^Unexpected Pass:/ { print $3 }' "$log" | tail -n 1)
passed=$(( ${ok:-0} + ${xfail:-0} ))
failed=$(( ${fail:-0} + ${upass:-0} + ${timeout:-0} ))
if [ -z "${ok:-}" ] && [ "$status" -ne 0 ]; then failed=$(( failed > 0 ? failed : 1 )); fi
echo "${passed} passed, ${failed} failed, ${skipped:-0} skipped"
exit "$status"
