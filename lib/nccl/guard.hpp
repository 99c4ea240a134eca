// Nothing crosses the C ABI as an exception: every ncclNet entry runs its body in guard(),
// which turns what was thrown into an ncclResult_t and says why through NCCL's logger, once.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

#include "loom/error.hpp"
#include "nccl/abi.hpp"
#include "nccl/registry.hpp"

namespace loom::nccl {

// A caller's mistake (bad pointer kind, device, size): ncclInvalidArgument.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline abi::Result fail(const char* operation, abi::Result result, const std::string& why) {
  Registry::get().log(abi::kLogWarn, std::string(operation) + ": " + why);
  return result;
}

template <typename Body>
abi::Result guard(const char* operation, Body&& body) noexcept {
  try {
    return body();
  } catch (const Error& e) {
    return fail(operation, abi::kSystemError, e.what());
  } catch (const std::invalid_argument& e) {
    return fail(operation, abi::kInvalidArgument, e.what());
  } catch (const std::bad_alloc&) {
    return fail(operation, abi::kSystemError, "out of memory");
  } catch (const std::exception& e) {
    return fail(operation, abi::kInternalError, e.what());
  } catch (...) {
    return fail(operation, abi::kInternalError, "unknown exception");
  }
}

// Casts an opaque NCCL pointer to the object it should be, or throws InvalidArgument.
template <typename T>
T& expect(void* pointer, Kind kind, const char* what) {
  auto* object = static_cast<T*>(pointer);
  if (object == nullptr || object->kind() != kind)
    throw InvalidArgument(std::string("not a loom ") + what);
  return *object;
}

}  // namespace loom::nccl
