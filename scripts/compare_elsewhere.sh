#!/usr/bin/env bash
# bench/scripts/compare_fabtests.py on another machine that has no libfabric, fabtests or loom
# installed (the device tool's machines, say), in two steps:
#
#   FABTESTS_BIN=DIR bash scripts/compare_elsewhere.sh stage
#       here: stages a release fi_p2p_bw (build-release), fabtests' fi_rdm_tagged_pingpong and
#       fi_rdm_tagged_bw from DIR (built against this machine's libfabric: README,
#       "Performance"), fi_info, and every shared library they load but glibc's, in
#       .bench/stage (ignored by git; about 10 MiB)
#   bash scripts/compare_elsewhere.sh run [compare_fabtests.py options]
#       there, from the repository root with .bench/stage beside it: the comparison against
#       the staged libfabric, e.g. `run --latency --providers shm,tcp --lat-sizes 8,256,4k`.
#       With the device tool: run(command="bash scripts/compare_elsewhere.sh run --latency",
#       carry=[".bench/stage"]).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$PWD/.bench/stage
# shellcheck source=scripts/stage_libraries.sh
. scripts/stage_libraries.sh

stage() {
  local fabtests=${FABTESTS_BIN:?set FABTESTS_BIN to fabtests bin/ directory}
  ninja -C build-release bench/p2p_bw/fi_p2p_bw >/dev/null
  rm -rf "$stage"
  mkdir -p "$stage/bin" "$stage/lib"
  cp build-release/bench/p2p_bw/fi_p2p_bw "$fabtests"/fi_rdm_tagged_pingpong \
    "$fabtests"/fi_rdm_tagged_bw "$fabtests"/fi_rma_bw "$(command -v fi_info)" "$stage/bin/"
  stage_libraries "$stage" "$PWD/build-release" || exit 1
  echo "staged in $stage: $(du -sh "$stage" | cut -f1)"
}

run() {
  [ -x "$stage/bin/fi_p2p_bw" ] || { echo "nothing staged: run 'stage' first" >&2; exit 1; }
  export LD_LIBRARY_PATH=$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$stage/bin:$PATH PYTHONUNBUFFERED=1
  FABTESTS_BIN=$stage/bin python3 bench/scripts/compare_fabtests.py --loom "$stage/bin/fi_p2p_bw" "$@"
}

case ${1:-} in
  stage) stage ;;
  run) shift; run "$@" ;;
  *) echo "usage: scripts/compare_elsewhere.sh stage | run [compare_fabtests.py options]" >&2; exit 2 ;;
esac
