#!/usr/bin/env bash
# fi_p2p_bw refuses bad input with one line on stderr and a non-zero exit, without hanging.
set -u
bin=$1
fails=0
expect_refusal() {  # description, max seconds, args...  (ONE_LINE=0: multi-line allowed)
  local what=$1 limit=$2; shift 2
  local start=$SECONDS err code
  err=$(timeout 60 "$bin" "$@" 2>&1 >/dev/null); code=$?
  local lines; lines=$(printf '%s\n' "$err" | grep -c .)
  if [ $code -eq 0 ] || [ $code -eq 124 ]; then
    echo "FAIL $what: exit $code"; fails=$((fails + 1))
  elif { [ "${ONE_LINE:-1}" = 1 ] && [ "$lines" -ne 1 ]; } || [[ "$err" != fi_p2p_bw:* ]]; then
    echo "FAIL $what: expected one 'fi_p2p_bw:' line, got: $err"; fails=$((fails + 1))
  elif [ $((SECONDS - start)) -gt "$limit" ]; then
    echo "FAIL $what: took $((SECONDS - start)) s"; fails=$((fails + 1))
  else
    echo "ok   $what: $err"
  fi
}
expect_refusal "unknown option" 5 --no-such-option
expect_refusal "bad size" 5 -S 4q
expect_refusal "bad size range" 5 -S r:1k,0,4k
expect_refusal "window out of range" 5 -W 0
expect_refusal "loopback with a server" 5 --loopback 127.0.0.1
expect_refusal "unreachable server" 10 --timeout 2 -E 1 127.0.0.1
expect_refusal "unknown device" 5 --device gpu0
expect_refusal "unknown host pages" 5 --host-pages tiny
expect_refusal "unknown op" 5 --op put
expect_refusal "blocks without one-sided op" 5 --blocks 4
expect_refusal "no blocks per batch" 5 --op write --blocks 0
expect_refusal "unknown offsets" 5 --op write --offsets random
expect_refusal "unknown notify protocol" 5 --op write --notify-protocol immediate
expect_refusal "notified read" 5 --op read --notify
expect_refusal "notify and no-notify" 5 --op write --notify --no-notify
expect_refusal "one-sided bidir" 5 --op write --bidir
expect_refusal "0-byte blocks" 5 --op write -S l:0,4k
expect_refusal "one-sided slab too large" 5 --op write --blocks 65536 -S 1m -v
# A misspelt LOOM_* variable is refused before anything opens, not thrown past main.
LOOM_DATA_RAIL=2 expect_refusal "unknown LOOM_ variable" 5 --loopback -S 1k
LOOM_EAGER_CREDITS=lots expect_refusal "malformed LOOM_ value" 5 --loopback -S 1k
# Device memory where there is no GPU (a build without CUDA says that instead).
if ! ls /dev/nvidia0 >/dev/null 2>&1; then
  expect_refusal "device memory without a GPU" 10 --loopback --device cuda -S 1k
fi
# The provider error lists every provider and why it was refused: several lines, by design.
ONE_LINE=0 expect_refusal "unknown provider" 10 --loopback -p no-such-provider -S 1k
exit $fails
