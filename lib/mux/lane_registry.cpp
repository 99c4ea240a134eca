#include "mux/lane_registry.hpp"

#include <algorithm>
#include <thread>

#include "ofi/nic.hpp"
#include "util/log.hpp"

namespace loom::mux {
namespace {

// How often a lane left to close is progressed in the background.
constexpr auto kClosingTurn = std::chrono::milliseconds(1);

}  // namespace

LaneRegistry::LaneRegistry(std::vector<ofi::Nic*> nics, LaneShape shape, unsigned ngroups,
                           std::chrono::milliseconds idle_period,
                           std::chrono::milliseconds closing_limit, TurnRunner runner)
    : nics_(std::move(nics)),
      shape_(shape),
      ngroups_(ngroups),
      idle_period_(std::max(idle_period, std::chrono::milliseconds(1))),
      closing_limit_(closing_limit),
      runner_(runner),
      next_turn_(std::chrono::steady_clock::now() + idle_period_) {}

// Lanes still open here belong to communicators that outlive their context's registry, which
// the API does not allow (a communicator holds its context); only closing ones are left.
LaneRegistry::~LaneRegistry() {
  std::unique_lock lock(mutex_);
  stopping_ = true;
  lock.unlock();
  wake_.notify_all();
  if (background_.joinable()) background_.join();
  lock.lock();
  while (!closing_.empty()) {
    std::vector<std::unique_ptr<Lane>> finished;
    background_turn(finished);
    close_finished(lock, finished);
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    lock.lock();
  }
}

ofi::RailPlacement LaneRegistry::default_placement() const {
  return ofi::RailPlacement::round_robin(nics_, shape_.data_rails, shape_.control_rails);
}

Lane& LaneRegistry::join(std::uint64_t peer, Direction direction,
                         const ofi::RailPlacement& placement) {
  std::lock_guard lock(mutex_);
  const auto [found, new_peer] = peers_.try_emplace(peer);
  PeerComms& comms = found->second;
  // Peers start at successive groups, so that with as many groups as peers each peer has lanes
  // of its own: on shm every peer writing into a lane takes that lane's one queue lock.
  if (new_peer && ngroups_ != 0) comms.first_group = next_first_group_++ % ngroups_;
  const std::uint64_t ordinal = comms.ordinals[static_cast<std::size_t>(direction)];
  // Without grouping every communicator gets a group, and so a lane, of its own. Those numbers
  // lie above any group index (ngroups <= 256).
  const std::uint64_t group = ngroups_ == 0 ? (std::uint64_t{1} << 63) + next_private_group_++
                                            : (comms.first_group + ordinal) % ngroups_;
  const bool one_way = placement.data.front()->attributes().lanes_per_direction;
  LaneKey key{placement.data, placement.control, one_way ? std::optional(direction) : std::nullopt,
              group};
  auto [it, opened] = lanes_.try_emplace(std::move(key));
  Entry& entry = it->second;
  if (opened) {
    try {
      entry.lane =
          std::make_unique<Lane>(placement, shape_, it->first, next_lane_id_++, deferred_lanes_);
    } catch (...) {
      lanes_.erase(it);
      if (comms.open == 0) peers_.erase(peer);
      throw;
    }
    ++lanes_opened_;
    order_.push_back(entry.lane.get());
    if (runner_ == TurnRunner::kThread && !background_.joinable()) {
      background_ = std::thread([this] { run_background(); });
    }
    std::lock_guard carriers(carriers_mutex_);
    by_id_.push_back(entry.lane.get());
  }
  ++comms.ordinals[static_cast<std::size_t>(direction)];
  ++comms.open;
  ++entry.references[static_cast<std::size_t>(direction)];
  return *entry.lane;
}

void LaneRegistry::leave(Lane& lane, std::uint64_t peer, Direction direction) {
  std::unique_ptr<Lane> closing;
  {
    std::lock_guard lock(mutex_);
    if (auto p = peers_.find(peer); p != peers_.end() && --p->second.open == 0) peers_.erase(p);
    auto it = lanes_.find(lane.key());
    if (it == lanes_.end() || it->second.lane.get() != &lane) {
      util::log().error("lane registry: leave() for a lane it does not hold ({})", lane.id());
      return;
    }
    auto& references = it->second.references;
    --references[static_cast<std::size_t>(direction)];
    if (references[0] + references[1] != 0) return;
    closing = std::move(it->second.lane);
    lanes_.erase(it);
    std::erase(order_, closing.get());
    {
      std::lock_guard carriers(carriers_mutex_);
      std::erase(by_id_, closing.get());
    }
    std::lock_guard lane_lock(closing->lock());
    if (!closing->quiescent()) {
      util::log().debug("lane {} closes once its last messages are out", closing->id());
      closing_.push_back(
          Closing{std::move(closing), std::chrono::steady_clock::now() + closing_limit_});
    }
  }
  if (!closing) wake_.notify_all();
  // Closed outside the registry lock: closing endpoints can take a while.
}

void LaneRegistry::run_background() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    // A lane left to close is looked at again soon: its peer may be waiting for its last message.
    wake_.wait_for(lock, turn_period());
    if (stopping_) break;
    std::vector<std::unique_ptr<Lane>> finished;
    background_turn(finished);
    close_finished(lock, finished);
  }
}

void LaneRegistry::close_finished(std::unique_lock<std::mutex>& lock,
                                  std::vector<std::unique_ptr<Lane>>& finished) {
  if (finished.empty()) return;
  const std::size_t count = finished.size();
  finishing_ += count;
  lock.unlock();
  finished.clear();  // endpoints close outside the registry lock
  lock.lock();
  finishing_ -= count;
}

std::chrono::milliseconds LaneRegistry::turn_period() const noexcept {
  return closing_.empty() ? idle_period_ : std::min(idle_period_, kClosingTurn);
}

void LaneRegistry::run_due_turn() {
  if (runner_ != TurnRunner::kCallers) return;
  std::unique_lock registry(mutex_, std::try_to_lock);
  if (!registry.owns_lock()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_turn_) return;
  std::vector<std::unique_ptr<Lane>> finished;
  background_turn(finished);
  next_turn_ = now + turn_period();
  close_finished(registry, finished);
}

void LaneRegistry::background_turn(std::vector<std::unique_ptr<Lane>>& finished) {
  for (Lane* lane : order_) {
    if (lane->take_progressed()) continue;
    std::unique_lock lane_lock(lane->lock(), std::try_to_lock);
    if (!lane_lock.owns_lock()) continue;
    lane->progress();
    // The turn's own progress does not count as the application's: else an idle lane would
    // have a turn only every second idle period.
    (void)lane->take_progressed();
  }
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(closing_, [&](Closing& closing) {
    Lane& lane = *closing.lane;
    std::unique_lock lane_lock(lane.lock(), std::try_to_lock);
    if (!lane_lock.owns_lock()) return false;
    lane.progress();
    if (!lane.quiescent() && now < closing.deadline) return false;
    lane_lock.unlock();
    finished.push_back(std::move(closing.lane));
    return true;
  });
}

void LaneRegistry::progress_another(const Lane& busy) {
  std::unique_lock registry(mutex_, std::try_to_lock);
  if (!registry.owns_lock() || order_.size() < 2) return;
  cursor_ = (cursor_ + 1) % order_.size();
  Lane* lane = order_[cursor_];
  if (lane == &busy) {
    cursor_ = (cursor_ + 1) % order_.size();
    lane = order_[cursor_];
  }
  // The registry lock is held throughout: leave() cannot destroy the lane meanwhile.
  std::unique_lock lane_lock(lane->lock(), std::try_to_lock);
  if (lane_lock.owns_lock()) lane->progress();
}

void LaneRegistry::run_deferred_elsewhere(const Lane& busy) {
  std::unique_lock registry(mutex_, std::try_to_lock);
  if (!registry.owns_lock()) return;
  for (Lane* lane : order_) {
    if (lane == &busy || !lane->has_deferred()) continue;
    std::unique_lock lane_lock(lane->lock(), std::try_to_lock);
    if (lane_lock.owns_lock()) lane->run_deferred();
  }
}

namespace {

struct ByPeer {
  template <typename Source>
  bool operator()(const Source& s, std::uint64_t peer) const noexcept {
    return s.peer < peer;
  }
  template <typename Source>
  bool operator()(std::uint64_t peer, const Source& s) const noexcept {
    return peer < s.peer;
  }
};

}  // namespace

// Sorted by peer: a send looks up its peer's sources among every peer's.
void LaneRegistry::add_control_source(std::uint64_t peer, Lane& lane, CommId comm) {
  std::lock_guard lock(carriers_mutex_);
  const auto at = std::upper_bound(sources_.begin(), sources_.end(), peer, ByPeer{});
  sources_.insert(at, {peer, &lane, comm});
}

void LaneRegistry::remove_control_source(std::uint64_t peer, const Lane& lane, CommId comm) {
  std::lock_guard lock(carriers_mutex_);
  std::erase_if(sources_, [&](const ControlSource& s) {
    return s.peer == peer && s.lane == &lane && s.comm == comm;
  });
}

std::size_t LaneRegistry::take_carried_control(const Lane& held, std::uint64_t peer,
                                               std::span<std::byte> out,
                                               std::uint64_t& target_lane) {
  // A communicator that owes a control message has deferred it to its lane's next progress
  // (p2p: announce, promise_credits, a batch pushed back): with no lane's work deferred, none
  // is owed, and the search below would cost every message a lock and a lookup for nothing. A
  // deferral this read misses leaves at its lane's progress, as an uncarried one does.
  if (!any_deferred()) return 0;
  std::unique_lock lock(carriers_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return 0;
  const auto [first, last] = std::equal_range(sources_.begin(), sources_.end(), peer, ByPeer{});
  for (auto it = first; it != last; ++it) {
    const ControlSource& source = *it;
    std::unique_lock<util::SpinLock> lane_lock;
    if (source.lane != &held) {
      lane_lock = std::unique_lock(source.lane->lock(), std::try_to_lock);
      if (!lane_lock.owns_lock()) continue;
    }
    if (const std::size_t n = source.lane->take_carried_control(source.comm, out, target_lane))
      return n;
  }
  return 0;
}

void LaneRegistry::post_carried(std::uint64_t lane, std::span<const std::byte> message) {
  std::lock_guard lock(carriers_mutex_);
  for (Lane* open : by_id_) {
    if (open->id() == lane) {
      open->post_to_inbox(message);
      return;
    }
  }
}

void LaneRegistry::drop_shared_region(std::uint32_t slot, std::uint32_t generation,
                                      std::chrono::milliseconds revoke_timeout) {
  std::lock_guard lock(mutex_);
  std::vector<Lane*> lanes;
  for (auto& [key, entry] : lanes_) lanes.push_back(entry.lane.get());
  for (Closing& closing : closing_) lanes.push_back(closing.lane.get());
  std::vector<Lane*> revoking;
  for (Lane* lane : lanes) {
    std::lock_guard lane_lock(lane->lock());
    if (lane->shared_regions().find(slot, generation) == SharedRegions::kNone) continue;
    if (lane->revoke_region(slot, generation)) revoking.push_back(lane);
  }
  // Every lane makes progress while we wait, not only the revoking ones: the background thread
  // cannot (it needs mutex_), and the peer may be deregistering a region we write into at this
  // moment, waiting in turn for our initiator's answer.
  const auto deadline = std::chrono::steady_clock::now() + revoke_timeout;
  while (!revoking.empty() && std::chrono::steady_clock::now() < deadline) {
    for (Lane* lane : lanes) {
      std::lock_guard lane_lock(lane->lock());
      lane->progress();
    }
    std::erase_if(revoking, [](Lane* lane) {
      std::lock_guard lane_lock(lane->lock());
      return !lane->revoking();
    });
    std::this_thread::yield();
  }
  if (!revoking.empty()) {
    util::log().warn(
        "region {}: {} lane(s) still wait for initiators to confirm its revocation "
        "after {} ms; its keys close now",
        slot, revoking.size(), revoke_timeout.count());
  }
  for (Lane* lane : lanes) {
    std::lock_guard lane_lock(lane->lock());
    lane->shared_regions().drop(slot, generation);
  }
}

RegistryStats LaneRegistry::stats() const {
  std::lock_guard lock(mutex_);
  RegistryStats stats;
  stats.lanes_opened = lanes_opened_;
  stats.closing = closing_.size() + finishing_;
  for (const auto& [key, entry] : lanes_) {
    Lane& lane = *entry.lane;
    std::lock_guard lane_lock(lane.lock());
    const LaneStats lane_stats = lane.stats();
    LaneSummary summary{.id = lane.id(),
                        .peers = lane.peers(),
                        .comms = {entry.references[0], entry.references[1]},
                        .retired = lane_stats.retired,
                        .carried_control = lane_stats.carried_control,
                        .eager_buffers = lane_stats.eager_buffers,
                        .eager_buffers_posted = lane_stats.eager_buffers_posted,
                        .endpoints = lane.rails().rails().size(),
                        .registration_table = lane.rails().registration_table().stats(),
                        .shared_regions = lane.shared_regions().held(),
                        .shared_region_registrations = lane.shared_regions().registrations(),
                        .shared_region_bytes = lane.shared_regions().bytes(),
                        .rails = {}};
    for (ofi::Rail* rail : lane.rails().rails()) {
      ++stats.endpoints_per_nic[rail->nic().attributes().domain];
      const ofi::RailStats& r = rail->stats();
      summary.rails.push_back(RailSummary{.nic = rail->nic().attributes().domain,
                                          .data = rail->role() == ofi::RailRole::kData,
                                          .bytes_sent = r.bytes_sent,
                                          .bytes_written = r.bytes_written,
                                          .bytes_read = r.bytes_read});
    }
    stats.lanes.push_back(std::move(summary));
  }
  return stats;
}

}  // namespace loom::mux
