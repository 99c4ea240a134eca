#!/usr/bin/env bash
# ncclnet_check --device cuda without what it needs: it must report "skipped" and exit 77 (as
# the GPU tests do), saying why in the line wanted. With --gpu-ok, a run that found a GPU
# and passed (exit 0) passes too: then the cases ran on GPU memory.
# A directory given with --stub-driver DIR gets libcuda.so.1 -> the toolkit's stub libcuda
# (DIR/libcuda.so), which loads but answers every call "stub library".
# Usage: nccl_device.sh NCCLNET_CHECK PLUGIN_SO WANTED_TEXT [--gpu-ok] [--stub-driver DIR]
#        [ncclnet_check arguments...]
set -u
check=$1 plugin=$2 wanted=$3
shift 3
gpu_ok=0
if [ "${1:-}" = --gpu-ok ]; then gpu_ok=1; shift; fi
if [ "${1:-}" = --stub-driver ]; then
  stub=$(mktemp -d)
  trap 'rm -rf "$stub"' EXIT
  ln -s "$2/libcuda.so" "$stub/libcuda.so.1"
  export LD_LIBRARY_PATH="$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  shift 2
fi
out=$(timeout 600 "$check" "$plugin" --device cuda "$@" 2>&1); rc=$?
if [ "$rc" -eq 0 ] && [ "$gpu_ok" -eq 1 ]; then
  echo "$out" | tail -20
  echo "ok   a GPU was there: the cases ran on its memory"
  exit 0
fi
if [ "$rc" -ne 77 ] || ! grep -q "SKIPPED" <<<"$out" || ! grep -qF -- "$wanted" <<<"$out"; then
  echo "FAIL: exit $rc (wanted 77, a SKIPPED line with '$wanted'), output:"; echo "$out" | tail -30
  exit 1
fi
echo "ok   exit 77: $(grep -F SKIPPED <<<"$out" | head -1)"
