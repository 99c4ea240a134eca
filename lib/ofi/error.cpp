#include "ofi/error.hpp"

#include <rdma/fi_errno.h>

#include "loom/error.hpp"

namespace loom::ofi {

std::string fi_error_text(long rc) {
  return std::string(fi_strerror(static_cast<int>(-rc))) + " (" + std::to_string(rc) + ")";
}

void throw_fi_error(std::string_view operation, std::string_view call, std::string_view provider,
                    long rc, std::string_view extra) {
  std::string detail = std::string(call) + " failed: " + fi_error_text(rc);
  if (!extra.empty()) detail += std::string(": ") + std::string(extra);
  throw Error(std::string(operation), std::string(provider), static_cast<int>(-rc), detail);
}

}  // namespace loom::ofi
