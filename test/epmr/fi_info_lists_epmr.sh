#!/bin/sh
# Usage: fi_info_lists_epmr.sh FI_INFO
# With FI_PROVIDER_PATH pointing at the epmr build directory, `fi_info -p epmr` must list epmr
# on the loopback domain (FI_PROVIDER unset: the hints name the provider).
# EPMR_PRELOAD, if set, is preloaded into fi_info alone: a sanitized module needs its sanitizer
# runtime loaded first, and the shell running this script must not get it.
set -eu
unset FI_PROVIDER
if ! out=$(LD_PRELOAD="${EPMR_PRELOAD:-}" "$1" -p epmr -d lo); then
  echo "fi_info -p epmr -d lo failed: $out"
  exit 1
fi
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -q '^provider: epmr$'
