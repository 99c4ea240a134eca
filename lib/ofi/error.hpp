// Turning libfabric return codes into loom errors. Setup paths throw; the data path logs once
// where the failure is decided and returns a Status.
#pragma once

#include <string>
#include <string_view>

namespace loom::ofi {

// "fi_strerror text (-code)" for a negative libfabric return code.
[[nodiscard]] std::string fi_error_text(long rc);

// Throws loom::Error{operation, provider, -rc, "<call> failed: <fi_strerror text>[: extra]"}.
[[noreturn]] void throw_fi_error(std::string_view operation, std::string_view call,
                                 std::string_view provider, long rc, std::string_view extra = {});

}  // namespace loom::ofi
