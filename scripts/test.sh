#!/usr/bin/env bash
# loom's test command: installs what is missing (Debian 12), builds with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer, and runs the whole suite on every local provider
# (tcp;ofi_rxm, shm, epmr). Extra arguments go to `meson test` (e.g. a test name, --suite ofi).
# Then, where the CUDA toolkit is installed (/usr/local/cuda, or CUDA_HOME), the -Dcuda=enabled
# variant: no sanitizer, only the layers whose code differs with CUDA (util, ofi) and the NCCL
# plugin's GPU answers, and their tests, which need no GPU (40-55 s from scratch on 2 cores for
# util and ofi; about 9 min with libloom, the plugin and ncclnet_check, which CUDA_PLUGIN=0
# leaves out); CUDA_BUILD=0 skips it, and so do extra arguments. Then the NCCL plugin's suite in the project's default build type
# (plain `meson setup`: debugoptimized, no sanitizer), where the plugin's users build it and
# where the dlclose cycles once behaved otherwise than under ASan (~2 min on 2 cores);
# DEFAULT_BUILD=0 skips it, and so do extra arguments. Ends with one line
# "N passed, N failed, N skipped" over all; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

build=${BUILD_DIR:-build-test}
options=(-Dtests=enabled -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized
         -Dmpi=enabled)
if [ -d "$build/meson-private" ]; then
  meson configure "$build" "${options[@]}" >/dev/null
else
  CC=clang CXX=clang++ meson setup "$build" "${options[@]}" >/dev/null
fi
ninja -C "$build"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
meson test -C "$build" --print-errorlogs --num-processes "$(nproc)" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# The CUDA variant. Its tests: the driver table on the toolkit's stub library, selection and
# registration decisions, NIC selection on tcp and shm with FI_HMEM asked for, and the plugin's
# answers where a NIC grants device memory (ptrSupport, regMr's refusals, ncclnet_check
# --device cuda skipped without a GPU, also through the stub driver).
cuda=${CUDA_HOME:-/usr/local/cuda}
cuda_tests=(util-config util-cuda-driver ofi-profile ofi-device-memory ofi-local-tcp
            ofi-local-shm ofi-rail-transfer-shm)
cuda_targets=(test/test_util test/test_ofi)
if [ "${CUDA_PLUGIN:-1}" != 0 ]; then
  cuda_tests+=(nccl-props-tcp nccl-props-shm-cuda nccl-props-shm-host-only nccl-reg-args-tcp
               nccl-reg-args-shm nccl-device-cuda-tcp nccl-device-cuda-shm
               nccl-device-cuda-stub-shm nccl-settings-tcp)
  cuda_targets+=(lib/nccl/libnccl-net-loom.so tools/ncclnet_check/ncclnet_check
                 test/nccl/nccl_settings_test)
fi
if [ "${CUDA_BUILD:-1}" = 0 ] || [ $# -gt 0 ]; then
  echo "test.sh: the -Dcuda=enabled build is skipped (CUDA_BUILD=0 or a selection of tests)"
elif [ ! -f "$cuda/include/cuda.h" ]; then
  echo "test.sh: no CUDA toolkit in $cuda (no include/cuda.h): the -Dcuda=enabled build is skipped"
else
  cuda_start=$SECONDS
  cuda_build=${CUDA_BUILD_DIR:-$build-cuda}
  cuda_options=(-Dcuda=enabled -Dcudatoolkit="$cuda" -Dtests=enabled -Dbuildtype=debug
                -Dbench=enabled -Dfuzz=disabled -Depmr=disabled)
  set +e
  {
    if [ -d "$cuda_build/meson-private" ]; then
      meson configure "$cuda_build" "${cuda_options[@]}" >/dev/null
    else
      meson setup "$cuda_build" "${cuda_options[@]}" >/dev/null
    fi &&
      ninja -C "$cuda_build" "${cuda_targets[@]}" &&
      meson test -C "$cuda_build" --no-rebuild --print-errorlogs --num-processes "$(nproc)" \
        "${cuda_tests[@]}"
  } 2>&1 | tee -a "$log"
  cuda_status=${PIPESTATUS[0]}
  set -e
  echo "test.sh: the -Dcuda=enabled variant took $((SECONDS - cuda_start)) s"
  [ "$cuda_status" -eq 0 ] || status=$cuda_status
fi

# The plugin in the default build type: only what its suite runs is built; and there, without
# a sanitizer, the Python module's bench against fi_p2p_bw (its tests ran in the suite above).
if [ "${DEFAULT_BUILD:-1}" = 0 ] || [ $# -gt 0 ]; then
  echo "test.sh: the default-build plugin suite is skipped (DEFAULT_BUILD=0 or a selection of tests)"
else
  default_start=$SECONDS
  default_build=${DEFAULT_BUILD_DIR:-$build-default}
  set +e
  {
    if [ ! -d "$default_build/meson-private" ]; then
      meson setup "$default_build" -Dtests=enabled -Dfuzz=disabled >/dev/null
    fi &&
      ninja -C "$default_build" lib/nccl/libnccl-net-loom.so tools/ncclnet_check/ncclnet_check \
        test/nccl/nccl_settings_test libloom.so.0.1.0 providers/epmr/libepmr-fi.so python-module \
        bench/p2p_bw/fi_p2p_bw &&
      meson test -C "$default_build" --no-rebuild --print-errorlogs --num-processes "$(nproc)" \
        --suite nccl --suite python-bench
  } 2>&1 | tee -a "$log"
  default_status=${PIPESTATUS[0]}
  set -e
  echo "test.sh: the default-build plugin suite took $((SECONDS - default_start)) s"
  [ "$default_status" -eq 0 ] || status=$default_status
fi

scripts/summary.sh "$log" "$status"
exit "$status"
