// GPU memory for programs that have no CUDA of their own (fi_p2p_bw --device cuda, loom's GPU
// tests): allocated and copied through the CUDA driver that a loom built with -Dcuda=enabled
// loads at run time (libcuda.so.1). Without CUDA in the build, without a driver or without a
// GPU, every call throws loom::Error saying which. Applications with their own CUDA allocate as
// they like and register with MemoryType::kCuda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct CudaDevice {
  int ordinal = 0;
  std::string name;        // "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;  // "0000:19:00.0"
};

// The GPUs the driver sees (possibly none). Throws loom::Error when CUDA cannot be used here.
[[nodiscard]] std::vector<CudaDevice> cuda_devices();

// The ordinal of the GPU whose memory `pointer` points into, as the driver says
// (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL): for registering memory that another component
// allocated (an NCCL plugin's regMr). Throws loom::Error when CUDA cannot be used here, or
// when the driver does not take `pointer` for device memory.
[[nodiscard]] int cuda_device_of(const void* pointer);

// Device memory on one GPU (cuMemAlloc in its primary context), freed with its owner.
class CudaBuffer {
 public:
  // Throws loom::Error: no CUDA in this build, no driver, no such device, out of memory.
  CudaBuffer(int device, std::size_t size);
  ~CudaBuffer();
  CudaBuffer(CudaBuffer&& other) noexcept;
  CudaBuffer& operator=(CudaBuffer&& other) noexcept;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }

  // Synchronous copies and fills through the driver; throw loom::Error (also for a range
  // outside the buffer).
  void copy_from_host(std::size_t offset, const void* source, std::size_t length);
  void copy_to_host(std::size_t offset, void* target, std::size_t length) const;
  void fill(std::byte value);

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = 0;
};

}  // namespace loom
