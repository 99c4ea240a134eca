// Provider selection: one fi_getinfo with the hints loom handles, then one Nic per domain.
#pragma once

#include <memory>
#include <vector>

#include "loom/config.hpp"
#include "ofi/nic.hpp"

namespace loom::ofi {

// Opens the NICs `config` asks for (LOOM_PROVIDER, LOOM_NICS, LOOM_LOOPBACK_ONLY; FI_PROVIDER
// applies inside libfabric), all of one provider, in the order LOOM_NICS gives or libfabric
// lists them. When nothing matches, throws loom::Error listing every provider libfabric knows
// and why each was refused.
[[nodiscard]] std::vector<std::unique_ptr<Nic>> open_nics(const Config& config);

}  // namespace loom::ofi
