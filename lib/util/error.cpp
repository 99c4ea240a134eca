#include "loom/error.hpp"

namespace loom {
namespace {

// The provider's error text is already in `detail` (lib/ofi adds fi_strerror's words), so
// this layer needs no libfabric header.
std::string compose(const std::string& operation, const std::string& provider,
                    const std::string& detail) {
  std::string text = operation;
  if (!provider.empty()) text += " [" + provider + "]";
  return text + ": " + detail;
}

}  // namespace

Error::Error(std::string operation, std::string provider, int code, std::string detail)
    : std::runtime_error(compose(operation, provider, detail)),
      operation_(std::move(operation)),
      provider_(std::move(provider)),
      code_(code) {}

std::string_view to_string(Status status) noexcept {
  switch (status) {
    case Status::kOk:
      return "ok";
    case Status::kInProgress:
      return "in progress";
    case Status::kRetry:
      return "retry";
    case Status::kTruncated:
      return "truncated";
    case Status::kCancelled:
      return "cancelled";
    case Status::kInvalid:
      return "invalid argument";
    case Status::kPeerError:
      return "peer error";
    case Status::kError:
      return "error";
  }
  return "unknown";
}

}  // namespace loom
