#!/usr/bin/env bash
# The layering rule as README (Layout) states it: util <- ofi <- {mux, p2p} <- API, topo beside
# ofi and libfabric-free, providers/ under ofi, lib/nccl on the public API only; mux and p2p
# include only the ofi headers allowed below; rdma/* headers and fi_* calls only in lib/ofi and
# providers/; the environment only in lib/util. Prints each violation; exits 1 if any.
set -u
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2
bad=0
violation() { echo "layering: $*"; bad=1; }

check_includes() {  # dir, forbidden include prefixes...
  local dir=$1; shift
  [ -d "$dir" ] || return 0
  for prefix in "$@"; do
    while IFS= read -r hit; do violation "$hit includes $prefix (not allowed in $dir)"; done \
      < <(grep -rnE "#include [<\"]${prefix}" "$dir" --include='*.cpp' --include='*.hpp' | cut -d: -f1,2)
  done
}

# include/loom's error.hpp, config.hpp and memory.hpp are vocabulary under lib/util; p2p.hpp
# (and loom.hpp, which includes it) alone is the top, over lib/p2p: nothing below includes it.
for dir in lib/util lib/ofi lib/mux lib/topo providers; do
  check_includes "$dir" loom/p2p.hpp loom/loom.hpp
done
check_includes lib/util ofi/ mux/ p2p/ topo/ rdma/ infiniband/ nccl/
check_includes lib/ofi mux/ p2p/ topo/ nccl/
check_includes lib/topo ofi/ mux/ p2p/ rdma/ infiniband/ nccl/
check_includes lib/mux p2p/ rdma/ infiniband/ providers/ nccl/
check_includes lib/p2p rdma/ infiniband/ providers/ nccl/
check_includes include/loom rdma/ infiniband/ ofi/ mux/ p2p/ util/ topo/ providers/ nccl/
check_includes bench rdma/ ofi/ mux/ p2p/ util/ providers/
# tools/ncclnet_check drives a plugin through NCCL's ABI (lib/nccl/abi.hpp), nothing of loom.
check_includes tools rdma/ ofi/ mux/ p2p/ util/ topo/ providers/ loom/
check_includes providers ofi/ mux/ p2p/ util/ topo/ nccl/

# Which lib/ofi headers a layer above may include: those of the objects it posts on or holds.
check_allowed_ofi() {  # dir, allowed header names...
  local dir=$1; shift
  while IFS= read -r hit; do
    local header=${hit##*ofi/}; header=${header%%.hpp*}
    local ok=0
    for allowed in "$@"; do [ "$header" = "$allowed" ] && ok=1; done
    [ $ok -eq 1 ] || violation "${hit%%:#*} includes ofi/$header.hpp (not on $dir's list)"
  done < <(grep -rnE '#include "ofi/' "$dir" --include='*.cpp' --include='*.hpp' | cut -d: -f1,2,3)
}
check_allowed_ofi lib/mux completion memory_registration nic rail rail_set registration_table
check_allowed_ofi lib/p2p completion memory_registration nic rail rail_set selection subnet

# Includes name their layer from lib/ (or include/), never a path relative to the file.
while IFS= read -r hit; do violation "$hit includes by a relative path"; done \
  < <(grep -rnE '#include [<"]\.\.?/' lib include providers bench tools python \
        --include='*.cpp' --include='*.hpp' | cut -d: -f1,2)
# The NCCL plugin and the Python module sit on the public API only.
check_includes lib/nccl rdma/ infiniband/ ofi/ mux/ p2p/ util/ topo/ providers/
check_includes python rdma/ infiniband/ ofi/ mux/ p2p/ util/ topo/ providers/ nccl/

# fi_* calls outside the rail layer and providers.
for dir in lib/util lib/mux lib/p2p lib/topo lib/nccl include bench tools python; do
  [ -d "$dir" ] || continue
  while IFS= read -r hit; do violation "$hit calls libfabric outside lib/ofi"; done \
    < <(grep -rnE '\bfi_[a-z_]+\(' "$dir" --include='*.cpp' --include='*.hpp' | cut -d: -f1,2)
done

# The process environment is read in lib/util only, and written nowhere (util/env.hpp), except
# by the NCCL plugin, which is the application there: lib/nccl/provider_settings.* apply
# loom's recommended provider settings at init, as fi_p2p_bw does in bench/.
while IFS= read -r hit; do violation "$hit touches the environment outside lib/util"; done \
  < <(grep -rnE '\b(getenv|secure_getenv|setenv|unsetenv|putenv|environ)\b' lib providers include \
        --include='*.cpp' --include='*.hpp' --exclude-dir=util \
        --exclude='provider_settings.*' | cut -d: -f1,2)
# The CUDA driver API only through lib/util's table, which dlopens libcuda.so.1: cuda.h in no
# other file, and no link against libcuda or the CUDA runtime.
while IFS= read -r hit; do violation "$hit includes a CUDA header outside lib/util/cuda_driver.cpp"; done \
  < <(grep -rnE '#include [<"](cuda|cuda_runtime|cuda_runtime_api)\.h[>"]' lib include bench tools providers \
        --include='*.cpp' --include='*.hpp' | grep -v '^lib/util/cuda_driver.cpp:' | cut -d: -f1,2)
while IFS= read -r hit; do violation "$hit links CUDA (the driver is dlopen'd)"; done \
  < <(grep -rnE "find_library\('(cuda|cudart)'|-lcuda" meson.build lib bench tools --include='meson.build' \
        | cut -d: -f1,2)

# Raw new/delete and goto in the library. (providers/epmr is exempt: libfabric owns its objects'
# lifetime through fi_close, so they end with `delete this`.)
while IFS= read -r hit; do violation "$hit uses raw new/delete or goto"; done \
  < <(grep -rnE '(^|[^_a-zA-Z])(new [A-Za-z_:<>]+ *[\(\[{;]|delete |goto )' lib include providers \
        --include='*.cpp' --include='*.hpp' --exclude-dir=epmr | cut -d: -f1,2)

[ $bad -eq 0 ] && echo "layering: ok"
exit $bad
