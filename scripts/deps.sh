#!/usr/bin/env bash
# Installs the Debian 12 packages loom builds, tests and benchmarks with, if any are missing.
# Usage: scripts/deps.sh [extra packages...]   (runs apt-get as root, or through sudo)
set -euo pipefail

packages=(
  g++ clang libclang-rt-14-dev meson ninja-build pkg-config  # toolchain (clang: sanitizers, libFuzzer)
  libfabric-dev libfabric-bin                                # libfabric >= 1.17 and fi_info
  libhwloc-dev libspdlog-dev catch2 libibverbs-dev           # hwloc, logging, tests, rdma-core
  libcli11-dev nlohmann-json3-dev                            # fi_p2p_bw's options and JSON output
  openmpi-bin libopenmpi-dev                                 # fi_p2p_alltoall's launcher and MPI
  iproute2                                                   # network-namespace tests
  python3-dev pybind11-dev python3-pytest python3-numpy      # the Python package (python/) and its tests
  "$@"
)

# The -Dcuda=enabled build needs only the CUDA toolkit's headers, which no Debian package
# provides in the same place: CI machines have the toolkit in /usr/local/cuda already.
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/cuda.h" ]; then
  echo "deps: no CUDA toolkit in $cuda (include/cuda.h): the -Dcuda=enabled build is skipped;" \
    "install NVIDIA's toolkit there (or set CUDA_HOME) to build it" >&2
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q >&2
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
