#!/usr/bin/env bash
# README's Configuration table is what `fi_p2p_bw --print-config` prints from the config table
# (lib/util/config.cpp): prints the difference and exits 1 when they drift apart.
# Usage: check_config_table.sh FI_P2P_BW README.md
set -u
bin=$1 readme=$2
printed=$("$bin" --print-config) || { echo "config-readme: $bin --print-config failed"; exit 1; }
# The README's table: from its header row to the first line that is not a table row.
documented=$(awk '/^\| variable \| default \| meaning \|$/ {on = 1} on && !/^\|/ {exit} on' "$readme")
if [ "$printed" != "$documented" ]; then
  echo "config-readme: README's Configuration table differs from fi_p2p_bw --print-config;"
  echo "replace the table with that output. diff README printed:"
  diff <(printf '%s\n' "$documented") <(printf '%s\n' "$printed")
  exit 1
fi
echo "config-readme: ok"
