// Where fi_p2p_bw's message buffers live: host memory on huge pages, or one GPU's memory
// (--device cuda[:N]), allocated and copied through loom's CUDA driver (loom/device_memory.hpp).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "loom/device_memory.hpp"
#include "loom/memory.hpp"

namespace loom::bench {

// This process's resident set size in KiB (/proc/self/statm: resident pages × page size).
long resident_kib();

// How host message buffers get their pages. kHuge: aligned to 2 MiB, sized in 2 MiB steps and
// advised MADV_HUGEPAGE, so that transparent huge pages back them as they back large malloc'd
// buffers, fabtests' among them, where the kernel's THP mode is `always` (with 4 KiB pages
// shm's process_vm_readv spends much of its time walking and pinning page tables, and a
// comparison with fabtests measures that: docs/performance.md, Bandwidth and message rate).
// kMalloc: as fabtests allocates them, plain malloc: huge pages only in THP mode `always`.
// Under `madvise` only the advised buffers get them, so a comparison there needs kMalloc
// (compare_fabtests.py passes --host-pages malloc).
enum class HostPages { kHuge, kMalloc };

class HostBuffer {
 public:
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;

  void assign(std::size_t size, std::byte fill, HostPages pages = HostPages::kHuge);
  [[nodiscard]] std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte[], Free> data_;
  std::size_t size_ = 0;
};

// Which memory --device names.
struct MemoryChoice {
  MemoryType type = MemoryType::kHost;
  int device = 0;                      // the CUDA ordinal
  HostPages pages = HostPages::kHuge;  // --host-pages, for host memory

  // "host", "cuda" or "cuda:N"; throws std::invalid_argument otherwise.
  static MemoryChoice parse(const std::string& text);
  // Throws loom::Error when the memory cannot be used here (no CUDA, no such GPU).
  void check() const;
  // "host", "host (malloc'd pages)" or "cuda:0 (NVIDIA H100 80GB HBM3, 0000:19:00.0)".
  [[nodiscard]] std::string describe() const;
};

class MessageBuffer {
 public:
  explicit MessageBuffer(MemoryChoice choice) : choice_(choice) {}

  // Replaces the buffer with one of `size` bytes, each `fill`.
  void assign(std::size_t size, std::byte fill);
  [[nodiscard]] std::byte* data() const noexcept;
  [[nodiscard]] std::size_t size() const noexcept;
  [[nodiscard]] MemoryType type() const noexcept { return choice_.type; }
  [[nodiscard]] int device() const noexcept { return choice_.device; }
  [[nodiscard]] bool on_device() const noexcept { return choice_.type != MemoryType::kHost; }

  // Copies between host memory and `length` bytes at `at` (inside the buffer): through the
  // driver for device memory.
  void write(std::byte* at, const std::byte* source, std::size_t length);
  void read(const std::byte* at, std::byte* target, std::size_t length) const;

 private:
  MemoryChoice choice_;
  HostBuffer host_;
  std::optional<CudaBuffer> device_;
};

}  // namespace loom::bench
