#!/usr/bin/env bash
# fi_p2p_alltoall under mpirun: every pattern verified (-v) at small sizes on NP ranks of this
# host, then the output's sections and the JSON's per-rank figures checked.
# Usage: bench_alltoall.sh MPIRUN NP FI_P2P_ALLTOALL [more options]
set -u
mpirun=$1 np=$2 bin=$3
shift 3
json=$(mktemp)
trap 'rm -f "$json"' EXIT
# MPI only starts the ranks and swaps handles: its own transports stay off the fabric.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
# Open MPI unloads its components in MPI_Finalize, before LeakSanitizer looks: what they
# leave is matched by the MPI library frames deeper in its stack (test/lsan.supp), which the
# slow unwinder finds.
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
out=$(timeout 280 "$mpirun" --oversubscribe --allow-run-as-root -np "$np" "$bin" -v \
  -S l:0,1,4k,64k -I 6 -w 2 -W 4 --tokens 24 --timeout 60 --json "$json" "$@" 2>&1)
code=$?
printf '%s\n' "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ $code -eq 0 ] || fail "exit $code"
for section in '# pairs in turn, 64k' '# pairs at once, 64k' '# alltoall:' '# ep:' \
  '# every rank: endpoints' '# setup (medians over ranks)'; do
  printf '%s\n' "$out" | grep -qF -- "$section" || fail "no '$section' in the output"
done
for size in 0 1 4k 64k; do
  printf '%s\n' "$out" | grep -qE "^$size +6 " || fail "no alltoall row for $size"
done
printf '%s\n' "$out" | grep -qE '^dispatch ' || fail "no dispatch row"
printf '%s\n' "$out" | grep -qE '^combine ' || fail "no combine row"
# Every rank's figures, one rank each; endpoints the same on every rank (not one per peer).
python3 - "$json" "$np" <<'PY' || fail "the JSON"
import json, sys
doc = json.load(open(sys.argv[1]))
np = int(sys.argv[2])
ranks = doc["ranks"]
assert len(ranks) == np, f"{len(ranks)} ranks in the JSON, expected {np}"
assert sorted(r["rank"] for r in ranks) == list(range(np))
endpoints = {r["after_traffic"]["endpoints"] for r in ranks}
assert len(endpoints) == 1, f"endpoints differ between ranks: {endpoints}"
for r in ranks:
    assert len(r["alltoall"]) == 4 and len(r["pairs"]) == 8 and "dispatch" in r["ep"], r["rank"]
    assert r["setup"]["wall_ms"] > 0
print(f"ok: {np} ranks, {endpoints.pop()} endpoints each")
PY
