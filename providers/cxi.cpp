// HPE Slingshot CXI: requires FI_MR_ENDPOINT and provider keys, so every registration is bound
// to and enabled on each endpoint that uses it (decided in lib/ofi from the returned mr_mode).
#include "providers/profile.hpp"

namespace loom::providers {
namespace {

constexpr ProviderSetting kCxiEnv[] = {
    {"FI_CXI_RX_MATCH_MODE", "hybrid",
     "hardware tag matching falls back to software instead of failing when the NIC's "
     "unexpected-message list overflows under many communicators"},
};

}  // namespace

const Profile kCxiProfile{
    .family = "cxi",
    .summary = "CXI: FI_MR_ENDPOINT registrations (bound + enabled per endpoint), hybrid matching",
    .settings = kCxiEnv,
};

}  // namespace loom::providers
