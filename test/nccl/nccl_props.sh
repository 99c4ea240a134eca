#!/usr/bin/env bash
# The plugin's device properties as ncclnet_check prints them: each "field value" argument
# must appear as a line of device 0.
# Usage: nccl_props.sh NCCLNET_CHECK PLUGIN_SO 'field value'...
set -u
check=$1 plugin=$2
shift 2
out=$(timeout 120 "$check" "$plugin" --devices 2>&1) || {
  echo "FAIL: ncclnet_check --devices exited $?:"; echo "$out"; exit 1
}
device0=$(awk '/^device 0:/{on=1; next} /^device /{on=0} on' <<<"$out")
fail=0
for want in "$@"; do
  if grep -qxF "  $want" <<<"$device0"; then
    echo "ok   $want"
  else
    echo "FAIL wanted '$want' in device 0:"; echo "$device0"; fail=1
  fi
done
exit $fail
