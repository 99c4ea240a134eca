// Memory kinds loom can register. Device memory needs a build with FI_HMEM support.
#pragma once

#include <cstdint>

namespace loom {

enum class MemoryType : std::uint8_t {
  kHost = 0,
  kCuda = 1,
};

// Device memory handed over as a dmabuf file descriptor (a GPU driver's export of it, as NCCL
// gives its net plugins): `fd` exports the memory, and the registered range begins `offset`
// bytes into it. The descriptor stays the caller's: loom reads it during the registration call
// only (the provider holds the memory from then on), so the caller may close it afterwards.
struct Dmabuf {
  int fd = -1;
  std::uint64_t offset = 0;
};

}  // namespace loom
