// The process environment, read only here (scripts/check_layers.sh keeps it so). loom's own
// settings are the LOOM_* variables, read by Config::from_env (config.cpp). Other layers read
// libfabric's variables through environment(), to report them or to choose which provider
// settings apply. loom never writes the environment: a setenv can race any other thread's
// getenv, and a library cannot know which threads its host process runs. The provider settings
// it recommends are the application's to apply (loom::recommended_provider_settings).
#pragma once

#include <optional>
#include <string>

namespace loom::util {

// The variable's value, or nullopt when it is unset.
[[nodiscard]] std::optional<std::string> environment(const char* name);

}  // namespace loom::util
