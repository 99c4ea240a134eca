#!/usr/bin/env bash
# Prints the one line CI looks for, "N passed, N failed, N skipped", from a `meson test` log
# (summed over every `meson test` summary in it: scripts/test.sh runs three builds' suites).
# A test that exits 77 is "Skipped" to meson (GPU tests without a GPU, root-only tests).
# Usage: scripts/summary.sh LOG EXIT-STATUS-OF-MESON-TEST
set -euo pipefail
log=$1
status=$2
count() { awk -v key="$1" '$1 == key ":" { n += $2; seen = 1 } END { if (seen) print n }' "$log"; }
ok=$(count Ok); fail=$(count Fail); skipped=$(count Skipped); timeout=$(count Timeout)
# "Expected Fail:" and "Unexpected Pass:" have two words before the colon.
xfail=$(awk '/^Expected Fail:/ { n += $3 } END { print n + 0 }' "$log")
upass=$(awk '/^Unexpected Pass:/ { n += $3 } END { print n + 0 }' "$log")
passed=$(( ${ok:-0} + ${xfail:-0} ))
failed=$(( ${fail:-0} + ${upass:-0} + ${timeout:-0} ))
if [ -z "${ok:-}" ] && [ "$status" -ne 0 ]; then failed=$(( failed > 0 ? failed : 1 )); fi
# Why each failed test failed, from its error log (meson's --print-errorlogs): Catch2's messages
# and our own verdicts, a few distinct lines per test, so that a CI log cut to its tail says it.
awk '
  / (FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS) / && /^ *[0-9]+\/[0-9]+ / {
    name = $0; sub(/ +(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS) .*/, "", name); sub(/^ *[0-9]+\/[0-9]+ +/, "", name)
    if (!(name in done)) { test = name; done[name] = 1; shown = 0; after = 0 }
    next
  }
  test == "" { next }
  /^――――――――――――――――――――――――――――――――――――――――/ && !/✀/ { test = ""; next }
  {
    line = $0; sub(/^ +/, "", line)
    keep = after > 0 || line ~ /never taken|stalled|bound|took longer|timed out|taken as dead|Sanitizer|runtime error|what\(\)/
    if (after > 0) after--
    if (line ~ /^with messages?:$|^due to unexpected exception with message:$/) after = 2
    if (line ~ /^peer [0-9]+$|peer closed the channel/) keep = 0  # echoes of the cause
    if (!keep || line == "" || seen[test, line]++ || shown >= 6 || total >= 60) next
    if (shown++ == 0) print "why " test ":"
    print "  " substr(line, 1, 200); total++
  }
' "$log" || true
# The failed tests by name, so that a CI log cut to its tail still says which ones they were.
grep -E '^ *[0-9]+/[0-9]+ .* (FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS) ' "$log" | awk '!seen[$0]++' | sed 's/^ */failed: /' || true
echo "${passed} passed, ${failed} failed, ${skipped:-0} skipped"
