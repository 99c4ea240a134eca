// A lane: one rail set (data + control endpoints with their CQs, AVs and posted control
// buffers) shared by the communicators (of both directions, but on shm) whose rails sit on the
// same NICs, whatever their peers: libfabric's RDM endpoints reach any peer through the AV, so a
// process's endpoints do not grow with its peers. Each peer is in the lane's AVs once, for as
// long as a communicator to it lives. Completions reach the right communicator by context (own
// operations), by the comm id in remote CQ data (RMA writes) or in the control header (control
// messages); comm ids are the lane's, unique across its peers and directions. A comm id carries a
// generation (see attach()): traffic for a closed communicator is dropped even once its slot serves
// another.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "mux/control_channel.hpp"
#include "mux/eager_pool.hpp"
#include "mux/routing.hpp"
#include "mux/shared_regions.hpp"
#include "ofi/rail_set.hpp"
#include "util/spin_lock.hpp"

namespace loom::ofi {
class Nic;
}

namespace loom::mux {

enum class Direction : std::uint8_t { kSend, kRecv };

// Where a lane's rails are, which group it is and, where its provider keeps lanes per direction
// (providers/profile.hpp), which direction: the communicators with equal keys share it.
struct LaneKey {
  std::vector<ofi::Nic*> data;  // the NIC of each data rail
  std::vector<ofi::Nic*> control;
  std::optional<Direction> direction;  // nullopt: the lane serves both
  // The group index (LaneRegistry), or a number of its own when grouping is off.
  std::uint64_t group = 0;
  auto operator<=>(const LaneKey&) const = default;
};

struct LaneShape {
  std::size_t data_rails = 1;  // placed by the caller (see LaneRegistry::join_send)
  std::size_t control_rails = 1;
  ofi::RailDepths depths;
  std::size_t mr_cache_entries = 1024;
  // How long a closed communicator's unspent eager credits stay promised (EagerPool).
  std::chrono::milliseconds promise_timeout{10000};
};

// A communicator as its lane sees it.
class CommPort {
 public:
  virtual ~CommPort() = default;
  virtual void on_control(const ControlHeader& header, std::span<const std::byte> body) = 0;
  virtual void on_remote_write(WriteImmediate immediate) = 0;
  // A message landed in the lane's eager pool for this communicator (receive lanes).
  virtual void on_eager(const EagerArrival& /*arrival*/) {}
  // Called from Lane::progress after Lane::defer(): the work the communicator deferred (its
  // control batch, posts back-pressure held back).
  virtual void on_deferred() = 0;
  // A control message this communicator has batched, taken as if sent, to ride on a data
  // message another lane's communicator sends to the same peer context (carried_control.hpp):
  // the bytes written to `out` (header + body; 0 when nothing is due or it does not fit), and
  // the peer's lane it is for.
  virtual std::size_t take_carried_control(std::span<std::byte> /*out*/,
                                           std::uint64_t& /*target_lane*/) {
    return 0;
  }
  // Closed and retired (Lane::retire): whether the provider handed back all its operations.
  [[nodiscard]] virtual bool drained() const noexcept = 0;
  // Retired with operations out towards a peer that is lost (dead or unreachable): they may
  // never come back (shm keeps them for a peer that never takes them), so they do not keep the
  // lane's endpoints open; closing the endpoints ends them.
  [[nodiscard]] virtual bool abandoned() const noexcept = 0;
  // Retired, and its lane closing: its registrations (held for the operations still out) go
  // with the lane's registration cache, not one by one.
  virtual void abandon_registrations() noexcept = 0;
  // The context is deregistering its region {slot, generation}, which this lane holds: a
  // one-sided target tells its initiator, which may hold the region's keys. True when the
  // communicator then waits for the answer (revoking()).
  virtual bool revoke_region(std::uint32_t /*slot*/, std::uint32_t /*generation*/) { return false; }
  // Whether an answer to revoke_region is still awaited from a peer that can give it (a peer
  // silent for LOOM_PEER_TIMEOUT_MS meanwhile is taken as lost, as a wait on it would).
  [[nodiscard]] virtual bool revoking() { return false; }

 private:
  friend class Lane;
  // on_deferred() is due at the lane's next progress: a port is in its deferred list once
  // however many ask (Lane::defer), so a run whose on_deferred() defers again cannot repeat it.
  bool deferred_ = false;
};

struct LaneStats {
  std::size_t comms = 0;                  // attached now
  std::size_t retired = 0;                // closed, waiting for their operations to drain
  std::uint64_t stray_control = 0;        // control messages for a comm id not attached
  std::uint64_t stray_remote_writes = 0;  // remote CQ data for a comm id not attached
  std::uint64_t stray_eager = 0;          // eager messages for a comm id not attached
  std::uint64_t carried_control = 0;      // control messages that came through the inbox
  std::size_t eager_buffers = 0;          // the eager pool's (receive lanes that have one)
  std::size_t eager_buffers_posted = 0;   // of them, posted to the provider now
};

class Lane final : ofi::RemoteWriteHandler, ControlSink, EagerArrivalSink {
 public:
  // Opens the rails where `placement` puts them; depths and cache size from `shape`.
  // `deferred_lanes` counts the lanes with deferred work (see LaneRegistry::any_deferred);
  // it must outlive the lane.
  Lane(const ofi::RailPlacement& placement, const LaneShape& shape, LaneKey key, std::uint64_t id,
       std::atomic<std::size_t>& deferred_lanes);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  [[nodiscard]] const LaneKey& key() const noexcept { return key_; }
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  [[nodiscard]] ofi::RailSet& rails() noexcept { return *rails_; }
  [[nodiscard]] ControlChannel& control() noexcept { return *control_; }
  // Asks every attached communicator to revoke region {slot, generation} (CommPort::
  // revoke_region); true when some wait for answers, until revoking() turns false.
  bool revoke_region(std::uint32_t slot, std::uint32_t generation);
  [[nodiscard]] bool revoking();
  // The context's regions as this lane holds them (mux/shared_regions.hpp).
  [[nodiscard]] SharedRegions& shared_regions() noexcept { return *shared_regions_; }
  // Held by a communicator for every call it makes; completions are dispatched under it.
  [[nodiscard]] util::SpinLock& lock() noexcept { return mutex_; }

  // Gives `port` a comm id unique on this lane. Ids are drawn from a counter over all 2^16
  // values, skipping those whose slot (the id's low bits) is taken: the bits above the slot are
  // a generation, so an id comes back only after the counter went round once more, 2^16 / slots
  // reuses of its slot later (4096 while the lane has at most 16 slots). Throws loom::Error
  // when all ids are taken.
  CommId attach(CommPort& port);
  // Frees the id: nothing is routed to it any more.
  void detach(CommId id) noexcept;
  // Keeps a closed communicator whose operations may still complete: it is destroyed once
  // drained() (looked at after each progress), or after the lane's endpoints are closed, so no
  // completion can touch freed memory.
  void retire(std::unique_ptr<CommPort> port);
  // Asks for port.on_deferred() at the next progress, once however often it is asked until then.
  void defer(CommPort& port, CommId id) {
    if (port.deferred_) return;
    port.deferred_ = true;
    if (deferred_ids_.empty()) {
      has_deferred_.store(true, std::memory_order_relaxed);
      deferred_lanes_->fetch_add(1, std::memory_order_relaxed);
    }
    deferred_ids_.push_back(id);
  }
  // Whether work is deferred; readable without the lane's mutex (a hint, not a promise).
  [[nodiscard]] bool has_deferred() const noexcept {
    return has_deferred_.load(std::memory_order_relaxed);
  }

  // The peer's address on rail `rail`, inserted into that rail's AV by its first user; each
  // call takes a reference that release_peer() gives back.
  ofi::Address acquire_peer(std::size_t rail, std::span<const std::byte> name);
  // Gives back the references acquire_peer() gave for a peer's addresses on the data rails and
  // the control rails, in rail order. The last reference gone, the peer leaves the AV once no
  // control message to it is in flight (at a later progress, if one is).
  void release_peer(std::span<const ofi::Address> data,
                    std::span<const ofi::Address> control) noexcept;
  // Peers in the AVs (of any rail).
  [[nodiscard]] std::size_t peers() const noexcept;

  // Nothing of the lane's is still on its way: no control message in flight or queued, no
  // retired communicator with operations out (other than abandoned ones). A lane whose last
  // communicator left closes once it is (LaneRegistry).
  [[nodiscard]] bool quiescent() const noexcept;
  // Whether progress() ran since the last call (LaneRegistry's background progress skips lanes
  // their communicators keep progressing). Readable without the lane's mutex.
  [[nodiscard]] bool take_progressed() noexcept {
    return progressed_.exchange(false, std::memory_order_relaxed);
  }

  // Runs the deferred work, then polls the completion queues. This is when a control message
  // batched by a communicator (clear-to-send, ready-to-send) leaves the host: at the next
  // progress of its lane, i.e. the next isend/irecv/test on any communicator of the lane, or
  // of another lane of the context (Comm::kick_other_lanes), or when its batch fills.
  // `awaiting`: see ofi::RailSet::progress.
  std::size_t progress(ofi::RailSet::Awaiting awaiting = ofi::RailSet::Awaiting::kAnything);
  // Only the deferred work.
  void run_deferred();

  // Control messages that rode on another lane's data messages (carried_control.hpp), posted
  // here by LaneRegistry::post_carried from any thread: the inbox is a leaf lock of its own.
  void post_to_inbox(std::span<const std::byte> message);
  // Dispatches what the inbox holds (under the lane's mutex), like messages from the control
  // rails. progress() does it first; a send does it before it looks for its clearance.
  void drain_inbox() {
    if (inbox_pending_.load(std::memory_order_acquire)) [[unlikely]]
      dispatch_inbox();
  }
  // See CommPort::take_carried_control (under the lane's mutex).
  std::size_t take_carried_control(CommId id, std::span<std::byte> out,
                                   std::uint64_t& target_lane) {
    CommPort* port = port_of(id);
    return port != nullptr ? port->take_carried_control(out, target_lane) : 0;
  }

  [[nodiscard]] LaneStats stats() const noexcept;

  // Where a communicator builds a message carrying control (p2p eager.cpp), under the lane's
  // mutex: the inject that sends it copies it, so one buffer serves the lane's communicators
  // rather than one per peer.
  [[nodiscard]] std::vector<std::byte>& carrier_buffer() noexcept { return carrier_buffer_; }

  // The lane's eager buffers, opened by its first receiving communicator that grants credits: up
  // to `wanted` of `buffer_size` bytes (the same for every communicator of the lane), leaving a
  // quarter of data rail 0's receive queue free of them (see the README's Protocols section).
  // Throws loom::Error.
  EagerPool& eager_pool(std::size_t buffer_size, std::size_t wanted);
  // Communicators attached now.
  [[nodiscard]] std::size_t attached() const noexcept { return attached_; }
  // The eager pool could not promise communicator `id` all the credits it wanted: its
  // on_deferred() runs when buffers come back.
  void wait_for_credits(CommId id);

 private:
  void on_remote_write(std::uint64_t data) override;
  void on_control(const ControlHeader& header, std::span<const std::byte> body) override;
  bool on_eager_arrival(const EagerArrival& arrival) override;
  // Eager buffers came back: each communicator that waited for credits tries again at its next
  // deferred run (its batch promises).
  void wake_credit_waiters();
  // The communicator `id` names, or nullptr when none is attached under that id (generation
  // included).
  [[nodiscard]] CommPort* port_of(CommId id) const noexcept {
    const Slot& slot = slots_[id & (slots_.size() - 1)];
    return slot.id == id ? slot.port : nullptr;
  }
  void dispatch_inbox();
  void free_drained();
  void remove_released_peers() noexcept;

  LaneKey key_;
  std::uint64_t id_;
  // Declaration order is teardown order, reversed: control channel (its registrations), then the
  // rails (endpoints), then communicators retired with operations outstanding.
  std::vector<std::unique_ptr<CommPort>> retired_;
  std::unique_ptr<ofi::RailSet> rails_;
  std::unique_ptr<SharedRegions> shared_regions_;  // registered on rails_, closed before them
  std::unique_ptr<ControlChannel> control_;
  std::unique_ptr<EagerPool> eager_;
  std::vector<CommId> waiting_for_credits_;
  struct Slot {
    CommPort* port = nullptr;
    CommId id = 0;
  };
  std::vector<Slot> slots_;  // indexed by the id's low bits; a power of two, grows by doubling
  std::size_t attached_ = 0;
  CommId next_id_ = 0;  // wraps: the generation counter
  std::vector<CommId> deferred_ids_;
  std::vector<CommId> running_ids_;
  std::atomic<bool> has_deferred_{false};
  std::atomic<bool> progressed_{false};
  std::atomic<std::size_t>* deferred_lanes_;
  struct Peer {
    ofi::Address address;
    std::size_t references = 0;
  };
  std::map<std::pair<std::size_t, std::vector<std::byte>>, Peer> peers_;  // by (rail, name)
  std::vector<std::pair<std::size_t, ofi::Address>> released_;            // to remove from the AVs
  util::SpinLock mutex_;
  util::SpinLock inbox_mutex_;
  std::vector<std::byte> inbox_;  // u16 length + message, repeated
  std::vector<std::byte> draining_;
  std::vector<std::byte> carrier_buffer_;
  std::atomic<bool> inbox_pending_{false};
  LaneStats stats_;
  std::chrono::milliseconds promise_timeout_;
};

}  // namespace loom::mux
