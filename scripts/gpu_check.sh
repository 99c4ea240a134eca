#!/usr/bin/env bash
# Device memory on a real GPU, in two steps (README, "GPU memory"):
#
#   bash scripts/gpu_check.sh build   on a build machine (Debian 12, the CUDA toolkit in
#                                     /usr/local/cuda, apt): builds libfabric with CUDA from its
#                                     public source and loom -Dcuda=enabled against it, and
#                                     stages every binary and shared library a run needs in
#                                     .gpu/stage (ignored by git)
#   bash scripts/gpu_check.sh run     on the GPU machine, from the repository root with
#                                     .gpu/stage beside it; needs only the NVIDIA driver there
#                                     (no libfabric, hwloc or spdlog, no network). With the
#                                     device tool: run(command="bash scripts/gpu_check.sh run",
#                                     carry=[".gpu/stage"])
#   bash scripts/gpu_check.sh figures on the GPU machine after run: the README's GPU table
#                                     (bandwidth, unverified, median of interleaved rounds)
#   bash scripts/gpu_check.sh         all three, where one machine builds and has the GPU
#
# The run moves cuMemAlloc'd buffers between two processes on GPU 0 over shm and tcp;ofi_rxm
# (FI_HMEM; libfabric's tcp has none, so there it checks that CUDA memory is refused and why),
# every byte verified; receives followed by iflush through every data rail; registration
# through a dmabuf where libfabric (>= 1.20), the driver and the GPU allow it, and by address
# with LOOM_CUDA_DMABUF=0; and fi_p2p_bw --device cuda. Then the NCCL plugin as NCCL's proxy
# drives it (ncclnet_check --device cuda, two processes on GPU 0 over shm): its properties,
# every conformance case on GPU memory registered with NCCL_PTR_CUDA and through dmabufs, every
# receive flushed and checked from the host (again with LOOM_CUDA_DMABUF=0: by address only),
# its bandwidth on GPU and host memory, and tcp;ofi_rxm, where the plugin must say it takes no
# CUDA memory. NCCL itself puts the network between ranks only on two GPUs (one GPU's ranks
# talk over P2P/SHM): where PyTorch is installed, its NCCL loads the plugin for one rank
# (scripts/nccl_one_rank.py), which checks the loading and init, not a transfer. Logs go to
# .gpu/results and, where $OUT is set (the device tool brings back at most 8 files from it),
# into $OUT/gpu-results.tar.gz.
# A step that runs past STEP_TIMEOUT seconds (default 600) is killed and counts as failed.
# Exit status: the number of failed steps.
#
# LOOM_CUDA_IPC's steps run where the build had LIBFABRIC_IPC_SRC: a libfabric checkout whose
# shm waits for its CUDA IPC copies (its main branch after 2.6.0), staged in .gpu/stage/lib-ipc.
#
# Knobs: LIBFABRIC_GIT (default https://github.com/ofiwg/libfabric.git), LIBFABRIC_VERSION (a
# tag, default v2.6.0), LIBFABRIC_SRC (an existing checkout or release tree: no clone), CUDA_HOME
# (default /usr/local/cuda), JOBS (default nproc).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
gpu=$root/.gpu
stage=$gpu/stage
cuda=${CUDA_HOME:-/usr/local/cuda}
jobs=${JOBS:-$(nproc)}

die() { echo "gpu_check: $*" >&2; exit 1; }
# shellcheck source=scripts/stage_libraries.sh
. scripts/stage_libraries.sh

build() {
  set -e
  [ -f "$cuda/include/cuda.h" ] || die "no CUDA toolkit at $cuda (set CUDA_HOME)"
  [ -f "$cuda/lib64/libcudart.so" ] || die "no libcudart.so in $cuda/lib64"
  scripts/deps.sh autoconf automake libtool git
  mkdir -p "$gpu"

  # 1. libfabric with CUDA (dlopen'd, so it builds without a driver) and the providers loom's
  #    GPU checks use: shm, tcp and rxm.
  local src=${LIBFABRIC_SRC:-$gpu/src/libfabric}
  local version=${LIBFABRIC_VERSION:-v2.6.0}
  if [ ! -d "$src" ]; then
    git clone --quiet --depth 1 --branch "$version" \
      "${LIBFABRIC_GIT:-https://github.com/ofiwg/libfabric.git}" "$src"
  fi
  # libfabric's CUDA code includes nvml.h, which a toolkit installed without NVML's headers
  # lacks: take it from Debian's libnvidia-ml-dev (non-free), downloaded with a private apt
  # configuration into .gpu/apt, the system's sources untouched.
  local cppflags=""
  if [ ! -f "$cuda/include/nvml.h" ]; then
    if [ ! -f "$gpu/nvml/usr/include/nvml.h" ]; then
      local apt_dir=$gpu/apt
      mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
      echo "deb http://deb.debian.org/debian bookworm non-free" >"$apt_dir/sources.list"
      local apt_options=(-o Dir::Etc::SourceList="$apt_dir/sources.list"
                         -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$apt_dir/lists"
                         -o Dir::Cache="$apt_dir/cache")
      apt-get -q "${apt_options[@]}" update >/dev/null
      (cd "$apt_dir" && apt-get -q "${apt_options[@]}" download libnvidia-ml-dev 2>/dev/null)
      dpkg-deb -x "$apt_dir"/libnvidia-ml-dev_*.deb "$gpu/nvml"
    fi
    cppflags="-I$gpu/nvml/usr/include"
  fi
  # SOURCE NAME: configures and installs libfabric from SOURCE into $gpu/NAME.
  build_libfabric() {
    local from=$1 name=$2
    if [ ! -f "$gpu/$name/lib/pkgconfig/libfabric.pc" ]; then
      (
        cd "$from"
        [ -x configure ] || ./autogen.sh >/dev/null
        mkdir -p "$gpu/$name-build"
        cd "$gpu/$name-build"
        "$from/configure" --quiet --prefix="$gpu/$name" --disable-static CPPFLAGS="$cppflags" \
          --with-cuda="$cuda" --enable-cuda-dlopen \
          --enable-only --enable-shm --enable-tcp --enable-rxm
        make --quiet -j"$jobs" install >/dev/null
      )
    fi
    grep -q '^#define HAVE_CUDA 1' "$gpu/$name-build/config.h" ||
      die "libfabric was configured without CUDA (see $gpu/$name-build/config.log)"
  }
  local prefix=$gpu/libfabric
  build_libfabric "$src" libfabric
  # A libfabric whose shm waits for its CUDA IPC copies (main after a35dc5085, or a release
  # with it), for the LOOM_CUDA_IPC steps: same ABI, so loom runs against it unchanged.
  if [ -n "${LIBFABRIC_IPC_SRC:-}" ]; then build_libfabric "$LIBFABRIC_IPC_SRC" libfabric-ipc; fi

  # 2. loom against it. The CUDA driver is dlopen'd at run time: nothing links libcuda.
  local build_dir=$gpu/build
  local options=(-Dcuda=enabled -Dcudatoolkit="$cuda" -Dtests=enabled -Dbench=enabled
                 -Depmr=disabled -Dfuzz=disabled -Dverbs=disabled -Dbuildtype=debugoptimized)
  if [ -d "$build_dir/meson-private" ]; then
    meson configure "$build_dir" "${options[@]}" >/dev/null
  else
    PKG_CONFIG_PATH=$prefix/lib/pkgconfig meson setup "$build_dir" "${options[@]}" >/dev/null
  fi
  ninja -C "$build_dir" test/test_gpu test/test_util test/test_ofi bench/p2p_bw/fi_p2p_bw \
    lib/nccl/libnccl-net-loom.so tools/ncclnet_check/ncclnet_check

  # 3. Stage what a run needs. libfabric dlopens libcudart.so (unversioned) from the toolkit,
  #    which the GPU machine may lack; libcuda.so.1 comes from its driver.
  rm -rf "$stage"
  mkdir -p "$stage/bin" "$stage/lib"
  cp "$build_dir"/test/test_gpu "$build_dir"/test/test_util "$build_dir"/test/test_ofi \
    "$build_dir"/bench/p2p_bw/fi_p2p_bw "$build_dir"/tools/ncclnet_check/ncclnet_check \
    "$prefix"/bin/fi_info "$stage/bin/"
  cp -L "$build_dir"/libloom.so.0 "$build_dir"/lib/nccl/libnccl-net-loom.so \
    "$prefix"/lib/libfabric.so.? "$stage/lib/"
  cp -L "$cuda"/lib64/libcudart.so "$stage/lib/libcudart.so"
  local soname
  soname=$(objdump -p "$cuda/lib64/libcudart.so" | awk '$1 == "SONAME" { print $2 }')
  cp -L "$cuda"/lib64/libcudart.so "$stage/lib/$soname"
  if [ -n "${LIBFABRIC_IPC_SRC:-}" ]; then
    mkdir -p "$stage/lib-ipc"
    cp -L "$gpu"/libfabric-ipc/lib/libfabric.so.? "$stage/lib-ipc/"
    strip --strip-debug "$stage"/lib-ipc/*
  fi
  stage_libraries "$stage" || die "the stage is incomplete"
  echo "CUDA toolkit $cuda, libfabric $version: $(du -sh "$stage" | cut -f1) staged in $stage"
  set +e
}

# DIR: checks the stage, empties DIR for this run's logs, and puts the staged libraries first.
prepare() {
  [ -x "$stage/bin/test_gpu" ] || die "nothing staged in $stage: run 'scripts/gpu_check.sh build' first"
  rm -rf "$1"
  mkdir -p "$1"
  export LD_LIBRARY_PATH=$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

run() {
  local results=$gpu/results step_timeout=${STEP_TIMEOUT:-600}
  prepare "$results"
  local failed=0 step=0
  # step NAME EXPECT ENV... -- COMMAND...: EXPECT is "pass" or "refuse:TEXT" (must fail saying TEXT).
  step() {
    local name=$1 expect=$2; shift 2
    local env=()
    while [ "$1" != "--" ]; do env+=("$1"); shift; done
    shift
    step=$((step + 1))
    local log
    log="$results/$(printf '%02d' $step)-$name.log"
    env "${env[@]}" timeout -k 5 "$step_timeout" "$@" >"$log" 2>&1
    local code=$?
    local verdict=ok
    case $expect in
      pass) [ $code -eq 0 ] || verdict="FAILED (exit $code)" ;;
      refuse:*)
        if [ $code -eq 0 ]; then verdict="FAILED (expected a refusal, it ran)";
        elif ! grep -qF "${expect#refuse:}" "$log"; then verdict="FAILED (exit $code without \"${expect#refuse:}\")"; fi ;;
    esac
    grep -qE '^SKIPPED' "$log" && verdict="FAILED (skipped: $(grep -m1 '^SKIPPED' "$log"))"
    [ "$expect" = pass ] && [ $code -eq 77 ] &&
      verdict="FAILED (skipped: $(grep -m1 'SKIPPED' "$log"))"
    [ "$verdict" = ok ] || failed=$((failed + 1))
    printf '%-34s %s\n' "$name" "$verdict"
    [ "$verdict" = ok ] || tail -n 8 "$log" | cut -c1-300 | sed 's/^/    | /'
    # After every step, so that a run cut short still brings back what it did.
    if [ -n "${OUT:-}" ]; then tar -czf "$OUT/gpu-results.tar.gz" -C "$gpu" results; fi
    grep -hE '^(NOT SUPPORTED|refused as expected|[a-z;_]+: registered|# memory|  ptrSupport|  forceFlush|[0-9]+ cases)' \
      "$log" | sed 's/^/    /'
  }
  {
    { nvidia-smi 2>&1 || echo "nvidia-smi: not available"; } | head -12
    nvidia-smi -L 2>&1
    echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); kernel $(uname -r)"
    echo "# nccl on the image: $(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / { print $NF }' |
      xargs -r readlink -f | tr '\n' ' ')"
    "$stage/bin/fi_info" --version
    FI_PROVIDER=shm "$stage/bin/fi_info" -p shm -c FI_HMEM -t FI_EP_RDM 2>&1 | head -5
  } >"$results/00-machine.log" 2>&1
  cat "$results/00-machine.log"
  local tcp=("LOOM_PROVIDER=tcp;ofi_rxm" FI_PROVIDER=tcp LOOM_NICS=lo)
  local shm=(LOOM_PROVIDER=shm FI_PROVIDER=shm)
  local bin=$stage/bin
  step driver pass -- "$bin/test_util" '[cuda]' --warn NoTests
  step selection-units pass -- "$bin/test_ofi" '[hmem]' --warn NoTests
  step nics-shm pass "${shm[@]}" -- "$bin/test_ofi" '[local]' --warn NoTests
  step gpu-shm pass "${shm[@]}" -- "$bin/test_gpu" '[gpu]' --warn NoTests -s -r compact
  step gpu-tcp pass "${tcp[@]}" -- "$bin/test_gpu" '[gpu]' --warn NoTests -s -r compact
  # The README's GPU table: device memory with and without the flush's read-back, and host
  # memory from the same run for comparison.
  local sizes=l:1,4k,64k,1m,16m
  step bw-shm-cuda pass "${shm[@]}" -- "$bin/fi_p2p_bw" --loopback --device cuda -v \
    -S $sizes -I 200 -w 20 --timeout 120
  step bw-shm-cuda-noflush pass "${shm[@]}" LOOM_GPU_FLUSH=0 -- "$bin/fi_p2p_bw" --loopback \
    --device cuda -v -S $sizes -I 200 -w 20 --timeout 120
  step bw-shm-host pass "${shm[@]}" -- "$bin/fi_p2p_bw" --loopback -v -S $sizes -I 200 -w 20 \
    --timeout 120
  step bw-shm-cuda-2rails pass "${shm[@]}" -- "$bin/fi_p2p_bw" --loopback --device cuda:0 -v \
    --rails 2 -S l:64k,16m -I 50 -w 5 --timeout 120
  if [ -d "$stage/lib-ipc" ]; then
    # Device to device over CUDA IPC (LOOM_CUDA_IPC=1), with a libfabric that waits for it.
    local ipc=(LD_LIBRARY_PATH="$stage/lib-ipc:$LD_LIBRARY_PATH" LOOM_CUDA_IPC=1)
    step gpu-shm-ipc pass "${shm[@]}" "${ipc[@]}" -- "$bin/test_gpu" '[gpu]' --warn NoTests \
      -s -r compact
    step bw-shm-cuda-ipc pass "${shm[@]}" "${ipc[@]}" -- "$bin/fi_p2p_bw" --loopback \
      --device cuda -v -S $sizes -I 200 -w 20 --timeout 120
    step bw-shm-cuda-ipc-noflush pass "${shm[@]}" "${ipc[@]}" LOOM_GPU_FLUSH=0 -- \
      "$bin/fi_p2p_bw" --loopback --device cuda -v -S $sizes -I 200 -w 20 --timeout 120
  fi
  step bw-tcp-cuda "refuse:has no device-memory support" "${tcp[@]}" -- "$bin/fi_p2p_bw" \
    --loopback --device cuda -S 4k -I 10 --timeout 60
  # The NCCL plugin, driven as NCCL's proxy does, two processes on GPU 0 (README, "NCCL/RCCL net
  # plugin"): ptrSupport HOST|CUDA|DMABUF with libfabric >= 1.20, every case on GPU memory.
  local plugin=$stage/lib/libnccl-net-loom.so
  step plugin-props-shm pass "${shm[@]}" -- "$bin/ncclnet_check" "$plugin" --devices -v
  step plugin-cases-shm-cuda pass "${shm[@]}" -- "$bin/ncclnet_check" "$plugin" --device cuda \
    --timeout 300 --sizes 0,1,4095,64k,1m,64m+3
  step plugin-cases-shm-cuda-address pass "${shm[@]}" LOOM_CUDA_DMABUF=0 -- \
    "$bin/ncclnet_check" "$plugin" --device cuda --timeout 300 \
    --case sizes,grouped,window,truncation,reg-args --sizes 0,4095,1m,16m+3
  step plugin-bw-shm-cuda pass "${shm[@]}" -- "$bin/ncclnet_check" "$plugin" --bw \
    --device cuda -S l:64k,1m,16m --json "$results/plugin-bw-shm-cuda.json"
  step plugin-bw-shm-host pass "${shm[@]}" -- "$bin/ncclnet_check" "$plugin" --bw \
    -S l:64k,1m,16m --json "$results/plugin-bw-shm-host.json"
  if [ -d "$stage/lib-ipc" ]; then
    step plugin-cases-shm-cuda-ipc pass "${shm[@]}" "${ipc[@]}" -- "$bin/ncclnet_check" \
      "$plugin" --device cuda --timeout 300 --sizes 0,1,4095,64k,1m,64m+3
    step plugin-bw-shm-cuda-ipc pass "${shm[@]}" "${ipc[@]}" -- "$bin/ncclnet_check" "$plugin" \
      --bw --device cuda -S l:64k,1m,16m --json "$results/plugin-bw-shm-cuda-ipc.json"
  fi
  step plugin-tcp-cuda "refuse:takes no CUDA memory" "${tcp[@]}" -- "$bin/ncclnet_check" \
    "$plugin" --device cuda --case sizes
  # A real NCCL (PyTorch's, where the machine has it) loading the plugin: one rank, so nothing
  # crosses the network, but NCCL finds the plugin, initializes it with its logger and asks
  # its devices.
  if python3 -c 'import torch' 2>/dev/null; then
    step nccl-loads-plugin pass "${shm[@]}" -- python3 "$root/scripts/nccl_one_rank.py" "$plugin"
  else
    echo "nccl-loads-plugin                  not run: no PyTorch here"
  fi
  echo "$((step - failed)) of $step steps ok; logs in $results"
  return "$failed"
}

# The README's GPU table: fi_p2p_bw --loopback over shm, MB/s, ROUNDS (default 3) interleaved
# rounds of every memory configuration, the median per size; no verification (-v copies every
# message back to the host, which is then most of the time: `run` verifies).
figures() {
  local results=$gpu/figures rounds=${ROUNDS:-3}
  prepare "$results"
  local configs=("host|--device host" "cuda|--device cuda" "cuda-noflush|--device cuda|LOOM_GPU_FLUSH=0")
  [ -d "$stage/lib-ipc" ] &&
    configs+=("cuda-ipc|--device cuda|LOOM_CUDA_IPC=1 LD_LIBRARY_PATH=$stage/lib-ipc:$LD_LIBRARY_PATH")
  local round config name options env
  for round in $(seq "$rounds"); do
    for config in "${configs[@]}"; do
      IFS='|' read -r name options env <<<"$config"
      # shellcheck disable=SC2086 # options and env are word lists
      env LOOM_PROVIDER=shm FI_PROVIDER=shm $env timeout -k 5 120 "$stage/bin/fi_p2p_bw" \
        --loopback $options -S l:1,4k,64k,1m,16m -I 500 -w 50 --no-pingpong --timeout 60 \
        --json "$results/$name-$round.json" >"$results/$name-$round.log" 2>&1 ||
        echo "$name round $round: exit $? (see $results/$name-$round.log)"
    done
  done
  python3 - "$results" "$rounds" "${configs[@]%%|*}" <<'PY'
import json, pathlib, statistics, sys
results, rounds, names = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
print(f"fi_p2p_bw --loopback, shm, window 64, 500 iterations, MB/s: median of {rounds} rounds")
print("| memory | 1 B | 4 KiB | 64 KiB | 1 MiB | 16 MiB |\n|---|---|---|---|---|---|")
for name in names:
    by_size = {}
    for round in range(1, rounds + 1):
        path = results / f"{name}-{round}.json"
        if not path.exists():
            continue
        for row in json.loads(path.read_text())["results"]:
            by_size.setdefault(row["bytes"], []).append(row["mb_per_sec"])
    cells = [f"{statistics.median(v):.2f}" if k == 1 else f"{statistics.median(v):.0f}"
             for k, v in sorted(by_size.items())]
    print(f"| {name} | " + " | ".join(cells) + " |")
PY
  if [ -n "${OUT:-}" ]; then tar -czf "$OUT/gpu-figures.tar.gz" -C "$gpu" figures; fi
}

case ${1:-all} in
  build) build ;;
  run) run ;;
  figures) figures ;;
  all) build && run && figures ;;
  *) die "usage: scripts/gpu_check.sh [build|run|figures]" ;;
esac
