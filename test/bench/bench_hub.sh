#!/usr/bin/env bash
# fi_p2p_hub smoke test: a hub and three peers; exit 0 and one row for each of 1, 2, 3 peers.
set -u
bin=$1
out=$(timeout 90 "$bin" --peers 1,2,3 -S 64k --timeout 60 2>&1); code=$?
printf '%s\n' "$out"
if [ $code -ne 0 ]; then
  echo "FAIL: exit $code"
  exit 1
fi
rows=$(printf '%s\n' "$out" | grep -cE '^[0-9]+ ')
if [ "$rows" -ne 3 ]; then
  echo "FAIL: $rows rows, expected 3"
  exit 1
fi
for peers in 1 2 3; do
  if ! printf '%s\n' "$out" | grep -qE "^$peers +[0-9]+ +[^ ]+=[0-9]+ "; then
    echo "FAIL: no row for $peers peer(s)"
    exit 1
  fi
done
echo "ok: 3 rows"
