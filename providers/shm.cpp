// shm: processes on one host only, one domain named "shm", string addresses, FI_MR_VIRT_ADDR.
#include <string>
#include <string_view>

#include <dirent.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

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

// 1.17's shm maps a region per endpoint as /dev/shm/<pid>:<name>, 16 MB each, and unlinks it
// at close. A killed process leaves them, and a later process given the same pid fails to
// enable its endpoints (fi_enable: EBUSY).
std::size_t remove_regions(int pid) {
  const std::string prefix = std::to_string(pid) + ":";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::size_t removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (!std::string_view(entry->d_name).starts_with(prefix)) continue;
    if (::unlink((std::string("/dev/shm/") + entry->d_name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

// A write with remote CQ data takes two commands in shm 1.17's receive queue (the command
// and its RMA iov) and the receiver's progress handles both; a tagged send takes one. With a
// credit for every message of a 64-deep window (fabtests' bandwidth window) nearly every small
// message goes as a send (README, "Protocols", has the rates); more credits gain little for
// their memory. 1 MiB per receiving communicator at the default LOOM_EAGER_MAX, of which a message
// touches only the pages it fills; shm's peers are the processes of one host.
constexpr unsigned kShmEagerCredits = 64;

// shm 1.17 completes sends and writes above its inject size (SMR_INJECT_SIZE) when the peer
// answers, through a response queue it reads in order (smr_progress_resp stops at the first
// busy entry); a fast write (process_vm_writev, no CQ data) completes in the call.
constexpr std::size_t kShmInjectSize = 4096;

}  // namespace

const Profile kShmProfile{
    .family = "shm",
    .summary = "shm: single host only; one domain, no NIC",
    .settings = {},
    .peer_gone_errors = kShmPeerGone,
    .remove_leftovers = remove_regions,
    .carry_control = false,
    .eager_credits = kShmEagerCredits,
    .peer_paced_above = kShmInjectSize,
};

}  // namespace loom::providers
