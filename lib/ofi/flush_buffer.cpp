#include "ofi/flush_buffer.hpp"

#include <span>

namespace loom::ofi {

// The span lives until the registration is made; it keeps no pointer to it.
FlushBuffer::FlushBuffer(const RegistrationTarget& target)
    : storage_(std::make_unique<std::byte[]>(kBytes)),
      registration_(std::span<const RegistrationTarget>(&target, 1), storage_.get(), kBytes) {}

FlushBuffer::~FlushBuffer() = default;

}  // namespace loom::ofi
