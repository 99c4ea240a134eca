#!/usr/bin/env bash
# fi_p2p_bw --op write|read on loopback: exit 0, one row per size with sane figures, and JSON
# that parses with the same rows (time-to-notify measured where notified, null where not). The
# counted CQ data protocol either runs or is refused in one line that says so. Nothing is logged
# at error level.
set -u
bin=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

# what, notified (1/0), args...
check_run() {
  local what=$1 notified=$2; shift 2
  local out code
  out=$(timeout 120 "$bin" --loopback --timeout 60 -S l:1,4k,100k -I 12 -w 2 --lat-iters 5 \
        --json "$tmp/r.json" "$@" 2>&1); code=$?
  if [ $code -ne 0 ]; then fail "$what: exit $code: $out"; return; fi
  # Teardown included: loom logs nothing at error level (a failed fi_close, say).
  if printf '%s\n' "$out" | grep -q '\[error\]'; then fail "$what: errors logged: $out"; return; fi
  # bytes blocks iters total time MB/sec usec/xfer Mxfers/sec GB/s batch50 batch99 notify50 ...
  local rows; rows=$(printf '%s\n' "$out" | awk '$1 ~ /^[0-9]+k?$/ && $2 ~ /^[0-9]+$/ && $7 > 0 \
                                                  && $10 > 0' | wc -l)
  if [ "$rows" -ne 3 ]; then fail "$what: $rows sane rows of 3: $out"; return; fi
  if ! python3 - "$tmp/r.json" "$notified" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
notified = sys.argv[2] == "1"
rows = doc["results"]
assert [r["bytes"] for r in rows] == [1, 4096, 102400], rows
for r in rows:
    assert r["gb_per_sec"] > 0 and r["batches"] == 12, r
    assert r["batch_latency"]["samples"] == 12 and r["batch_latency"]["p99_us"] > 0, r
    assert r["lone_batch_latency"]["samples"] == 5, r
    assert (r["time_to_notify"] is not None) == notified, r
    if notified:
        assert r["time_to_notify"]["samples"] == 12 and r["time_to_notify"]["p50_us"] > 0, r
assert doc["config"]["op"] in ("write", "read") and doc["config"]["notify"] == notified, doc
PY
  then fail "$what: JSON"; return; fi
  echo "ok   $what"
}

check_run "write, notified, shuffled, verified" 1 --op write --blocks 8 --offsets shuffled -v
check_run "write, no notification, window 1" 0 --op write --blocks 3 --no-notify -W 1
check_run "read, shuffled, verified" 0 --op read --blocks 8 --offsets shuffled -v

out=$(timeout 120 "$bin" --loopback --timeout 60 -S 4k -I 4 -w 1 --op write --blocks 4 \
      --notify-protocol cq-data 2>&1 >/dev/null); code=$?
if [ $code -eq 0 ]; then
  echo "ok   cq-data protocol runs"
elif [ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] && [[ "$out" == fi_p2p_bw:*"not built yet"* ]]; then
  echo "ok   cq-data protocol refused: $out"
else
  fail "cq-data protocol: exit $code: $out"
fi
exit $fails
