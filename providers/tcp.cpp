// tcp (reached as "tcp;ofi_rxm" for RDM endpoints): one domain per network interface, named
// after it ("lo", "eth0"); RMA addresses are offsets (no FI_MR_VIRT_ADDR) and keys are chosen by
// loom (no FI_MR_PROV_KEY). Single-host tests pin LOOM_NICS=lo.
// rxm's settings: providers/rxm.hpp.
#include "providers/profile.hpp"
#include "providers/rxm.hpp"

namespace loom::providers {

const Profile kTcpProfile{
    .family = "tcp",
    .summary = "tcp;ofi_rxm: domains are interfaces; pin one with LOOM_NICS (e.g. lo for tests)",
    .settings = kRxmSettings,
    .inject_writes = false,
    .completion_threading = true,
};

}  // namespace loom::providers
