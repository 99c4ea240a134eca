// shm: processes on one host only, one domain named "shm", string addresses, FI_MR_VIRT_ADDR.
#include <rdma/fi_errno.h>

#include "providers/profile.hpp"

namespace loom::providers {
namespace {

// Beyond its inject size shm copies a message between the processes (process_vm_readv or
// writev) when the receiver takes it, and 1.17 reports any failed copy as FI_EIO. loom's
// buffers stay registered and mapped while a transfer uses them, so a failed copy means the
// other process exited: a peer error, as a lost connection is on tcp.
constexpr PeerGoneError kShmPeerGone[] = {
    {FI_EIO, "a copy from or to the peer's memory failed: the peer process exited"},
};

}  // namespace

const Profile kShmProfile{
    .family = "shm",
    .summary = "shm: single host only; one domain, no NIC",
    .settings = {},
    .peer_gone_errors = kShmPeerGone,
};

}  // namespace loom::providers
