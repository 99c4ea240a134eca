// The process environment, touched only here (scripts/check_layers.sh keeps it so). loom's own
// settings are the LOOM_* variables, read by Config::from_env (config.cpp). Other layers read
// libfabric's variables through environment(), to report them or to choose which provider
// defaults apply. The one write is those provider defaults, once per process: libfabric and its
// providers read their parameters with getenv (fi_param_get has no setter), so the environment
// is the only way to hand them a value; writing it once, before loom's first fi_getinfo, keeps
// a setenv from racing another thread's getenv inside loom afterwards.
#pragma once

#include <optional>
#include <span>
#include <string>

namespace loom::util {

// The variable's value, or nullopt when it is unset.
[[nodiscard]] std::optional<std::string> environment(const char* name);

struct EnvironmentDefault {
  const char* name;
  const char* value;
};

// Sets each of `defaults` that the environment lacks; a value already there (the user's) is
// never replaced. Only the first call in the process writes anything: later calls return false
// and change nothing, whatever they pass.
bool set_environment_defaults_once(std::span<const EnvironmentDefault> defaults) noexcept;

}  // namespace loom::util
