#include "ncclnet_cuda.hpp"

#include <mutex>
#include <vector>

#include <dlfcn.h>
#include <unistd.h>

#include "ncclnet_plugin.hpp"

namespace ncclnet {

MemoryChoice parse_memory(const std::string& text) {
  if (text == "host") return {};
  if (text == "staged") return {.staged = true};
  if (text == "cuda") return {.cuda = true, .gpu = 0};
  if (text.starts_with("cuda:") && text.size() > 5 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos && text.size() < 9)
    return {.cuda = true, .gpu = std::stoi(text.substr(5))};
  throw CheckError("--device " + text + ": host, cuda, cuda:N or staged");
}

}  // namespace ncclnet

namespace ncclnet::cuda {
namespace {

// The driver API's types and the constants the tool passes, as cuda.h defines them (CUDA 11.7
// and later; stable ABI).
using Result = int;                             // CUresult; 0 is CUDA_SUCCESS
using Device = int;                             // CUdevice
using DevicePtr = unsigned long long;           // CUdeviceptr
using Context = void*;                          // CUcontext
constexpr int kAttributeDmaBufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
constexpr int kRangeHandleDmaBufFd = 1;         // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

struct Driver {
  void* library = nullptr;
  Result (*init)(unsigned) = nullptr;
  Result (*get_error_name)(Result, const char**) = nullptr;
  Result (*device_get_count)(int*) = nullptr;
  Result (*device_get)(Device*, int) = nullptr;
  Result (*device_get_name)(char*, int, Device) = nullptr;
  Result (*device_get_attribute)(int*, int, Device) = nullptr;
  Result (*primary_ctx_retain)(Context*, Device) = nullptr;
  Result (*ctx_set_current)(Context) = nullptr;
  Result (*ctx_synchronize)() = nullptr;
  Result (*mem_alloc)(DevicePtr*, std::size_t) = nullptr;
  Result (*mem_free)(DevicePtr) = nullptr;
  Result (*memcpy_htod)(DevicePtr, const void*, std::size_t) = nullptr;
  Result (*memcpy_dtoh)(void*, DevicePtr, std::size_t) = nullptr;
  Result (*get_handle_for_address_range)(void*, DevicePtr, std::size_t, int,
                                         unsigned long long) = nullptr;  // optional
  std::string error;  // why the driver cannot be used; empty when it can
  int count = 0;
  std::mutex mutex;
  std::vector<Context> contexts;  // primary contexts retained, by ordinal

  template <typename F>
  bool bind(F& slot, const char* symbol) {
    slot = reinterpret_cast<F>(::dlsym(library, symbol));
    if (slot == nullptr) error = std::string("libcuda.so.1 lacks ") + symbol;
    return slot != nullptr;
  }

  [[nodiscard]] std::string name_of(Result result) const {
    const char* name = nullptr;
    if (get_error_name != nullptr && get_error_name(result, &name) != 0) name = nullptr;
    // The errors of loading a driver, named where the driver names none (the toolkit's stub
    // answers every call, cuGetErrorName too, with its own error).
    if (name == nullptr && result == 34) name = "CUDA_ERROR_STUB_LIBRARY";
    if (name == nullptr && result == 100) name = "CUDA_ERROR_NO_DEVICE";
    return std::string(name != nullptr ? name : "CUDA error") + " (" + std::to_string(result) + ")";
  }

  void check(Result result, const char* call, const std::string& what) const {
    if (result != 0) throw CheckError(what + ": " + call + " failed: " + name_of(result));
  }

  Context context(int gpu) {
    const std::lock_guard lock(mutex);
    if (gpu < 0 || gpu >= count) throw CheckError("no CUDA device " + std::to_string(gpu));
    if (contexts.size() < static_cast<std::size_t>(count)) contexts.resize(count, nullptr);
    Context& context = contexts[static_cast<std::size_t>(gpu)];
    if (context == nullptr) {
      Device device = 0;
      check(device_get(&device, gpu), "cuDeviceGet", "CUDA device " + std::to_string(gpu));
      check(primary_ctx_retain(&context, device), "cuDevicePrimaryCtxRetain",
            "CUDA device " + std::to_string(gpu));
    }
    return context;
  }
};

void load(Driver& d) {
  d.library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (d.library == nullptr) {
    const char* why = ::dlerror();
    d.error = std::string("dlopen(libcuda.so.1) failed: ") + (why ? why : "unknown") +
              " (no NVIDIA driver on this machine?)";
    return;
  }
  if (!d.bind(d.init, "cuInit") || !d.bind(d.get_error_name, "cuGetErrorName") ||
      !d.bind(d.device_get_count, "cuDeviceGetCount") || !d.bind(d.device_get, "cuDeviceGet") ||
      !d.bind(d.device_get_name, "cuDeviceGetName") ||
      !d.bind(d.device_get_attribute, "cuDeviceGetAttribute") ||
      !d.bind(d.primary_ctx_retain, "cuDevicePrimaryCtxRetain") ||
      !d.bind(d.ctx_set_current, "cuCtxSetCurrent") ||
      !d.bind(d.ctx_synchronize, "cuCtxSynchronize") || !d.bind(d.mem_alloc, "cuMemAlloc_v2") ||
      !d.bind(d.mem_free, "cuMemFree_v2") || !d.bind(d.memcpy_htod, "cuMemcpyHtoD_v2") ||
      !d.bind(d.memcpy_dtoh, "cuMemcpyDtoH_v2"))
    return;
  d.get_handle_for_address_range = reinterpret_cast<decltype(d.get_handle_for_address_range)>(
      ::dlsym(d.library, "cuMemGetHandleForAddressRange"));
  if (const Result r = d.init(0); r != 0) {
    d.error = "cuInit failed: " + d.name_of(r);
    return;
  }
  if (const Result r = d.device_get_count(&d.count); r != 0)
    d.error = "cuDeviceGetCount failed: " + d.name_of(r);
}

// Loaded once per process (a rank), on first use. The library stays loaded (its primary
// contexts with it) until the rank exits.
Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] { load(d); });
  return d;
}

Driver& usable(int gpu) {
  Driver& d = driver();
  if (!d.error.empty()) throw CheckError(d.error);
  make_current(gpu);
  return d;
}

DevicePtr device_ptr(const void* pointer) {
  return static_cast<DevicePtr>(reinterpret_cast<std::uintptr_t>(pointer));
}

MemoryChoice& choice() {
  static MemoryChoice c;
  return c;
}

}  // namespace

std::string unavailable(int gpu) {
  Driver& d = driver();
  if (!d.error.empty()) return d.error;
  if (gpu < 0 || gpu >= d.count)
    return "no CUDA device " + std::to_string(gpu) + " (the driver sees " +
           std::to_string(d.count) + ")";
  return {};
}

std::string device_name(int gpu) {
  Driver& d = usable(gpu);
  Device device = 0;
  d.check(d.device_get(&device, gpu), "cuDeviceGet", "CUDA device " + std::to_string(gpu));
  char name[256] = {};
  d.check(d.device_get_name(name, sizeof name, device), "cuDeviceGetName",
          "CUDA device " + std::to_string(gpu));
  return name;
}

void make_current(int gpu) {
  Driver& d = driver();
  if (!d.error.empty()) throw CheckError(d.error);
  d.check(d.ctx_set_current(d.context(gpu)), "cuCtxSetCurrent",
          "CUDA device " + std::to_string(gpu));
}

void* allocate(int gpu, std::size_t size) {
  Driver& d = usable(gpu);
  DevicePtr pointer = 0;
  d.check(d.mem_alloc(&pointer, size), "cuMemAlloc",
          "allocate " + std::to_string(size) + " bytes on CUDA device " + std::to_string(gpu));
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(pointer));
}

void release(int gpu, void* pointer) noexcept {
  try {
    Driver& d = usable(gpu);
    d.mem_free(device_ptr(pointer));
  } catch (const CheckError&) {
    // Nothing to free with: the driver never worked in this process.
  }
}

// The copies synchronize the context: cuMemcpyHtoD from pageable memory returns once the bytes
// are staged, and the NIC reads the memory next.
void copy_to_device(int gpu, void* target, const void* source, std::size_t length) {
  Driver& d = usable(gpu);
  const std::string what =
      "copy " + std::to_string(length) + " bytes to CUDA device " + std::to_string(gpu);
  d.check(d.memcpy_htod(device_ptr(target), source, length), "cuMemcpyHtoD", what);
  d.check(d.ctx_synchronize(), "cuCtxSynchronize", what);
}

void copy_to_host(int gpu, void* target, const void* source, std::size_t length) {
  Driver& d = usable(gpu);
  const std::string what =
      "copy " + std::to_string(length) + " bytes from CUDA device " + std::to_string(gpu);
  d.check(d.ctx_synchronize(), "cuCtxSynchronize", what);
  d.check(d.memcpy_dtoh(target, device_ptr(source), length), "cuMemcpyDtoH", what);
}

std::string dmabuf_unavailable(int gpu) {
  Driver& d = usable(gpu);
  if (d.get_handle_for_address_range == nullptr)
    return "the driver has no cuMemGetHandleForAddressRange (CUDA 11.7 and later)";
  Device device = 0;
  int supported = 0;
  if (d.device_get(&device, gpu) != 0 ||
      d.device_get_attribute(&supported, kAttributeDmaBufSupported, device) != 0 || supported == 0)
    return "CUDA device " + std::to_string(gpu) +
           " does not support dmabuf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)";
  return {};
}

DmabufExport export_dmabuf(int gpu, const void* data, std::size_t size) {
  Driver& d = usable(gpu);
  if (d.get_handle_for_address_range == nullptr)
    throw CheckError("the driver has no cuMemGetHandleForAddressRange");
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t start = begin & ~(page - 1);
  const std::uintptr_t end = (begin + size + page - 1) & ~(page - 1);
  int fd = -1;
  d.check(d.get_handle_for_address_range(&fd, static_cast<DevicePtr>(start), end - start,
                                         kRangeHandleDmaBufFd, 0),
          "cuMemGetHandleForAddressRange",
          "export " + std::to_string(size) + " bytes of CUDA device " + std::to_string(gpu) +
              " as a dmabuf");
  return DmabufExport{.fd = fd, .offset = begin - start};
}

}  // namespace ncclnet::cuda

namespace ncclnet {

void set_memory(const MemoryChoice& c) {
  cuda::choice() = c;
}

const MemoryChoice& memory() {
  return cuda::choice();
}

}  // namespace ncclnet
