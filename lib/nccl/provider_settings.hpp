// The provider settings loom recommends (loom::recommended_provider_settings), applied by the
// plugin: loaded by NCCL, the plugin is the application, as fi_p2p_bw is for itself, and
// providers read their parameters only from the environment, when libfabric initialises (the
// plugin's first Context, its first fi_getinfo). The library never writes the environment;
// this file is the one place of lib/nccl that does (scripts/check_layers.sh names it).
#pragma once

#include <string>
#include <vector>

#include "loom/config.hpp"

namespace loom::nccl {

// Sets each recommended variable the environment lacks (setenv without overwrite) and leaves
// those it has as they are. Returns a line per setting saying which it was, for NCCL's log
// (INFO), or one line saying that there is none for the provider.
std::vector<std::string> apply_provider_settings(const Config& config);

}  // namespace loom::nccl
