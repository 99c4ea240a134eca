// Provider profiles: which environment defaults loom sets, and that a user's value wins.
#include "providers/profile.hpp"

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "<unset>";
}

}  // namespace

TEST_CASE("provider profiles: environment defaults only for the named family, user wins",
          "[profile]") {
  using loom::providers::apply_env_defaults;
  using loom::providers::profile_for;
  unsetenv("FI_OFI_RXM_USE_SRX");
  unsetenv("FI_EFA_USE_DEVICE_RDMA");

  apply_env_defaults("shm");
  CHECK(env("FI_OFI_RXM_USE_SRX") == "<unset>");
  CHECK(env("FI_EFA_USE_DEVICE_RDMA") == "<unset>");

  // rxm over tcp: per-connection bounce buffers (the shared queue cost 315 MB per process).
  apply_env_defaults("tcp;ofi_rxm");
  CHECK(env("FI_OFI_RXM_USE_SRX") == "0");

  setenv("FI_OFI_RXM_USE_SRX", "1", 1);
  apply_env_defaults("verbs;ofi_rxm");
  CHECK(env("FI_OFI_RXM_USE_SRX") == "1");

  apply_env_defaults("efa,shm");
  CHECK(env("FI_EFA_USE_DEVICE_RDMA") == "1");

  CHECK(profile_for("tcp;ofi_rxm").family == "tcp");
  CHECK(profile_for("verbs;ofi_rxm").family == "verbs");
  CHECK(profile_for("epmr").family.empty());
  unsetenv("FI_OFI_RXM_USE_SRX");
  unsetenv("FI_EFA_USE_DEVICE_RDMA");
}
