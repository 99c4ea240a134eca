// The flush buffer of one endpoint: a small buffer registered for that endpoint alone. A flush
// (Rail::flush) reads a few bytes of the last received buffer into it through the endpoint: the
// read cannot complete before earlier PCIe writes of the NIC into GPU memory are visible
// (GPUDirect RDMA ordering).
#pragma once

#include <cstddef>
#include <memory>

#include "ofi/memory_registration.hpp"

namespace loom::ofi {

class FlushBuffer {
 public:
  static constexpr std::size_t kBytes = 64;

  // Registers the buffer on `target`'s rail alone (bound to its endpoint under FI_MR_ENDPOINT,
  // so the endpoint must be enabled and outlive this). Throws loom::Error.
  explicit FlushBuffer(const RegistrationTarget& target);
  ~FlushBuffer();
  FlushBuffer(const FlushBuffer&) = delete;
  FlushBuffer& operator=(const FlushBuffer&) = delete;

  [[nodiscard]] std::byte* data() noexcept { return storage_.get(); }
  [[nodiscard]] const std::byte* data() const noexcept { return storage_.get(); }
  [[nodiscard]] const MemoryRegistration& registration() const noexcept { return registration_; }

 private:
  std::unique_ptr<std::byte[]> storage_;
  MemoryRegistration registration_;  // after the storage: closed before it is freed
};

}  // namespace loom::ofi
