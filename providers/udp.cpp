// udp, reached as "udp;ofi_rxd" for RDM endpoints (tests only): rxd makes UDP datagrams
// reliable in software. It opens each new peer of an endpoint with a handshake of its own and
// resends datagrams that were not acknowledged, both only inside later libfabric calls of the
// sending process (control and data progress are manual). An inject is reported sent at once,
// so a sender whose request had ended and that made no further loom call left its message in
// rxd: the first eager message on a data rail rxd had not opened to that peer yet reached no
// one until LOOM_PEER_TIMEOUT_MS failed the receive. Without injects a send completes once rxd
// has it acknowledged, and its request keeps the sender progressing until then.
#include "providers/profile.hpp"

namespace loom::providers {

const Profile kUdpProfile{
    .family = "udp",
    .summary = "udp;ofi_rxd: no injects (rxd sends and resends only while the sender calls in)",
    .settings = {},
    .no_inject = "rxd delivers an injected message only while the sender keeps calling in",
};

}  // namespace loom::providers
