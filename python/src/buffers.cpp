#include "buffers.hpp"

#include <string>
#include <utility>
#include <vector>

#include "errors.hpp"

namespace loom::python {

// DLPack's C ABI (dmlc/dlpack, dlpack.h, the unversioned "dltensor" capsule every producer
// gives when called without max_version): written out here from the specification.
struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null: compact row-major
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
static_assert(sizeof(DLTensor) == 48 && sizeof(DLManagedTensor) == 64, "DLPack's ABI");

namespace {

constexpr std::int32_t kDLCPU = 1;
constexpr std::int32_t kDLCUDA = 2;
constexpr std::int32_t kDLCUDAHost = 3;
constexpr std::int32_t kDLCUDAManaged = 13;

std::string type_name(py::handle object) {
  return Py_TYPE(object.ptr())->tp_name;
}

// Compact row-major, the only layout a transfer of raw bytes can take: each stride (in items)
// the product of the extents after it, dimensions of extent 1 having any stride.
bool row_major(const std::int64_t* shape, const std::int64_t* strides, std::int64_t ndim,
               std::int64_t unit) {
  if (strides == nullptr) return true;
  std::int64_t expected = unit;
  for (std::int64_t d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 0) return true;  // empty: no byte is ever read
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

// (device type, ordinal) from __dlpack_device__, where the object has it.
std::pair<std::int32_t, int> dlpack_device(py::handle object, std::int32_t fallback) {
  if (!py::hasattr(object, "__dlpack_device__")) return {fallback, 0};
  const py::tuple device = object.attr("__dlpack_device__")();
  return {device[0].cast<std::int32_t>(), device[1].cast<int>()};
}

}  // namespace

HeldBuffer::HeldBuffer(HeldBuffer&& other) noexcept {
  take(other);
}

HeldBuffer& HeldBuffer::operator=(HeldBuffer&& other) noexcept {
  if (this != &other) {
    release();
    take(other);
  }
  return *this;
}

void HeldBuffer::take(HeldBuffer& other) noexcept {
  kind_ = std::exchange(other.kind_, Kind::kNone);
  view_ = other.view_;
  other.view_ = Py_buffer{};
  reference_ = std::exchange(other.reference_, nullptr);
  tensor_ = std::exchange(other.tensor_, nullptr);
  data_ = other.data_;
  size_ = other.size_;
  type_ = other.type_;
  device_ = other.device_;
  readonly_ = other.readonly_;
}

void HeldBuffer::release() noexcept {
  switch (std::exchange(kind_, Kind::kNone)) {
    case Kind::kExport:
      PyBuffer_Release(&view_);
      break;
    case Kind::kReference:
      Py_CLEAR(reference_);
      break;
    case Kind::kTensor:
      if (tensor_->deleter != nullptr) tensor_->deleter(tensor_);
      tensor_ = nullptr;
      break;
    case Kind::kNone:
      break;
  }
  data_ = nullptr;
  size_ = 0;
}

HeldBuffer HeldBuffer::acquire(py::handle object, bool writable) {
  HeldBuffer held;
  if (PyObject_CheckBuffer(object.ptr()) != 0) {
    if (PyObject_GetBuffer(object.ptr(), &held.view_, PyBUF_ANY_CONTIGUOUS) != 0) {
      py::error_already_set why;
      raise_invalid("a " + type_name(object) +
                    " whose memory is not contiguous: " + std::string(py::str(why.value())));
    }
    held.kind_ = Kind::kExport;
    held.data_ = static_cast<std::byte*>(held.view_.buf);
    held.size_ = static_cast<std::size_t>(held.view_.len);
    held.readonly_ = held.view_.readonly != 0;
  } else if (py::hasattr(object, "__cuda_array_interface__")) {
    const py::dict interface = object.attr("__cuda_array_interface__");
    const py::tuple shape = interface["shape"];
    const std::string typestr = py::str(interface["typestr"]);
    const py::tuple data = interface["data"];
    const std::int64_t item = typestr.size() > 2 ? std::stoll(typestr.substr(2)) : 0;
    std::vector<std::int64_t> extents;
    for (py::handle extent : shape) extents.push_back(extent.cast<std::int64_t>());
    std::vector<std::int64_t> strides;
    const py::object stride_object = interface.attr("get")("strides");
    if (!stride_object.is_none()) {
      for (py::handle stride : stride_object) strides.push_back(stride.cast<std::int64_t>());
    }
    const auto ndim = static_cast<std::int64_t>(extents.size());
    if (!row_major(extents.data(), strides.empty() ? nullptr : strides.data(), ndim, item)) {
      raise_invalid("a " + type_name(object) + " whose memory is not contiguous");
    }
    std::int64_t bytes = item;
    for (std::int64_t extent : extents) bytes *= extent;
    const auto [device_type, device] = dlpack_device(object, kDLCUDA);
    held.kind_ = Kind::kReference;
    held.reference_ = object.inc_ref().ptr();
    held.data_ = reinterpret_cast<std::byte*>(data[0].cast<std::uintptr_t>());
    held.size_ = static_cast<std::size_t>(bytes);
    held.readonly_ = data[1].cast<bool>();
    held.type_ =
        device_type == kDLCPU || device_type == kDLCUDAHost ? MemoryType::kHost : MemoryType::kCuda;
    held.device_ = device;
  } else if (py::hasattr(object, "__dlpack__")) {
    py::object capsule = object.attr("__dlpack__")();
    auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (tensor == nullptr) throw py::error_already_set();
    // Consumed: the producer's capsule destructor leaves a renamed capsule's tensor alone.
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
    held.kind_ = Kind::kTensor;
    held.tensor_ = tensor;
    const DLTensor& t = tensor->dl_tensor;
    const std::int64_t item = (std::int64_t{t.dtype.bits} * t.dtype.lanes + 7) / 8;
    if (!row_major(t.shape, t.strides, t.ndim, 1)) {
      raise_invalid("a " + type_name(object) + " whose memory is not contiguous");
    }
    std::int64_t bytes = item;
    for (std::int32_t d = 0; d < t.ndim; ++d) bytes *= t.shape[d];
    held.data_ = static_cast<std::byte*>(t.data) + t.byte_offset;
    held.size_ = static_cast<std::size_t>(bytes);
    switch (t.device.device_type) {
      case kDLCPU:
      case kDLCUDAHost:
        held.type_ = MemoryType::kHost;
        break;
      case kDLCUDA:
      case kDLCUDAManaged:
        held.type_ = MemoryType::kCuda;
        held.device_ = t.device.device_id;
        break;
      default:
        raise_invalid("a " + type_name(object) + " on DLPack device type " +
                      std::to_string(t.device.device_type) +
                      ": loom moves host and CUDA memory only");
    }
  } else {
    throw py::type_error(
        "expected an object with the buffer protocol (numpy array, bytearray, "
        "memoryview), __cuda_array_interface__ or __dlpack__, not " +
        type_name(object));
  }
  if (writable && held.readonly_) {
    raise_invalid("a read-only " + type_name(object) + " cannot receive data");
  }
  return held;
}

}  // namespace loom::python
