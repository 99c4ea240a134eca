// rxm, the layer that gives tcp and verbs RDM endpoints (tcp;ofi_rxm, verbs;ofi_rxm): one set
// of variables, so the two families recommend the same values.
//
// A loom lane serves every peer reached through its NICs, so rxm's per-connection bounce
// buffers (FI_OFI_RXM_USE_SRX=0: 128 per connection) cost each peer, and one shared receive
// queue per endpoint costs a fixed amount; rxm's own size for that queue (4096 x 16 KiB) is
// far more than a lane uses (figures in README, Providers).
#pragma once

#include "providers/profile.hpp"

namespace loom::providers {

inline constexpr ProviderSetting kRxmSettings[] = {
    {"FI_OFI_RXM_USE_SRX", "1",
     "one shared receive queue per endpoint: lanes serve every peer, so per-connection "
     "buffers would cost each peer (tcp: 6-9 MiB per peer at 16-32 peers, against 0.2)"},
    {"FI_OFI_RXM_MSG_RX_SIZE", "256",
     "that queue's bounce buffers; rxm's 4096 for a shared queue cost 250 MB and 190 ms per "
     "process for no gain (fi_p2p_bw 4 KiB-16 MiB within noise)"},
};

}  // namespace loom::providers
