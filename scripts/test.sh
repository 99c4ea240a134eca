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

scripts/summary.sh "$log" "$status"
exit "$status"
