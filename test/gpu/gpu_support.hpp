// What the GPU tests share: buffers on the GPU (or, with TEST_GPU_MEMORY=host, on the host, to
// check the tests' own logic on a machine without one), and a fresh process per case: CUDA does
// not survive fork(), so the test runner itself never touches the driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/device_memory.hpp"
#include "loom/memory.hpp"
#include "support/two_process.hpp"

namespace loom::test {

// TEST_GPU_MEMORY=host: the tests run on host buffers (their logic, no GPU). Unset: CUDA.
[[nodiscard]] bool host_mode();
[[nodiscard]] MemoryType test_memory_type();

class TestBuffer {
 public:
  explicit TestBuffer(std::size_t size);
  [[nodiscard]] std::byte* data() const;
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] MemoryType type() const { return test_memory_type(); }
  [[nodiscard]] int device() const { return 0; }
  void write(std::size_t offset, const std::vector<std::byte>& bytes);
  [[nodiscard]] std::vector<std::byte> read(std::size_t offset, std::size_t length) const;

 private:
  std::size_t size_;
  std::vector<std::byte> host_;
  std::optional<CudaBuffer> device_;
};

// Runs `body` in a child process (see the file comment); requires it to succeed.
void in_fresh_process(const std::function<void()>& body,
                      std::chrono::seconds timeout = std::chrono::seconds(300));

// Why device memory cannot be tested here ("" when it can): asked in a child process.
[[nodiscard]] std::string gpu_missing();

}  // namespace loom::test
