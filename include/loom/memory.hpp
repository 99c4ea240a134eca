// Memory kinds loom can register. Device memory needs a build with FI_HMEM support.
#pragma once

#include <cstdint>

namespace loom {

enum class MemoryType : std::uint8_t {
  kHost = 0,
  kCuda = 1,
};

}  // namespace loom
