#!/usr/bin/env bash
# loom's main command: installs what is missing (Debian 12), builds loom in release mode and
# runs fi_p2p_bw --loopback (server and client on 127.0.0.1) over a size sweep on the default
# provider (FI_PROVIDER / LOOM_PROVIDER pick another). Extra arguments go to fi_p2p_bw.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build=${BUILD_DIR:-build-release}
if [ ! -d "$build/meson-private" ]; then
  meson setup "$build" --buildtype=release -Dtests=disabled >/dev/null
fi
ninja -C "$build" bench/p2p_bw/fi_p2p_bw >/dev/null
[ $# -gt 0 ] || set -- -S all
exec "$build/bench/p2p_bw/fi_p2p_bw" --loopback "$@"
