// The driver table of a loom built without CUDA: there is none. Every way to get one throws
// loom::Error saying how to build loom with CUDA; with no table, nothing else can be called.
#include "loom/error.hpp"
#include "util/cuda_driver.hpp"

namespace loom::util::cuda {
namespace {

[[noreturn]] void built_without_cuda() {
  throw Error("use CUDA device memory", "", 0,
              "this loom was built without CUDA (meson setup -Dcuda=enabled)");
}

}  // namespace

struct Driver::Table {};

Driver& Driver::instance() {
  built_without_cuda();
}

Driver* Driver::if_loaded() noexcept {
  return nullptr;
}

Driver::Driver(const std::string&) {
  built_without_cuda();
}

Driver::~Driver() = default;

// Unreachable without a table; defined so that callers need no build switch.
void Driver::initialize() {
  built_without_cuda();
}
const std::string& Driver::library() const noexcept {
  static const std::string none;
  return none;
}
int Driver::version() const {
  built_without_cuda();
}
int Driver::device_count() const {
  built_without_cuda();
}
std::string Driver::device_name(int) const {
  built_without_cuda();
}
std::string Driver::pci_bus_id(int) const {
  built_without_cuda();
}
bool Driver::dmabuf_supported(int) const noexcept {
  return false;
}
PointerInfo Driver::pointer_info(const void*) const noexcept {
  return {};
}
DmabufRange Driver::dmabuf_range(const void*, std::size_t, int) const {
  built_without_cuda();
}
void* Driver::allocate(int, std::size_t) {
  built_without_cuda();
}
void Driver::free(int, void*) noexcept {}
void Driver::copy_to_device(int, void*, const void*, std::size_t) const {
  built_without_cuda();
}
void Driver::copy_to_host(int, void*, const void*, std::size_t) const {
  built_without_cuda();
}
void Driver::fill(int, void*, std::uint8_t, std::size_t) const {
  built_without_cuda();
}

}  // namespace loom::util::cuda
