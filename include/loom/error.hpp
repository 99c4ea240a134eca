// Errors and status codes shared by every layer of loom.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

// Data-path result. Setup calls throw loom::Error instead.
enum class Status : std::uint8_t {
  kOk = 0,
  kInProgress,  // not done yet: call test() again
  kRetry,       // no resources right now (provider back-pressure); retry after progress
  kTruncated,   // message larger than the posted buffer (reported on both sides)
  kCancelled,   // request cancelled by close()
  kInvalid,     // bad argument (unregistered buffer, too many buffers, closed comm, ...)
  kPeerError,   // the peer failed, refused, or did not answer in time
  kError,       // provider error; the request's error text says which
};

[[nodiscard]] std::string_view to_string(Status status) noexcept;

// Thrown by setup calls: names the operation, the provider and the provider's error text.
class Error : public std::runtime_error {
 public:
  // `code` is a positive libfabric/errno value, or 0 when the error is loom's own; `detail`
  // already carries the provider's words for it.
  Error(std::string operation, std::string provider, int code, std::string detail);

  [[nodiscard]] const std::string& operation() const noexcept { return operation_; }
  [[nodiscard]] const std::string& provider() const noexcept { return provider_; }
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  std::string operation_;
  std::string provider_;
  int code_;
};

}  // namespace loom
