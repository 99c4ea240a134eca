#include "util/env.hpp"

#include <cstdlib>

namespace loom::util {

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace loom::util
