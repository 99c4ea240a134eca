// What each libfabric provider family needs from loom, one file per family. Everything
// provider-specific lives under providers/; MR handling is decided from the returned fi_info
// bits, never from these names.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace loom::providers {

// A provider parameter loom recommends, and why. Providers read their parameters only from the
// environment, which loom never writes (writing it races every other thread reading it): loom logs
// the recommendations the environment lacks, and an application applies them (fi_p2p_bw does,
// before it starts threads) through loom::recommended_provider_settings.
struct ProviderSetting {
  const char* name;
  const char* value;
  const char* why;
};

// An error code (positive, as in fi_cq_err_entry::err) by which the provider reports a
// transfer that the peer's exit cut off, beside the connection errors every provider uses.
struct PeerGoneError {
  int code;
  const char* meaning;  // appended to the provider's text for the user
};

// Device limits read from the device itself where libfabric does not report them.
struct DeviceLimits {
  std::size_t max_queue_depth = 0;
  std::size_t max_cq_entries = 0;
  std::size_t max_endpoints = 0;
};

struct Profile {
  std::string_view family;   // core provider name as libfabric reports it ("tcp", "efa", ...)
  std::string_view summary;  // what users of this provider should know, logged at info level
  std::span<const ProviderSetting> settings;
  // Reads limits from the device named by the libfabric domain; nullopt where unknown.
  std::optional<DeviceLimits> (*device_limits)(std::string_view domain_name) = nullptr;
  // Completions failed with one of these are peer errors (Status::kPeerError).
  std::span<const PeerGoneError> peer_gone_errors = {};
  // Non-empty: why loom never injects on this provider (its inject_size is taken as 0).
  std::string_view no_inject = {};
  // Removes what a process of this provider that ended without closing its endpoints (killed)
  // left on the host for later processes to trip over; how many objects it removed.
  std::size_t (*remove_leftovers)(int pid) = nullptr;
  // Removes what an earlier process with this process's own pid left that would stop this one
  // opening endpoints; how many objects it removed. Never touches what a live process holds.
  std::size_t (*remove_own_stale)() = nullptr;
  // Whether control messages should ride inside data messages going the other way
  // (mux/carried_control.hpp; LOOM_CARRY_CONTROL=1). Off where a message of its own costs less
  // than the carrier's bookkeeping, which lies on the round trip's path while a message of its
  // own leaves after the data and off it (shm: a copy into shared memory, no system call).
  bool carry_control = true;
  // Whether a write that fits the inject size goes by fi_inject_writedata (no send completion).
  // Off where the provider copies an inject into a buffer of its own that a write from the
  // registered buffer would not need: rxm above its core provider's inject size (128 bytes on
  // tcp), where it costs a copy per write; on shm both copy into the peer's region alike, and
  // the inject spares a CQ write under its lock.
  bool inject_writes = true;
  // Eager buffers a receiving communicator posts when LOOM_EAGER_CREDITS is auto (its memory:
  // this many times LOOM_EAGER_MAX). A message sent on a credit needs no clear-to-send first;
  // without one it waits for its buffer's and is written.
  unsigned eager_credits = 16;
  // Eager buffers one message sent ahead may fill when LOOM_EAGER_FRAGMENTS is auto: a message up
  // to this many eager sizes goes as that many eager messages, one credit each, and needs no
  // clear-to-send. Above 1 where the eager size is small against what a write costs.
  unsigned eager_fragments = 1;
  // Non-zero where a send or write longer than this completes only once the peer took it and
  // the provider completes an endpoint's operations in the order they were posted (shm 1.17's
  // response queue): one to a peer that stopped taking them (dead, stopped, slow) would hold up
  // every later completion on the lane, to every peer. loom then keeps eager messages within
  // it and writes a longer stripe in two parts: its body without remote CQ data, which shm
  // copies into the peer's memory itself, in the call, and completes at once where it may
  // (process_vm_writev: same user, ptrace allowed), then, once that completed, its last bytes
  // with the CQ data. Each part is either done when it completes or handled in the order it
  // was posted on the peer's side, so the CQ data arrives after the whole stripe.
  std::size_t peer_paced_above = 0;
  // Whether loom asks for FI_THREAD_COMPLETION with manual data progress (FI_PROGRESS_MANUAL;
  // loom serializes each lane's endpoints and CQs and progresses them itself): rxm then drops
  // its endpoint and CQ locks (ofi/selection.cpp, with_completion_threading).
  bool completion_threading = false;
  // Whether a lane serves one direction only (mux/lane_registry.hpp): its send and receive
  // communicators to one peer then sit on two lanes, two sets of endpoints. Elsewhere they share
  // one, and so the provider's connection between the two processes where it makes one per
  // endpoint pair (rxm: a TCP socket, an RC QP). On shm there is no connection to share, and a
  // lane for both ways read 0.81-0.88x of two lanes' window-64 4 KiB rate (docs/performance.md).
  bool lanes_per_direction = false;
};

// The profile for a provider name as fi_info reports it ("verbs;ofi_rxm" -> verbs). Unknown
// providers (e.g. the epmr test provider) get a generic profile with no defaults.
[[nodiscard]] const Profile& profile_for(std::string_view prov_name) noexcept;

[[nodiscard]] std::span<const Profile* const> all_profiles() noexcept;

// Every family's remove_leftovers for `pid`, once no process `pid` exists: a running process's
// (an unreaped child's too) are never touched. How many objects were removed.
std::size_t remove_leftovers_of(int pid) noexcept;

// Every family's remove_own_stale: what a killed earlier holder of this process's pid left
// (remove_leftovers_of cannot reach it: the pid is ours, alive). How many objects were removed.
std::size_t remove_own_stale_leftovers() noexcept;

// The recommended settings of the provider families that `requested` names (LOOM_PROVIDER,
// else FI_PROVIDER; "verbs;ofi_rxm", "efa,shm", ...), or of every family when it names none:
// libfabric then picks the provider, and the README's main command names none. Each variable
// belongs to one provider, or to rxm, which tcp and verbs want set alike; no two families may
// recommend different values for one variable (test/ofi/profile_test.cpp), and each appears
// once here.
[[nodiscard]] std::vector<ProviderSetting> settings_for(std::string_view requested);

extern const Profile kEfaProfile;
extern const Profile kCxiProfile;
extern const Profile kVerbsProfile;
extern const Profile kTcpProfile;
extern const Profile kShmProfile;
extern const Profile kSocketsProfile;
extern const Profile kUdpProfile;

}  // namespace loom::providers
