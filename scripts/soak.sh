#!/usr/bin/env bash
# Long soak: builds loom's tests in release mode (build-soak/) and runs the "[soak]" test on
# tcp;ofi_rxm (loopback) and shm: 8 communicators sharing 2 lanes over 2 data rails, messages
# of random sizes from 0 B to SOAK_MAX_BYTES, SOAK_MESSAGES per communicator (default 12500:
# 100k messages in all), every byte verified. Prints messages, bytes, seconds, GB/s and both
# processes' resident memory per provider; exits non-zero if any run fails.
#
#   scripts/soak.sh                       # both providers, 100k messages each
#   SOAK_MESSAGES=1000 scripts/soak.sh    # shorter
#   SOAK_PROVIDERS=shm scripts/soak.sh    # one provider
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

build=${BUILD_DIR:-build-soak}
if [ ! -d "$build/meson-private" ]; then
  meson setup "$build" -Dbuildtype=release -Dtests=enabled >/dev/null
fi
ninja -C "$build" test/test_p2p >/dev/null

export SOAK_MESSAGES=${SOAK_MESSAGES:-12500}
export SOAK_MAX_BYTES=${SOAK_MAX_BYTES:-8388608}
status=0
for provider in ${SOAK_PROVIDERS:-tcp shm}; do
  case "$provider" in
    tcp) env=(LOOM_PROVIDER=tcp LOOM_NICS=lo FI_PROVIDER=tcp) ;;
    shm) env=(LOOM_PROVIDER=shm FI_PROVIDER=shm) ;;
    *) echo "soak: unknown provider $provider (tcp or shm)" >&2; exit 2 ;;
  esac
  echo "== soak on $provider: 8 comms x $SOAK_MESSAGES messages of 0..$SOAK_MAX_BYTES bytes"
  start=$(date +%s)
  if env -u LOOM_NICS "${env[@]}" "$build/test/test_p2p" '[soak]' --warn NoTests; then
    echo "== soak on $provider passed in $(( $(date +%s) - start )) s"
  else
    echo "== soak on $provider FAILED" >&2
    status=1
  fi
done
exit "$status"
