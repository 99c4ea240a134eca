// sockets (tests and by-hand runs): one TCP connection per peer, progressed by the provider's
// own thread. A connection that breaks under pending operations (the peer exited) fails them
// with FI_EIO, which loom reports as a peer error, as rxm's connection errors on tcp are.
#include <rdma/fi_errno.h>

#include "providers/profile.hpp"

namespace loom::providers {
namespace {

constexpr PeerGoneError kSocketsPeerGone[] = {
    {FI_EIO, "the connection to the peer broke"},
};

}  // namespace

const Profile kSocketsProfile{
    .family = "sockets",
    .summary = "sockets: a broken connection is a peer error",
    .settings = {},
    .peer_gone_errors = kSocketsPeerGone,
};

}  // namespace loom::providers
