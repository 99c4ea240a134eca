#!/usr/bin/env bash
# Prints the one line CI looks for, "N passed, N failed, N skipped", from a `meson test` log.
# Usage: scripts/summary.sh LOG EXIT-STATUS-OF-MESON-TEST
set -euo pipefail
log=$1
status=$2
count() { awk -v key="$1" '$1 == key ":" { print $2 }' "$log" | tail -n 1; }
ok=$(count Ok); fail=$(count Fail); skipped=$(count Skipped); timeout=$(count Timeout)
# "Expected Fail:" and "Unexpected Pass:" have two words before the colon.
xfail=$(awk '/^Expected Fail:/ { print $3 }' "$log" | tail -n 1)
upass=$(awk '/^Unexpected Pass:/ { print $3 }' "$log" | tail -n 1)
passed=$(( ${ok:-0} + ${xfail:-0} ))
failed=$(( ${fail:-0} + ${upass:-0} + ${timeout:-0} ))
if [ -z "${ok:-}" ] && [ "$status" -ne 0 ]; then failed=$(( failed > 0 ? failed : 1 )); fi
echo "${passed} passed, ${failed} failed, ${skipped:-0} skipped"
