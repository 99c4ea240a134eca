// tcp (reached as "tcp;ofi_rxm" for RDM endpoints): one domain per network interface, named
// after it ("lo", "eth0"); RMA addresses are offsets (no FI_MR_VIRT_ADDR) and keys are chosen by
// loom (no FI_MR_PROV_KEY). Single-host tests pin LOOM_NICS=lo.
//
// rxm over tcp defaults to a shared receive queue of 4096 bounce buffers (16 KiB each) per
// endpoint. A loom lane's endpoints each talk to one peer, so sharing buys nothing and the pool
// dominates host memory; per-connection buffers (rxm's 128) are the smaller pool (figures in
// README, Providers).
#include "providers/profile.hpp"

namespace loom::providers {
namespace {

constexpr ProviderSetting kTcpEnv[] = {
    {"FI_OFI_RXM_USE_SRX", "1",
     "one shared receive queue per endpoint: lanes serve every peer, so per-connection "
     "buffers would cost each peer (tcp: 6-9 MiB per peer at 16-32 peers, against 0.2)"},
    {"FI_OFI_RXM_MSG_RX_SIZE", "256",
     "that queue's bounce buffers; rxm's 4096 for a shared queue cost 250 MB and 190 ms per "
     "process for no gain (fi_p2p_bw 4 KiB-16 MiB within noise)"},
};

}  // namespace

const Profile kTcpProfile{
    .family = "tcp",
    .summary = "tcp;ofi_rxm: domains are interfaces; pin one with LOOM_NICS (e.g. lo for tests)",
    .settings = kTcpEnv,
};

}  // namespace loom::providers
