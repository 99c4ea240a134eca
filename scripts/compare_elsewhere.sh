#!/usr/bin/env bash
# bench/scripts/compare_fabtests.py on another machine that has no libfabric, fabtests or loom
# installed (the device tool's machines, say), in two steps:
#
#   FABTESTS_BIN=DIR bash scripts/compare_elsewhere.sh stage
#       here: stages a release fi_p2p_bw (build-release), fabtests' fi_rdm_tagged_pingpong and
#       fi_rdm_tagged_bw from DIR (built against this machine's libfabric: README,
#       "Performance"), fi_info, and every shared library they load but glibc's, in
#       .bench/stage (ignored by git; about 10 MiB). BEFORE_BUILD=DIR also stages the release
#       build in DIR (an earlier commit's: its fi_p2p_bw and libloom), which `run` then passes
#       as --before: a change's effect there, interleaved with fabtests and the change
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
  if [ -n "${BEFORE_BUILD:-}" ]; then
    # Its own libloom beside it, found before the stage's: run puts $stage/lib on
    # LD_LIBRARY_PATH, which the binary's RUNPATH would come after.
    mkdir -p "$stage/before"
    cp "$BEFORE_BUILD/bench/p2p_bw/fi_p2p_bw" "$stage/before/"
    cp -L "$BEFORE_BUILD/libloom.so.0" "$stage/before/"
    strip --strip-debug "$stage/before/fi_p2p_bw" "$stage/before/libloom.so.0"
    cat >"$stage/before/fi_p2p_bw_before" <<'WRAPPER'
#!/bin/sh
here=$(dirname "$0")
LD_LIBRARY_PATH=$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$here/fi_p2p_bw" "$@"
WRAPPER
    chmod +x "$stage/before/fi_p2p_bw_before"
  fi
  echo "staged in $stage: $(du -sh "$stage" | cut -f1)"
}

run() {
  [ -x "$stage/bin/fi_p2p_bw" ] || { echo "nothing staged: run 'stage' first" >&2; exit 1; }
  export LD_LIBRARY_PATH=$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$stage/bin:$PATH PYTHONUNBUFFERED=1
  local before=()
  [ -x "$stage/before/fi_p2p_bw_before" ] && before=(--before "$stage/before/fi_p2p_bw_before")
  FABTESTS_BIN=$stage/bin python3 bench/scripts/compare_fabtests.py --loom "$stage/bin/fi_p2p_bw" \
    "${before[@]}" "$@"
}

case ${1:-} in
  stage) stage ;;
  run) shift; run "$@" ;;
  *) echo "usage: scripts/compare_elsewhere.sh stage | run [compare_fabtests.py options]" >&2; exit 2 ;;
esac
