#!/usr/bin/env bash
# fi_p2p_alltoall refuses bad input under mpirun: rank 0 alone prints one line, every rank exits
# non-zero, nothing hangs.
# Usage: bench_alltoall_cli.sh MPIRUN FI_P2P_ALLTOALL
set -u
mpirun=$1 bin=$2
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
fails=0
expect_refusal() {  # description, args...
  local what=$1; shift
  local err code
  err=$(timeout 60 "$mpirun" --oversubscribe --allow-run-as-root -np 3 "$bin" "$@" 2>&1 >/dev/null)
  code=$?
  local lines; lines=$(printf '%s\n' "$err" | grep -c '^fi_p2p_alltoall:')
  if [ $code -eq 0 ] || [ $code -eq 124 ]; then
    echo "FAIL $what: exit $code"; fails=$((fails + 1))
  elif [ "$lines" -ne 1 ]; then
    echo "FAIL $what: expected one 'fi_p2p_alltoall:' line, got: $err"; fails=$((fails + 1))
  else
    echo "ok   $what: $(printf '%s\n' "$err" | grep '^fi_p2p_alltoall:')"
  fi
}
expect_refusal "unknown option" --no-such-option
expect_refusal "bad size" -S 4q
expect_refusal "unknown pattern" --pattern gather
expect_refusal "top-k above N - 1" --pattern ep --topk 3
expect_refusal "hidden size out of range" --pattern ep --hidden 4
LOOM_DATA_RAIL=2 expect_refusal "unknown LOOM_ variable" -S 1k
[ $fails -eq 0 ]
