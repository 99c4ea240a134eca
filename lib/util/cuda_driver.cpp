// The CUDA driver table of a loom built with -Dcuda=enabled: cuda.h gives the types, dlsym the
// functions, by the names libcuda.so.1 exports (cuda.h maps cuMemAlloc to cuMemAlloc_v2, ...).
#include "util/cuda_driver.hpp"

#include <cstdio>
#include <mutex>
#include <vector>

#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include "loom/error.hpp"
#include "util/log.hpp"

namespace loom::util::cuda {
namespace {

constexpr const char* kDriverLibrary = "libcuda.so.1";

struct LibraryCloser {
  void operator()(void* handle) const noexcept { dlclose(handle); }
};
using LibraryHandle = std::unique_ptr<void, LibraryCloser>;

std::string hex(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  return text;
}

}  // namespace

struct Driver::Table {
  std::string library;
  LibraryHandle handle;
  // Required.
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceGetPCIBusId) device_get_pci_bus_id = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_ctx_release = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push_current = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop_current = nullptr;
  decltype(&::cuPointerGetAttribute) pointer_get_attribute = nullptr;
  decltype(&::cuMemAlloc) mem_alloc = nullptr;
  decltype(&::cuMemFree) mem_free = nullptr;
  decltype(&::cuMemcpyHtoD) memcpy_htod = nullptr;
  decltype(&::cuMemcpyDtoH) memcpy_dtoh = nullptr;
  decltype(&::cuMemsetD8) memset_d8 = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  // Optional: CUDA 11.7 and later.
  decltype(&::cuMemGetHandleForAddressRange) get_handle_for_address_range = nullptr;

  // Primary contexts retained, by device ordinal (null: not yet); released with the table.
  mutable std::mutex contexts_mutex;
  mutable std::vector<CUcontext> contexts;

  template <typename F>
  void bind(F& slot, const char* symbol, bool required) {
    slot = reinterpret_cast<F>(dlsym(handle.get(), symbol));
    if (slot == nullptr && required) {
      throw Error("load the CUDA driver", "", 0,
                  library + " lacks " + symbol + " (a driver older than CUDA 11?)");
    }
  }

  [[nodiscard]] std::string error_text(CUresult result) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (get_error_name != nullptr) get_error_name(result, &name);
    if (get_error_string != nullptr) get_error_string(result, &text);
    return std::string(name != nullptr ? name : "CUDA error") + " (" + std::to_string(result) +
           "): " + (text != nullptr ? text : "no description");
  }

  void check(CUresult result, const std::string& operation, const char* call) const {
    if (result != CUDA_SUCCESS) {
      throw Error(operation, "", 0, std::string(call) + " failed: " + error_text(result));
    }
  }

  CUcontext context(int device) const {
    const std::lock_guard lock(contexts_mutex);
    if (device < 0) throw Error("use CUDA device", "", 0, "negative device ordinal");
    if (static_cast<std::size_t>(device) >= contexts.size()) contexts.resize(device + 1, nullptr);
    CUcontext& context = contexts[device];
    if (context == nullptr) {
      const std::string operation = "use CUDA device " + std::to_string(device);
      CUdevice handle = 0;
      check(device_get(&handle, device), operation, "cuDeviceGet");
      check(primary_ctx_retain(&context, handle), operation, "cuDevicePrimaryCtxRetain");
    }
    return context;
  }

  // Runs `work` (a driver call named `call`) with `device`'s primary context current on this
  // thread, then restores the thread's previous context.
  template <typename Work>
  void in_context(int device, const std::string& operation, const char* call, Work&& work) const {
    CUcontext primary = context(device);
    check(ctx_push_current(primary), operation, "cuCtxPushCurrent");
    const CUresult result = work();
    CUcontext popped = nullptr;
    ctx_pop_current(&popped);
    check(result, operation, call);
  }

  ~Table() {
    for (std::size_t device = 0; device < contexts.size(); ++device) {
      if (contexts[device] == nullptr) continue;
      CUdevice handle = 0;
      if (device_get(&handle, static_cast<int>(device)) == CUDA_SUCCESS) {
        primary_ctx_release(handle);
      }
    }
  }
};

Driver::Driver(const std::string& library) : table_(std::make_unique<Table>()) {
  Table& t = *table_;
  t.library = library;
  t.handle.reset(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (!t.handle) {
    const char* why = dlerror();
    throw Error("load the CUDA driver", "", 0,
                "dlopen(" + library + ") failed: " + (why != nullptr ? why : "unknown reason") +
                    " (no NVIDIA driver on this machine?)");
  }
  t.bind(t.init, "cuInit", true);
  t.bind(t.driver_get_version, "cuDriverGetVersion", true);
  t.bind(t.get_error_name, "cuGetErrorName", true);
  t.bind(t.get_error_string, "cuGetErrorString", true);
  t.bind(t.device_get_count, "cuDeviceGetCount", true);
  t.bind(t.device_get, "cuDeviceGet", true);
  t.bind(t.device_get_name, "cuDeviceGetName", true);
  t.bind(t.device_get_pci_bus_id, "cuDeviceGetPCIBusId", true);
  t.bind(t.device_get_attribute, "cuDeviceGetAttribute", true);
  t.bind(t.primary_ctx_retain, "cuDevicePrimaryCtxRetain", true);
  t.bind(t.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2", true);
  t.bind(t.ctx_push_current, "cuCtxPushCurrent_v2", true);
  t.bind(t.ctx_pop_current, "cuCtxPopCurrent_v2", true);
  t.bind(t.pointer_get_attribute, "cuPointerGetAttribute", true);
  t.bind(t.mem_alloc, "cuMemAlloc_v2", true);
  t.bind(t.mem_free, "cuMemFree_v2", true);
  t.bind(t.memcpy_htod, "cuMemcpyHtoD_v2", true);
  t.bind(t.memcpy_dtoh, "cuMemcpyDtoH_v2", true);
  t.bind(t.memset_d8, "cuMemsetD8_v2", true);
  t.bind(t.stream_synchronize, "cuStreamSynchronize", true);
  t.bind(t.get_handle_for_address_range, "cuMemGetHandleForAddressRange", false);
}

Driver::~Driver() = default;

void Driver::initialize() {
  table_->check(table_->init(0), "initialize the CUDA driver (" + table_->library + ")", "cuInit");
}

const std::string& Driver::library() const noexcept {
  return table_->library;
}

int Driver::version() const {
  int version = 0;
  table_->check(table_->driver_get_version(&version), "read the CUDA driver version",
                "cuDriverGetVersion");
  return version;
}

int Driver::device_count() const {
  int count = 0;
  table_->check(table_->device_get_count(&count), "count CUDA devices", "cuDeviceGetCount");
  return count;
}

std::string Driver::device_name(int device) const {
  const std::string operation = "name CUDA device " + std::to_string(device);
  CUdevice handle = 0;
  table_->check(table_->device_get(&handle, device), operation, "cuDeviceGet");
  char name[256] = {};
  table_->check(table_->device_get_name(name, sizeof name, handle), operation, "cuDeviceGetName");
  return name;
}

std::string Driver::pci_bus_id(int device) const {
  const std::string operation = "locate CUDA device " + std::to_string(device);
  CUdevice handle = 0;
  table_->check(table_->device_get(&handle, device), operation, "cuDeviceGet");
  char id[32] = {};
  table_->check(table_->device_get_pci_bus_id(id, sizeof id, handle), operation,
                "cuDeviceGetPCIBusId");
  return id;
}

bool Driver::dmabuf_supported(int device) const noexcept {
  if (table_->get_handle_for_address_range == nullptr) return false;
  CUdevice handle = 0;
  if (table_->device_get(&handle, device) != CUDA_SUCCESS) return false;
  int supported = 0;
  return table_->device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, handle) ==
             CUDA_SUCCESS &&
         supported != 0;
}

PointerInfo Driver::pointer_info(const void* pointer) const noexcept {
  const auto address = reinterpret_cast<CUdeviceptr>(pointer);
  unsigned int type = 0;
  const CUresult result =
      table_->pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address);
  // Memory the driver never saw (malloc'd host memory) is an invalid value to it.
  if (result == CUDA_ERROR_INVALID_VALUE) return {PointerKind::kHost, -1};
  if (result != CUDA_SUCCESS) return {};
  if (type != CU_MEMORYTYPE_DEVICE) return {PointerKind::kHost, -1};
  int device = -1;
  if (table_->pointer_get_attribute(&device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address) !=
      CUDA_SUCCESS) {
    device = -1;
  }
  unsigned int managed = 0;
  if (table_->pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, address) !=
      CUDA_SUCCESS) {
    managed = 0;
  }
  return {PointerKind::kDevice, device, managed != 0};
}

DmabufRange Driver::dmabuf_range(const void* base, std::size_t length, int device) const {
  const std::string operation = "export " + std::to_string(length) + " bytes at " + hex(base) +
                                " of CUDA device " + std::to_string(device) + " as a dmabuf";
  if (table_->get_handle_for_address_range == nullptr) {
    throw Error(operation, "", 0, table_->library + " has no cuMemGetHandleForAddressRange");
  }
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(base);
  const std::uintptr_t start = begin & ~(page - 1);
  const std::uintptr_t end = (begin + length + page - 1) & ~(page - 1);
  int fd = -1;
  table_->in_context(device, operation, "cuMemGetHandleForAddressRange", [&] {
    return table_->get_handle_for_address_range(&fd, static_cast<CUdeviceptr>(start), end - start,
                                                CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  });
  return DmabufRange{
      .fd = DmabufFd(fd), .offset = begin - start, .start = reinterpret_cast<const void*>(start)};
}

void* Driver::allocate(int device, std::size_t size) {
  CUdeviceptr pointer = 0;
  table_->in_context(
      device,
      "allocate " + std::to_string(size) + " bytes on CUDA device " + std::to_string(device),
      "cuMemAlloc", [&] { return table_->mem_alloc(&pointer, size); });
  return reinterpret_cast<void*>(pointer);
}

void Driver::free(int device, void* pointer) noexcept {
  try {
    table_->in_context(device, "free CUDA memory at " + hex(pointer), "cuMemFree",
                       [&] { return table_->mem_free(reinterpret_cast<CUdeviceptr>(pointer)); });
  } catch (const Error& e) {
    log().error("{}", e.what());
  }
}

void Driver::copy_to_device(int device, void* target, const void* source,
                            std::size_t length) const {
  table_->in_context(
      device, "copy " + std::to_string(length) + " bytes to CUDA device " + std::to_string(device),
      "cuMemcpyHtoD", [&] {
        const CUresult result =
            table_->memcpy_htod(reinterpret_cast<CUdeviceptr>(target), source, length);
        return result != CUDA_SUCCESS ? result : table_->stream_synchronize(nullptr);
      });
}

void Driver::copy_to_host(int device, void* target, const void* source, std::size_t length) const {
  table_->in_context(
      device,
      "copy " + std::to_string(length) + " bytes from CUDA device " + std::to_string(device),
      "cuMemcpyDtoH",
      [&] { return table_->memcpy_dtoh(target, reinterpret_cast<CUdeviceptr>(source), length); });
}

void Driver::fill(int device, void* target, std::uint8_t value, std::size_t length) const {
  table_->in_context(
      device, "fill " + std::to_string(length) + " bytes on CUDA device " + std::to_string(device),
      "cuMemsetD8", [&] {
        const CUresult result =
            table_->memset_d8(reinterpret_cast<CUdeviceptr>(target), value, length);
        return result != CUDA_SUCCESS ? result : table_->stream_synchronize(nullptr);
      });
}

namespace {

// The one process-wide table (see the header): set once under `once`, read-only afterwards.
struct ProcessDriver {
  std::once_flag once;
  std::unique_ptr<Driver> driver;
  std::string error;
};

ProcessDriver& process_driver() {
  static ProcessDriver state;
  return state;
}

}  // namespace

Driver& Driver::instance() {
  ProcessDriver& state = process_driver();
  std::call_once(state.once, [&state] {
    try {
      auto driver = std::make_unique<Driver>(kDriverLibrary);
      driver->initialize();
      log().info("CUDA driver {} loaded from {}", driver->version(), kDriverLibrary);
      state.driver = std::move(driver);
    } catch (const Error& e) {
      state.error = e.what();
    }
  });
  if (!state.driver) throw Error("use CUDA device memory", "", 0, state.error);
  return *state.driver;
}

Driver* Driver::if_loaded() noexcept {
  void* loaded = dlopen(kDriverLibrary, RTLD_NOW | RTLD_NOLOAD);
  if (loaded == nullptr) return nullptr;
  dlclose(loaded);  // only a look: the table holds its own reference
  try {
    return &instance();
  } catch (const Error&) {
    return nullptr;
  }
}

}  // namespace loom::util::cuda
