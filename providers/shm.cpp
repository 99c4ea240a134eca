// shm: processes on one host only, one domain named "shm", string addresses, FI_MR_VIRT_ADDR.
#include <ctime>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <dirent.h>
#include <rdma/fi_errno.h>
#include <sys/stat.h>
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

// When this process started, in wall-clock seconds: its start in clock ticks after boot
// (/proc/self/stat, field 22) moved onto the wall clock by the boot clock. nullopt if unreadable.
std::optional<double> own_start_time() {
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Field 2 (the command) is in parentheses and may hold spaces: count fields after its ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string skipped;
  int field = 3;
  while (field < 22 && fields >> skipped) ++field;
  unsigned long long start_ticks = 0;
  if (field != 22 || !(fields >> start_ticks)) return std::nullopt;
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  timespec boot{};
  timespec wall{};
  if (ticks_per_second <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &boot) != 0 ||
      ::clock_gettime(CLOCK_REALTIME, &wall) != 0)
    return std::nullopt;
  const auto seconds = [](const timespec& t) {
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
  };
  const double age = seconds(boot) - double(start_ticks) / double(ticks_per_second);
  return seconds(wall) - age;
}

// Whether this process maps a file under `path` (/proc/self/maps names mapped files).
bool mapped_here(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto at = line.find(path);
    if (at != std::string::npos &&
        (at + path.size() == line.size() || line[at + path.size()] == ' '))
      return true;
  }
  return false;
}

// A region named for this process's pid that this process does not map and that was made
// before it started was left by an earlier process with the same pid, killed with its
// endpoints open: pids come round (32768 of them by default). shm 1.17 takes over a region
// whose recorded owner is gone, but the owner it reads is our own pid, alive, so our endpoint
// with that name fails to enable (EBUSY). A live region of ours is mapped from the moment it
// is sized until it is unlinked, and one being made (not yet mapped) is younger than us. The
// margin covers the tick resolution of the start time and small steps of the wall clock.
std::size_t remove_own_stale_regions() {
  constexpr double kMarginSeconds = 2.0;
  const std::optional<double> started = own_start_time();
  if (!started) return 0;
  const std::string prefix = std::to_string(::getpid()) + ":";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::size_t removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (!std::string_view(entry->d_name).starts_with(prefix)) continue;
    const std::string path = std::string("/dev/shm/") + entry->d_name;
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) continue;
    const double made = double(info.st_mtim.tv_sec) + double(info.st_mtim.tv_nsec) * 1e-9;
    if (made > *started - kMarginSeconds || mapped_here(path)) continue;
    if (::unlink(path.c_str()) == 0) ++removed;
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
    .remove_own_stale = remove_own_stale_regions,
    .carry_control = false,
    .eager_credits = kShmEagerCredits,
    .peer_paced_above = kShmInjectSize,
};

}  // namespace loom::providers
