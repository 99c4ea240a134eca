// Python objects as memory loom can register and move: the buffer protocol (numpy arrays,
// bytearray, memoryview, mmap, ...), __cuda_array_interface__ and __dlpack__ (torch and cupy
// tensors; CUDA memory needs a loom built with -Dcuda=enabled). No raw address ever crosses the
// Python API: loom reads them from the objects.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pybind11/pybind11.h>

#include "loom/memory.hpp"

namespace loom::python {

namespace py = pybind11;

struct DLManagedTensor;  // DLPack's ABI (buffers.cpp)

// An object's memory, held until release(): its buffer export (while one is held a bytearray
// cannot be resized nor a numpy array's memory freed), a reference to a
// __cuda_array_interface__ object, or a consumed DLPack tensor. Move-only. Everything here,
// the destructor included, runs with the GIL held.
class HeldBuffer {
 public:
  HeldBuffer() = default;
  HeldBuffer(HeldBuffer&& other) noexcept;
  HeldBuffer& operator=(HeldBuffer&& other) noexcept;
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  ~HeldBuffer() { release(); }

  // Throws TypeError for an object with neither interface, InvalidError for memory that is not
  // contiguous or, where `writable`, read-only.
  static HeldBuffer acquire(py::handle object, bool writable);
  void release() noexcept;

  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] MemoryType type() const noexcept { return type_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] bool readonly() const noexcept { return readonly_; }
  [[nodiscard]] bool held() const noexcept { return kind_ != Kind::kNone; }

 private:
  enum class Kind : std::uint8_t { kNone, kExport, kReference, kTensor };
  void take(HeldBuffer& other) noexcept;

  Kind kind_ = Kind::kNone;
  Py_buffer view_{};                   // kExport
  PyObject* reference_ = nullptr;      // kReference
  DLManagedTensor* tensor_ = nullptr;  // kTensor: its deleter runs at release
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  MemoryType type_ = MemoryType::kHost;
  int device_ = 0;
  bool readonly_ = false;
};

}  // namespace loom::python
