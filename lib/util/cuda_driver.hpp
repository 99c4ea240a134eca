// The CUDA driver API, reached through dlopen("libcuda.so.1") at run time: loom never links
// libcuda, so one binary runs on machines with and without a GPU. Only a loom built with
// -Dcuda=enabled has a driver table (cuda_driver.cpp); a build without CUDA compiles
// cuda_driver_absent.cpp, whose every entry says so. No cuda.h here: the layers above see plain
// types.
//
// Process-wide state: the one driver table (instance()) is a documented registry, like the
// logger. It is made once, under a call_once, and never changes afterwards; the library
// handle and the primary contexts it retained are released when the process (or the module
// holding libloom) unloads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <unistd.h>

namespace loom::util::cuda {

// What the driver says a pointer is.
enum class PointerKind : std::uint8_t {
  kUnknown,  // no driver, or it cannot tell (not initialized)
  kHost,     // not memory the driver knows, or pinned host memory
  kDevice,   // device memory (cuMemAlloc, cudaMalloc, managed memory)
};

struct PointerInfo {
  PointerKind kind = PointerKind::kUnknown;
  int device = -1;       // the device ordinal of device memory
  bool managed = false;  // device memory the host may touch too (cuMemAllocManaged)
};

// An open dmabuf file descriptor; closed with its owner.
class DmabufFd {
 public:
  DmabufFd() = default;
  explicit DmabufFd(int fd) noexcept : fd_(fd) {}
  ~DmabufFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  DmabufFd(DmabufFd&& other) noexcept : fd_(other.release()) {}
  DmabufFd& operator=(DmabufFd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = other.release();
    }
    return *this;
  }
  DmabufFd(const DmabufFd&) = delete;
  DmabufFd& operator=(const DmabufFd&) = delete;

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// The dmabuf export of [base, base + length) of device memory: the descriptor covers the
// enclosing host pages, and `offset` is where `base` lies in it.
struct DmabufRange {
  DmabufFd fd;
  std::uint64_t offset = 0;
  const void* start = nullptr;  // the address at offset 0 of the dmabuf
};

class Driver {
 public:
  // The process's table over libcuda.so.1, loaded and initialized (cuInit) on first use.
  // Throws loom::Error naming what failed (no CUDA in this build, no driver library, cuInit's
  // error); the same error again on every later call.
  static Driver& instance();
  // The process's table only when this process has libcuda.so.1 loaded already (it uses CUDA);
  // never loads the library. nullptr otherwise, or when the driver fails to initialize.
  static Driver* if_loaded() noexcept;

  // A table over `library` (tests load the toolkit's stub). Throws loom::Error when it cannot
  // be loaded or lacks a symbol; initialize() runs cuInit.
  explicit Driver(const std::string& library);
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // cuInit(0); throws loom::Error with the driver's error name and text.
  void initialize();
  [[nodiscard]] const std::string& library() const noexcept;
  // cuDriverGetVersion: 13000 for CUDA 13.0.
  [[nodiscard]] int version() const;

  // ---- devices; each throws loom::Error naming the driver call and its error.
  [[nodiscard]] int device_count() const;
  [[nodiscard]] std::string device_name(int device) const;
  [[nodiscard]] std::string pci_bus_id(int device) const;
  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, and whether the driver exports
  // cuMemGetHandleForAddressRange (CUDA 11.7).
  [[nodiscard]] bool dmabuf_supported(int device) const noexcept;

  // ---- pointers. Never throws: what the driver cannot tell is kUnknown.
  [[nodiscard]] PointerInfo pointer_info(const void* pointer) const noexcept;
  // cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) over the host pages
  // enclosing the range. Throws loom::Error.
  [[nodiscard]] DmabufRange dmabuf_range(const void* base, std::size_t length, int device) const;

  // ---- memory (loom::CudaBuffer), in the device's primary context, pushed and popped around
  // each call so the calling thread's current context is left as it was. Throw loom::Error.
  // copy_to_device and fill return once the bytes are in device memory: cuMemcpyHtoD from
  // pageable memory returns once they are staged and cuMemsetD8 once it is queued, and another
  // process (shm over CUDA IPC) or a NIC reading the memory next is ordered by nothing else.
  [[nodiscard]] void* allocate(int device, std::size_t size);
  void free(int device, void* pointer) noexcept;
  void copy_to_device(int device, void* target, const void* source, std::size_t length) const;
  void copy_to_host(int device, void* target, const void* source, std::size_t length) const;
  void fill(int device, void* target, std::uint8_t value, std::size_t length) const;

 private:
  struct Table;  // the function pointers and the library handle
  std::unique_ptr<Table> table_;
};

}  // namespace loom::util::cuda
