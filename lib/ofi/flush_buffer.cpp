#include "ofi/flush_buffer.hpp"

#include <array>
#include <span>

namespace loom::ofi {

// The span lives until the registration is made; it keeps no pointer to it.
FlushBuffer::FlushBuffer(Rail& rail)
    : storage_(std::make_unique<std::byte[]>(kBytes)),
      registration_(std::span<Rail* const>(std::array<Rail*, 1>{&rail}), storage_.get(), kBytes) {}

FlushBuffer::~FlushBuffer() = default;

}  // namespace loom::ofi
