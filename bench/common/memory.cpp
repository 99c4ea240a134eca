#include "common/memory.hpp"

#include <cstring>
#include <fstream>
#include <stdexcept>

#include <sys/mman.h>
#include <unistd.h>

#include "loom/error.hpp"

namespace loom::bench {

long resident_kib() {
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

void HostBuffer::assign(std::size_t size, std::byte fill, HostPages pages) {
  data_.reset();  // free the old buffer before the new one is allocated
  if (pages == HostPages::kMalloc) {
    data_.reset(static_cast<std::byte*>(std::malloc(std::max<std::size_t>(size, 1))));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), static_cast<int>(fill), size);
    size_ = size;
    return;
  }
  const std::size_t rounded =
      (std::max<std::size_t>(size, 1) + kHugePage - 1) / kHugePage * kHugePage;
  data_.reset(static_cast<std::byte*>(std::aligned_alloc(kHugePage, rounded)));
  if (!data_) throw std::bad_alloc();
  // Only a hint: without transparent huge pages in the kernel the buffer keeps small pages.
  madvise(data_.get(), rounded, MADV_HUGEPAGE);
  std::memset(data_.get(), static_cast<int>(fill), rounded);
  size_ = size;
}

MemoryChoice MemoryChoice::parse(const std::string& text) {
  if (text == "host") return {};
  if (text == "cuda") return {MemoryType::kCuda, 0};
  if (text.starts_with("cuda:") && text.size() > 5 && text.size() <= 8 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos) {
    return {MemoryType::kCuda, std::stoi(text.substr(5))};
  }
  throw std::invalid_argument("--device: expected host, cuda or cuda:N, got \"" + text + "\"");
}

void MemoryChoice::check() const {
  if (type == MemoryType::kHost) return;
  const auto devices = cuda_devices();
  if (device >= static_cast<int>(devices.size())) {
    throw Error("use CUDA device memory", "", 0,
                "--device cuda:" + std::to_string(device) + ", but the driver sees " +
                    std::to_string(devices.size()) + " GPU(s)");
  }
}

std::string MemoryChoice::describe() const {
  if (type == MemoryType::kHost)
    return pages == HostPages::kHuge ? "host" : "host (malloc'd pages)";
  const auto devices = cuda_devices();
  const CudaDevice& gpu = devices.at(static_cast<std::size_t>(device));
  return "cuda:" + std::to_string(device) + " (" + gpu.name + ", " + gpu.pci_bus_id + ")";
}

void MessageBuffer::assign(std::size_t size, std::byte fill) {
  if (!on_device()) {
    host_.assign(size, fill, choice_.pages);
    return;
  }
  device_.reset();  // free the old buffer before the new one is allocated
  device_.emplace(choice_.device, size);
  device_->fill(fill);
}

std::byte* MessageBuffer::data() const noexcept {
  return on_device() ? (device_ ? device_->data() : nullptr) : host_.data();
}

std::size_t MessageBuffer::size() const noexcept {
  return on_device() ? (device_ ? device_->size() : 0) : host_.size();
}

void MessageBuffer::write(std::byte* at, const std::byte* source, std::size_t length) {
  if (!on_device()) {
    std::memcpy(at, source, length);
    return;
  }
  device_->copy_from_host(static_cast<std::size_t>(at - device_->data()), source, length);
}

void MessageBuffer::read(const std::byte* at, std::byte* target, std::size_t length) const {
  if (!on_device()) {
    std::memcpy(target, at, length);
    return;
  }
  device_->copy_to_host(static_cast<std::size_t>(at - device_->data()), target, length);
}

}  // namespace loom::bench
