#!/usr/bin/env bash
# ncclnet_check's clear errors: a .so without an ncclNet symbol, a plugin whose init fails,
# a peer that dies mid-case (bounded, the error names the case, and on shm the dead ranks'
# regions are gone).
# Usage: nccl_cli.sh NCCLNET_CHECK PLUGIN_SO NOT_A_PLUGIN_SO
set -u
check=$1 plugin=$2 other=$3
fail=0
expect() {  # name, wanted exit code, wanted text, command...
  local name=$1 code=$2 text=$3; shift 3
  local out rc
  out=$(timeout 120 "$@" 2>&1); rc=$?
  last_out=$out
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL $name: exit $rc (wanted $code), output:"; echo "$out" | tail -20; fail=1
  else
    echo "ok   $name: $(grep -F -- "$text" <<<"$out" | head -1)"
  fi
}
expect no-symbol 2 "is not an ncclNet plugin: it exports none of ncclNetPlugin_v12" "$check" "$other"
expect no-file 2 "cannot load" "$check" /nonexistent/libnccl-net-none.so
expect init-fails 2 "init of plugin loom (ncclNet v12): ncclSystemError" \
  env LOOM_PROVIDER=no-such-provider "$check" "$plugin"
expect peer-dies 1 "rank 1 killed by signal 9" \
  "$check" "$plugin" --case sizes --sizes 1m --kill-peer-in sizes --timeout 30
expect bad-case 2 "no case named" "$check" "$plugin" --case nothing
# On shm the ranks that end without closing (rank 1 killed, rank 0 failing) leave no regions in
# /dev/shm: a later process with the same pid would collide with them.
expect peer-dies-shm 1 "rank 1 killed by signal 9" \
  env -u LOOM_NICS FI_PROVIDER=shm LOOM_PROVIDER=shm \
  "$check" "$plugin" --case sizes --sizes 1m --kill-peer-in sizes --timeout 30
for pid in $(grep -oE '\[pid [0-9]+\]' <<<"$last_out" | grep -oE '[0-9]+'); do
  if compgen -G "/dev/shm/$pid:*" >/dev/null; then
    echo "FAIL peer-dies-shm: regions of pid $pid left in /dev/shm:" /dev/shm/"$pid":*; fail=1
  fi
done
if ! grep -qE '\[pid [0-9]+\]' <<<"$last_out"; then
  echo "FAIL peer-dies-shm: no pid named in the output"; fail=1
fi
exit $fail
