// N:m grouping: the communicators whose rails sit on the same NICs share m lanes, whatever their
// peers, and in both directions unless the provider keeps lanes per direction (shm; providers/
// profile.hpp). A communicator's group is its ordinal to its peer (in its direction) mod m, so
// one peer's communicators spread over the m lanes as NCCL's channels do, and a send
// communicator and the receive communicator of the same ordinal share a lane: their endpoints,
// and so the provider's connection between the two processes (tcp: one socket whose messages
// carry the other way's acknowledgements, rather than one each way with acknowledgements of
// their own; verbs: one RC QP). The first one in a group opens the lane, the others take a
// reference. m == 0 turns sharing off (a lane per communicator) for comparison.
//
// Background progress. With manual progress a lane moves only while its process calls in, yet
// its peers rely on it moving while the application does something else: pings must be
// answered (an idle process is not a dead one), a rendezvous write the peer waits for must
// drain out of the socket, a control message to a peer not reached yet must go once the
// provider reaches it. So from the first lane on, a thread of the registry wakes every
// `idle_period` (it sleeps on a condition variable meanwhile, never spins) and progresses each
// lane nobody progressed since its last turn; try_lock keeps it from ever waiting for a lane an
// application thread holds. It also closes the lanes whose last communicator left once nothing
// of theirs is on its way (Lane::quiescent), or `closing_limit` after they were left.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "mux/lane.hpp"

namespace loom::ofi {
class Nic;
}

namespace loom::mux {

struct RailSummary {
  std::string nic;
  bool data;
  std::uint64_t bytes_sent;
  std::uint64_t bytes_written;
  std::uint64_t bytes_read;
};

struct LaneSummary {
  std::uint64_t id;
  std::size_t peers;  // in the lane's AVs
  // Communicators holding the lane (attached or draining), by Direction.
  std::size_t comms[2];
  std::size_t retired;               // closed ones the lane keeps until their operations drain
  std::uint64_t carried_control;     // control messages that came through its inbox
  std::size_t eager_buffers;         // its eager pool's
  std::size_t eager_buffers_posted;  // of them, posted now
  std::size_t endpoints;             // rails
  ofi::RegistrationTableStats registration_table;
  std::size_t shared_regions;               // the context's regions registered on this lane
  std::size_t shared_region_registrations;  // their fid_mr objects
  std::size_t shared_region_bytes;
  std::vector<RailSummary> rails;
};

struct RegistryStats {
  std::vector<LaneSummary> lanes;
  std::map<std::string, std::size_t> endpoints_per_nic;  // by domain name
  std::uint64_t lanes_opened = 0;                        // since the registry was made
  std::size_t closing = 0;                               // left, not closed yet
};

// Who runs the registry's turn (progress for the lanes nobody polled in an idle period, and for
// the lanes left closing). kThread: a thread of its own, so a peer's pings are answered while
// the application calls nothing. kCallers: the communicators' waiting polls (run_due_turn), and
// no thread: a process with a second thread pays for it in every system call on a file
// descriptor (the kernel counts references to the file once its table is shared; ~50 ns a
// read, ~70 ns a poll of two sockets on the AMD VM), 2-4% of tcp's one-way trip at 8 B.
enum class TurnRunner { kThread, kCallers };

class LaneRegistry {
 public:
  LaneRegistry(std::vector<ofi::Nic*> nics, LaneShape shape, unsigned ngroups,
               std::chrono::milliseconds idle_period, std::chrono::milliseconds closing_limit,
               TurnRunner runner);
  // Closes the lanes still closing, each within its closing limit, then stops the thread.
  ~LaneRegistry();
  LaneRegistry(const LaneRegistry&) = delete;
  LaneRegistry& operator=(const LaneRegistry&) = delete;

  // Rails on every NIC in turn: what a lane uses when nothing ties it to particular NICs.
  [[nodiscard]] ofi::RailPlacement default_placement() const;
  // The lane a new communicator to `peer` (its context id) in `direction` joins: the one of its
  // group whose rails are where `placement` puts them, opened if there is none. Throws
  // loom::Error if a lane cannot open.
  Lane& join(std::uint64_t peer, Direction direction, const ofi::RailPlacement& placement);
  // A communicator to `peer` in `direction` is gone from `lane` for good; the last one out
  // closes it, at once when it is quiescent, else in the background (see above).
  void leave(Lane& lane, std::uint64_t peer, Direction direction);

  // The context deregistered its region {slot, generation}: every lane, closing ones included,
  // lets go of its registration (at once, or with the last request part that uses it). First
  // the one-sided targets on lanes that hold it tell their initiators, and this waits (up to
  // `revoke_timeout`, progressing those lanes) until each answered that it will write no more
  // into it: only then do the keys close, so that no provider has to check them.
  void drop_shared_region(std::uint32_t slot, std::uint32_t generation,
                          std::chrono::milliseconds revoke_timeout);

  // With TurnRunner::kCallers, runs the registry's turn if an idle period has passed since
  // the last one and no other thread holds the registry; nothing with kThread.
  void run_due_turn();

  // Progresses one lane other than `busy`, round robin, if neither the registry nor that lane
  // is held by another thread. With manual progress a peer's request can depend on any of our
  // lanes (the lane of another group must run for our peer's send to finish while we wait on
  // our own send), so every test() also gives the other lanes a turn; try_lock keeps threads that
  // drive their own lanes from ever waiting on each other.
  void progress_another(const Lane& busy);

  // Whether some lane holds deferred work (batched control messages, posts held back) for its
  // next progress. A communicator that waits on one lane runs the others'
  // (run_deferred_elsewhere): the clear-to-send of receives just posted must not wait until
  // the application tests one of them, while it waits on a send of another lane (a receiver
  // that posts the next window, then acks).
  [[nodiscard]] bool any_deferred() const noexcept {
    return deferred_lanes_.load(std::memory_order_relaxed) != 0;
  }
  // Whether a lane other than `busy` holds deferred work: what run_deferred_elsewhere would
  // find. A sender's own lane often holds some (an ask for clearance armed, a batch waiting for
  // the lane's progress) while its inject needs no progress: any_deferred alone sent most
  // posts through the registry's lock and lane list for nothing.
  [[nodiscard]] bool deferred_elsewhere(const Lane& busy) const noexcept {
    return deferred_lanes_.load(std::memory_order_relaxed) > (busy.has_deferred() ? 1u : 0u);
  }
  // Runs the deferred work of the lanes other than `busy` that no other thread holds.
  void run_deferred_elsewhere(const Lane& busy);

  // Carried control (carried_control.hpp). A receiving communicator offers the control
  // messages it owes its peer context to the sends towards that context (add_control_source,
  // under its lane's lock, until remove_control_source); a sending communicator, under its own
  // lane's lock (`held`), takes one of them to ride on the message it is about to inject: the
  // bytes written to `out`, 0 when none is due or the lanes involved are busy (try_lock: two
  // lanes' locks are never waited for together; a source on `held` itself needs none). The
  // receiving side posts what it strips from a carrier to the lane named in its trailer; a lane
  // that is gone drops it.
  void add_control_source(std::uint64_t peer, Lane& lane, CommId comm);
  void remove_control_source(std::uint64_t peer, const Lane& lane, CommId comm);
  std::size_t take_carried_control(const Lane& held, std::uint64_t peer, std::span<std::byte> out,
                                   std::uint64_t& target_lane);
  void post_carried(std::uint64_t lane, std::span<const std::byte> message);

  [[nodiscard]] RegistryStats stats() const;
  [[nodiscard]] unsigned ngroups() const noexcept { return ngroups_; }
  [[nodiscard]] const LaneShape& shape() const noexcept { return shape_; }

 private:
  struct Entry {
    std::unique_ptr<Lane> lane;
    std::size_t references[2] = {0, 0};  // communicators holding it, by Direction
  };
  // A peer's communicators so far in each direction (their groups), and those open now: the
  // entry goes with the peer's last communicator.
  struct PeerComms {
    std::uint64_t ordinals[2] = {0, 0};  // by Direction
    std::size_t open = 0;
    std::uint64_t first_group = 0;  // where this peer's communicators start (LOOM_NGROUPS > 1)
  };
  struct Closing {
    std::unique_ptr<Lane> lane;
    std::chrono::steady_clock::time_point deadline;
  };

  // The background thread's loop, and one turn of it (under mutex_); lanes done closing are
  // moved to `finished`, to be destroyed outside the lock.
  void run_background();
  void background_turn(std::vector<std::unique_ptr<Lane>>& finished);
  // Destroys the lanes a turn finished closing, with `lock` (on mutex_) released meanwhile.
  void close_finished(std::unique_lock<std::mutex>& lock,
                      std::vector<std::unique_ptr<Lane>>& finished);
  // How long until the next turn: sooner while lanes are closing.
  [[nodiscard]] std::chrono::milliseconds turn_period() const noexcept;

  std::vector<ofi::Nic*> nics_;
  LaneShape shape_;
  unsigned ngroups_;
  mutable std::mutex mutex_;
  std::atomic<std::size_t> deferred_lanes_{0};  // lanes with deferred work; outlives them
  std::map<LaneKey, Entry> lanes_;
  std::vector<Lane*> order_;  // lanes for progress_another, in opening order
  std::size_t cursor_ = 0;
  std::map<std::uint64_t, PeerComms> peers_;  // by peer context id
  std::uint64_t next_private_group_ = 0;      // ngroups 0: a group per communicator
  std::uint64_t next_first_group_ = 0;        // the next new peer's first group
  std::uint64_t next_lane_id_ = 1;
  std::uint64_t lanes_opened_ = 0;
  std::vector<Closing> closing_;
  std::size_t finishing_ = 0;  // taken off closing_, their endpoints closing outside mutex_
  std::chrono::milliseconds idle_period_;
  std::chrono::milliseconds closing_limit_;
  std::condition_variable wake_;  // leave() of a lane that must close in the background, or stop
  bool stopping_ = false;
  const TurnRunner runner_;
  std::thread background_;                           // kThread: started by the first lane
  std::chrono::steady_clock::time_point next_turn_;  // kCallers

  // Carried control: taken under a lane's lock; never held while waiting for a lane's lock.
  struct ControlSource {
    std::uint64_t peer;  // context id
    Lane* lane;
    CommId comm;
  };
  util::SpinLock carriers_mutex_;
  std::vector<Lane*> by_id_;            // every open lane
  std::vector<ControlSource> sources_;  // sorted by peer
};

}  // namespace loom::mux
