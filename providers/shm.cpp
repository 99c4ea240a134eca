// shm: processes on one host only, one domain named "shm", string addresses, FI_MR_VIRT_ADDR.
#include <string>
#include <string_view>

#include <dirent.h>
#include <fcntl.h>
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

// 1.17's shm maps a region per endpoint as /dev/shm/<pid>:<uid>:<index>, 16 MB each, and
// unlinks it at close. A killed process leaves them, and a later process given the same pid
// fails to enable its endpoints (fi_enable: EBUSY): shm takes over a region whose recorded owner
// is gone, but for a pid come round the owner it reads is the live process making it.
//
// Names alone cannot tell a leftover from a live region: a process of another pid namespace
// sharing /dev/shm (containers run with --ipc=host) may own the same name. Whether anyone holds
// the file can: a write lease is granted only on a file no process has open, and a mapping
// keeps its file open, whatever namespace the process runs in. shm keeps its fd open from
// creating a region until it is mapped, and the mapping until after the unlink.

// Unlinks `path` if no process holds it, under the lease so that no open slips in between.
// False where it is held, or leases cannot tell (/proc/sys/fs/leases-enable, another owner).
bool unlink_if_unused(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  bool unlinked = false;
  if (::fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
    unlinked = ::unlink(path.c_str()) == 0;
    ::fcntl(fd, F_SETLEASE, F_UNLCK);
  }
  ::close(fd);
  return unlinked;
}

// Each /dev/shm file named for `pid`, unlinked; `only_unused`: only those no process holds.
std::size_t remove_named_regions(int pid, bool only_unused) {
  const std::string prefix = std::to_string(pid) + ":";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::size_t removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (!std::string_view(entry->d_name).starts_with(prefix)) continue;
    const std::string path = std::string("/dev/shm/") + entry->d_name;
    if (only_unused ? unlink_if_unused(path) : ::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

// For a pid that no longer exists here (remove_leftovers_of checked): its regions go even
// while peers still map them (the memory goes with their last mapping).
std::size_t remove_regions(int pid) {
  return remove_named_regions(pid, false);
}

// Regions named for this process's pid that no process holds: not ours (ours are mapped) nor a
// live namesake's in another pid namespace, so an earlier holder of the pid left them.
std::size_t remove_own_stale_regions() {
  return remove_named_regions(::getpid(), true);
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

// Eager messages stay within the inject size (above), so 8-16 KiB would otherwise take the
// receiver's clear-to-send and the sender's two writes (its body, then the CQ data) where shm's
// own send takes one command and the receiver's process_vm_readv. As injected 4 KiB eager
// messages each is done in the call, as any inject, and the receiver copies each while the
// next one comes. Two at most: each fragment moves its 4 KiB between the cores through shm's
// inject buffers, ~0.3 us on one VM and ~1.7 on another, where three or four fragments are
// slower than the written path; on the first the written path stays within 1.05x fabtests'
// (docs/performance.md, twenty-fifth session, has both machines).
constexpr unsigned kShmEagerFragments = 2;

}  // namespace

const Profile kShmProfile{
    .family = "shm",
    .summary = "shm: single host only; one domain, no NIC",
    .settings = {},
    .peer_gone_errors = kShmPeerGone,
    .remove_leftovers = remove_regions,
    .remove_own_stale = remove_own_stale_regions,
    .carry_control = false,
    .eager_credits = kShmEagerCredits,
    .eager_fragments = kShmEagerFragments,
    .peer_paced_above = kShmInjectSize,
    .lanes_per_direction = true,
};

}  // namespace loom::providers
