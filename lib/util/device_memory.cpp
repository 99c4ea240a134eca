// loom::CudaBuffer, cuda_devices() and cuda_device_of(), on the process's CUDA driver table.
#include "loom/device_memory.hpp"

#include <cstdio>
#include <string>
#include <utility>

#include "loom/error.hpp"
#include "util/cuda_driver.hpp"

namespace loom {
namespace {

void check_range(const CudaBuffer& buffer, std::size_t offset, std::size_t length,
                 const char* what) {
  if (offset > buffer.size() || length > buffer.size() - offset) {
    throw Error(what, "", 0,
                std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                    " lie outside the " + std::to_string(buffer.size()) + "-byte CUDA buffer");
  }
}

}  // namespace

std::vector<CudaDevice> cuda_devices() {
  util::cuda::Driver& driver = util::cuda::Driver::instance();
  std::vector<CudaDevice> devices;
  const int count = driver.device_count();
  for (int i = 0; i < count; ++i) {
    devices.push_back(
        {.ordinal = i, .name = driver.device_name(i), .pci_bus_id = driver.pci_bus_id(i)});
  }
  return devices;
}

int cuda_device_of(const void* pointer) {
  const util::cuda::PointerInfo info = util::cuda::Driver::instance().pointer_info(pointer);
  char address[32];
  std::snprintf(address, sizeof address, "%p", pointer);
  if (info.kind == util::cuda::PointerKind::kHost) {
    throw Error("find the CUDA device of memory", "", 0,
                std::string(address) + " is host memory, not CUDA device memory");
  }
  if (info.kind != util::cuda::PointerKind::kDevice || info.device < 0) {
    throw Error("find the CUDA device of memory", "", 0,
                "the CUDA driver cannot tell which device " + std::string(address) +
                    " lies on (cuPointerGetAttribute failed)");
  }
  return info.device;
}

CudaBuffer::CudaBuffer(int device, std::size_t size) : size_(size), device_(device) {
  util::cuda::Driver& driver = util::cuda::Driver::instance();
  const int count = driver.device_count();
  if (device < 0 || device >= count) {
    throw Error("allocate CUDA memory", "", 0,
                "no CUDA device " + std::to_string(device) + " (the driver sees " +
                    std::to_string(count) + ")");
  }
  data_ = static_cast<std::byte*>(driver.allocate(device, size == 0 ? 1 : size));
}

CudaBuffer::~CudaBuffer() {
  if (data_ != nullptr) util::cuda::Driver::instance().free(device_, data_);
}

CudaBuffer::CudaBuffer(CudaBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_) {}

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) util::cuda::Driver::instance().free(device_, data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

void CudaBuffer::copy_from_host(std::size_t offset, const void* source, std::size_t length) {
  check_range(*this, offset, length, "copy to CUDA memory");
  if (length != 0) {
    util::cuda::Driver::instance().copy_to_device(device_, data_ + offset, source, length);
  }
}

void CudaBuffer::copy_to_host(std::size_t offset, void* target, std::size_t length) const {
  check_range(*this, offset, length, "copy from CUDA memory");
  if (length != 0) {
    util::cuda::Driver::instance().copy_to_host(device_, target, data_ + offset, length);
  }
}

void CudaBuffer::fill(std::byte value) {
  if (size_ != 0) {
    util::cuda::Driver::instance().fill(device_, data_, static_cast<std::uint8_t>(value), size_);
  }
}

}  // namespace loom
