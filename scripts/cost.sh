#!/usr/bin/env bash
# Instructions per small message, counted by callgrind without polling: fi_p2p_cost (a
# ping-pong between two contexts in one thread) in the release build (build-release, built
# if need be) runs twice under callgrind, with 2000 and 12000 timed rounds, and
# bench/scripts/callgrind_cost.py prints the difference per message: loom's, libfabric's and
# libc's instructions, and loom's functions. Installs valgrind if it is missing (Debian 12).
#
#   scripts/cost.sh [-p PROVIDER] [-S SIZE] [--idle] [--cache] [--before-lib DIR] [--top N]
#
# --idle: what a test that finds nothing costs instead (20000 and 120000 of them, no rounds):
# the period of a waiting loop, which delays every message it waits for by half of it on average.
# --cache: callgrind's cache simulation too, and the L1 misses per message by library (both ends
# share the simulated cache: compare builds with it, not with a ping-pong's processes).
#
# --before-lib DIR: the same fi_p2p_cost also against DIR's libloom.so.0 (an earlier commit's
# release build, whose public API this bench uses unchanged), found first through
# LD_LIBRARY_PATH: a change's cost in a second column. The provider is FI_PROVIDER's (or -p),
# default tcp;ofi_rxm as for fi_p2p_bw.
set -euo pipefail
cd "$(dirname "$0")/.."
provider=${FI_PROVIDER:-} size=8 before="" top=20 idle=0 cache=()
while [ $# -gt 0 ]; do
  case $1 in
    -p) provider=$2; shift 2 ;;
    -S) size=$2; shift 2 ;;
    --before-lib) before=$2; shift 2 ;;
    --top) top=$2; shift 2 ;;
    --idle) idle=1; shift ;;
    --cache) cache=(--cache-sim=yes); shift ;;
    *) echo "cost.sh: unknown argument $1 (see the script's header)" >&2; exit 2 ;;
  esac
done
if ! command -v valgrind >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null
fi
build=${BUILD_DIR:-build-release}
if [ ! -d "$build/meson-private" ]; then
  scripts/deps.sh
  meson setup "$build" --buildtype=release -Dtests=disabled >/dev/null
fi
ninja -C "$build" bench/p2p_cost/fi_p2p_cost >/dev/null
bin=$build/bench/p2p_cost/fi_p2p_cost
if [ -n "$before" ] && [ ! -e "$before/libloom.so.0" ]; then
  echo "cost.sh: no libloom.so.0 in $before" >&2
  exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Two runs each, of rounds[0] and rounds[1] rounds (or idle tests); the report divides the
# difference.
rounds=(2000 12000)
args=(-S "$size")
[ -n "$provider" ] && args+=(-p "$provider")
report=(--top "$top")
if [ "$idle" = 1 ]; then
  rounds=(20000 120000)
  report+=(--idle)
fi
[ ${#cache[@]} -gt 0 ] && report+=(--cache)

# Profiles fi_p2p_cost as `$1` (a label), with $2 (may be empty) first on LD_LIBRARY_PATH.
profile() {
  local label=$1 libs=$2 n count
  for n in "${rounds[@]}"; do
    if [ "$idle" = 1 ]; then count=(-n 0 --idle "$n"); else count=(-n "$n"); fi
    LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} valgrind --tool=callgrind \
      "${cache[@]}" --callgrind-out-file="$out/$label-$n.out" "$bin" "${args[@]}" "${count[@]}" \
      2>"$out/$label-$n.err" | grep -v '^#' || { cat "$out/$label-$n.err" >&2; exit 1; }
  done
}
profile now ""
if [ -n "$before" ]; then
  profile before "$before"
  report+=(--against "$out/before-${rounds[0]}.out" "$out/before-${rounds[1]}.out")
fi
python3 bench/scripts/callgrind_cost.py "$out/now-${rounds[0]}.out" "$out/now-${rounds[1]}.out" \
  $((rounds[1] - rounds[0])) "${report[@]}"
