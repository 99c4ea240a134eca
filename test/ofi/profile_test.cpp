// Provider profiles: which environment defaults loom sets, and that a user's value wins.
#include "providers/profile.hpp"

#include <cstdlib>
#include <map>
#include <string>

#include <catch2/catch.hpp>

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "<unset>";
}

}  // namespace

TEST_CASE("provider profiles: environment defaults for the named family, user wins", "[profile]") {
  using loom::providers::apply_env_defaults;
  using loom::providers::profile_for;
  unsetenv("FI_OFI_RXM_USE_SRX");
  unsetenv("FI_CXI_RX_MATCH_MODE");

  apply_env_defaults("shm");
  CHECK(env("FI_OFI_RXM_USE_SRX") == "<unset>");
  CHECK(env("FI_CXI_RX_MATCH_MODE") == "<unset>");

  // rxm over tcp: per-connection bounce buffers (the shared queue cost 315 MB per process).
  apply_env_defaults("tcp;ofi_rxm");
  CHECK(env("FI_OFI_RXM_USE_SRX") == "0");
  CHECK(env("FI_CXI_RX_MATCH_MODE") == "<unset>");

  setenv("FI_OFI_RXM_USE_SRX", "1", 1);
  apply_env_defaults("verbs;ofi_rxm");
  CHECK(env("FI_OFI_RXM_USE_SRX") == "1");

  apply_env_defaults("cxi,shm");
  CHECK(env("FI_CXI_RX_MATCH_MODE") == "hybrid");

  // EFA turns device RDMA on where the device has it; forcing it aborts on first-generation
  // devices, so loom never sets it.
  unsetenv("FI_EFA_USE_DEVICE_RDMA");
  apply_env_defaults("efa");
  CHECK(env("FI_EFA_USE_DEVICE_RDMA") == "<unset>");

  CHECK(profile_for("tcp;ofi_rxm").family == "tcp");
  CHECK(profile_for("verbs;ofi_rxm").family == "verbs");
  CHECK(profile_for("epmr").family.empty());
  CHECK(profile_for("udp;ofi_rxd").family == "udp");
  CHECK(!profile_for("udp;ofi_rxd").no_inject.empty());
  CHECK(profile_for("tcp;ofi_rxm").no_inject.empty());
  CHECK(profile_for("sockets").peer_gone_errors.size() == 1);
  CHECK(profile_for("shm").peer_gone_errors.size() == 1);
  unsetenv("FI_OFI_RXM_USE_SRX");
  unsetenv("FI_CXI_RX_MATCH_MODE");
}

// The README's main command names no provider: libfabric picks one, so every family's
// defaults apply (rxm's shared receive queue otherwise cost 147 MB per communicator there).
TEST_CASE("provider profiles: every family's defaults when none is named", "[profile]") {
  using loom::providers::apply_env_defaults;
  for (const char* requested : {"", "^efa", "psm3"}) {
    unsetenv("FI_OFI_RXM_USE_SRX");
    unsetenv("FI_CXI_RX_MATCH_MODE");
    apply_env_defaults(requested);
    CHECK(env("FI_OFI_RXM_USE_SRX") == "0");
    CHECK(env("FI_CXI_RX_MATCH_MODE") == "hybrid");
  }
  unsetenv("FI_OFI_RXM_USE_SRX");
  unsetenv("FI_CXI_RX_MATCH_MODE");
}

// Setting every family's defaults at once is safe only while no two families disagree.
TEST_CASE("provider profiles: no variable gets two different defaults", "[profile]") {
  std::map<std::string, std::string> seen;
  for (const loom::providers::Profile* profile : loom::providers::all_profiles()) {
    for (const auto& env : profile->env_defaults) {
      const auto it = seen.emplace(env.name, env.value).first;
      INFO(env.name << " set by " << profile->family);
      CHECK(it->second == env.value);
    }
  }
  CHECK(seen.count("FI_OFI_RXM_USE_SRX") == 1);
}
