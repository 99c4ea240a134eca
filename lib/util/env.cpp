#include "util/env.hpp"

#include <cstdlib>
#include <mutex>

namespace loom::util {

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

bool set_environment_defaults_once(std::span<const EnvironmentDefault> defaults) noexcept {
  static std::once_flag once;
  bool applied = false;
  std::call_once(once, [&] {
    for (const EnvironmentDefault& d : defaults) setenv(d.name, d.value, /*overwrite=*/0);
    applied = true;
  });
  return applied;
}

}  // namespace loom::util
