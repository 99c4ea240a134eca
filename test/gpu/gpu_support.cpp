#include "gpu/gpu_support.hpp"

#include <cstdlib>
#include <cstring>

#include "loom/error.hpp"

namespace loom::test {

bool host_mode() {
  const char* value = std::getenv("TEST_GPU_MEMORY");
  return value != nullptr && std::strcmp(value, "host") == 0;
}

MemoryType test_memory_type() {
  return host_mode() ? MemoryType::kHost : MemoryType::kCuda;
}

TestBuffer::TestBuffer(std::size_t size) : size_(size) {
  if (host_mode()) {
    host_.resize(size == 0 ? 1 : size);
  } else {
    device_.emplace(0, size);
    device_->fill(std::byte{0});
  }
}

std::byte* TestBuffer::data() const {
  return device_ ? device_->data() : const_cast<std::byte*>(host_.data());
}

void TestBuffer::write(std::size_t offset, const std::vector<std::byte>& bytes) {
  require(offset + bytes.size() <= size_, "test buffer: write out of range");
  if (device_) {
    device_->copy_from_host(offset, bytes.data(), bytes.size());
  } else if (!bytes.empty()) {
    std::memcpy(host_.data() + offset, bytes.data(), bytes.size());
  }
}

std::vector<std::byte> TestBuffer::read(std::size_t offset, std::size_t length) const {
  require(offset + length <= size_, "test buffer: read out of range");
  std::vector<std::byte> bytes(length);
  if (device_) {
    device_->copy_to_host(offset, bytes.data(), length);
  } else if (length != 0) {
    std::memcpy(bytes.data(), host_.data() + offset, length);
  }
  return bytes;
}

void in_fresh_process(const std::function<void()>& body, std::chrono::seconds timeout) {
  const std::string failure = run_pair([](Channel&) {}, [&](Channel&) { body(); }, timeout);
  require(failure.empty(), failure + " (the child's reason is on stderr)");
}

std::string gpu_missing() {
  if (host_mode()) return {};
  std::string reason;
  const std::string failure = run_pair(
      [&](Channel& channel) {
        const auto bytes = channel.recv_bytes();
        reason.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      [](Channel& channel) {
        std::string why;
        try {
          if (cuda_devices().empty()) why = "the CUDA driver sees no GPU";
        } catch (const Error& e) {
          why = e.what();
        }
        channel.send_bytes({reinterpret_cast<const std::byte*>(why.data()), why.size()});
      },
      std::chrono::seconds(60));
  if (!failure.empty()) return "the GPU probe failed: " + failure;
  return reason;
}

}  // namespace loom::test
