#include "p2p/comm.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "p2p/context_core.hpp"
#include "util/log.hpp"

namespace loom::p2p {
namespace {

// How long close() waits for the provider to hand back operations of the communicator before
// leaving them to the lane (freed when its endpoints close).
constexpr auto kCloseDrain = std::chrono::milliseconds(200);
// Unfinished test() calls between looks at the clock for the peer's liveness.
constexpr unsigned kPollsPerLivenessCheck = 256;
static_assert((kPollsPerLivenessCheck & (kPollsPerLivenessCheck - 1)) == 0);
// wait(): polls that found nothing to do before it yields the CPU on each further one, and
// before it sleeps between them (from kFirstSleep, doubling up to kLongestSleep). The first
// bound keeps a transfer's latency spinning-fast; the second is about a millisecond of nothing.
constexpr unsigned kEmptyPollsBeforeYield = 256;
constexpr unsigned kEmptyPollsBeforeSleep = 4096;
constexpr auto kFirstSleep = std::chrono::microseconds(20);
constexpr auto kLongestSleep = std::chrono::microseconds(1000);
// wait() looks at the clock for its timeout every this many polls.
constexpr unsigned kPollsPerClockRead = 64;
static_assert((kPollsPerClockRead & (kPollsPerClockRead - 1)) == 0);

}  // namespace

void Request::on_completion(ofi::OpContext& op, const ofi::Completion& completion) {
  comm->on_op(*this, op_index(op), completion);
}

Comm::Comm(std::shared_ptr<ContextCore> core, mux::Lane& lane, mux::Direction direction)
    : core_(std::move(core)),
      lanes_(core_->lanes()),
      lane_(&lane),
      direction_(direction),
      // Both directions use it: no eager send, and no eager receive, past what the provider
      // takes in one transfer.
      eager_max_(std::min(core_->config().eager_max, lane.rails().max_msg_size())),
      requests_(this, kMaxRequests) {
  retry_.reserve(kMaxRequests);
  retrying_.reserve(kMaxRequests);
  std::lock_guard lock(lane.mutex());
  id_ = lane.attach(*this);
}

// Comm::close() is the way out. A communicator destroyed without it (a constructor that threw
// after attaching, whose maker leaves the lane; or an owner's bug) still detaches, so the lane
// never routes to freed memory.
//
// A retired communicator is destroyed by its lane, under the lane lock, once drained: the
// registrations its operations used go back to the cache only then.
Comm::~Comm() {
  if (closed_) {
    release_registrations();
    return;
  }
  std::lock_guard lock(lane_->mutex());
  release_registrations();
  lane_->detach(id_);
}

void Comm::release_registrations() {
  for (auto& entry : registrations_) {
    if (entry.registration != nullptr) lane_->rails().mr_cache().release(*entry.registration);
    entry.registration = nullptr;
  }
}

void Comm::abandon_registrations() noexcept {
  for (auto& entry : registrations_) entry.registration = nullptr;
}

bool Comm::drained() const noexcept {
  for (const Request& r : requests_.built())
    if (r.in_use && r.ops_outstanding != 0) return false;
  return true;
}

LaneAddresses Comm::local_addresses() const {
  LaneAddresses addresses{.lane = lane_->id(), .comm = id_, .data = {}, .control = {}};
  auto& rails = lane_->rails();
  for (std::size_t i = 0; i < rails.data_rails(); ++i) {
    auto a = rails.data(i).address();
    addresses.data.emplace_back(a.begin(), a.end());
  }
  for (std::size_t i = 0; i < rails.control_rails(); ++i) {
    auto a = rails.control(i).address();
    addresses.control.emplace_back(a.begin(), a.end());
  }
  return addresses;
}

void Comm::connect_peer(const LaneAddresses& peer) {
  std::lock_guard lock(lane_->mutex());
  auto& rails = lane_->rails();
  data_rails_ = std::min(rails.data_rails(), peer.data.size());
  control_rails_ = std::min(rails.control_rails(), peer.control.size());
  peer_id_ = peer.comm;
  inject_max_ = core_->config().inject_max;
  for (std::size_t i = 0; i < data_rails_; ++i) {
    peer_data_.push_back(lane_->peer_address(i, peer.data[i]));
    inject_max_ = std::min(inject_max_, rails.data(i).nic().attributes().inject_size);
  }
  for (std::size_t i = 0; i < control_rails_; ++i) {
    peer_control_.push_back(lane_->peer_address(rails.data_rails() + i, peer.control[i]));
  }
}

MemoryRegion Comm::register_memory(const void* data, std::size_t size, MemoryType type,
                                   int device) {
  std::lock_guard lock(lane_->mutex());
  if (closed_) throw Error("register memory", core_->provider(), 0, "communicator is closed");
  ofi::MemoryRegistration& registration =
      lane_->rails().mr_cache().acquire(data, size, type, device);
  std::uint32_t slot;
  if (free_registrations_.empty()) {
    slot = static_cast<std::uint32_t>(registrations_.size());
    registrations_.emplace_back();
  } else {
    slot = free_registrations_.back();
    free_registrations_.pop_back();
  }
  Registration& entry = registrations_[slot];
  entry.registration = &registration;
  entry.base = static_cast<const std::byte*>(data);
  entry.size = size;
  // Generations start at 1 and never repeat for a slot: a stale region cannot pass lookup().
  entry.generation = entry.generation + 1;
  MemoryRegion region;
  region.slot_ = slot;
  region.generation_ = entry.generation;
  return region;
}

void Comm::deregister(MemoryRegion region) {
  std::lock_guard lock(lane_->mutex());
  if (region.slot_ >= registrations_.size()) return;
  Registration& entry = registrations_[region.slot_];
  if (entry.registration == nullptr || entry.generation != region.generation_) return;
  lane_->rails().mr_cache().release(*entry.registration);
  entry.registration = nullptr;
  free_registrations_.push_back(region.slot_);
}

const ofi::MemoryRegistration* Comm::lookup(const MemoryRegion& region, const void* data,
                                            std::size_t size) {
  if (region.slot_ >= registrations_.size() ||
      registrations_[region.slot_].registration == nullptr ||
      registrations_[region.slot_].generation != region.generation_) [[unlikely]] {
    reject(Status::kInvalid, "the memory region is not registered on this communicator");
    return nullptr;
  }
  const Registration& entry = registrations_[region.slot_];
  auto p = static_cast<const std::byte*>(data);
  if (p < entry.base || size > entry.size ||
      static_cast<std::size_t>(p - entry.base) > entry.size - size) [[unlikely]] {
    reject(Status::kInvalid, "buffer of " + std::to_string(size) +
                                 " bytes lies outside its registered region of " +
                                 std::to_string(entry.size) + " bytes");
    return nullptr;
  }
  return entry.registration;
}

Status Comm::reject(Status status, std::string text) {
  last_error_ = std::move(text);
  return status;
}

Request* Comm::allocate(RequestKind kind) {
  // The peer's silence counts only while something waits on it.
  const bool idle = requests_.all_free();
  Request* taken = requests_.take();
  if (taken == nullptr) [[unlikely]]
    return nullptr;
  if (idle) {
    last_heard_ = std::chrono::steady_clock::now();
    next_ping_ = last_heard_ + std::chrono::milliseconds(core_->config().peer_timeout_ms / 4);
  }
  Request& r = *taken;
  r.kind = kind;
  r.in_use = true;
  r.released = false;
  r.queued = false;
  r.part_count = 0;
  r.ops_outstanding = 0;
  r.status = Status::kOk;
  r.eager = r.eager_posted = r.local_done = r.rts_sent = r.cts_matched = r.cts_sent = false;
  r.rts_needed = r.rts_queued = r.cts_queued = r.abandoned = false;
  r.stripes = r.stripes_posted = r.stripes_done = 0;
  r.error.clear();
  return &r;
}

void Comm::queue_retry(Request& request) {
  if (!request.queued) {
    request.queued = true;
    retry_.push_back(&request);
  }
  schedule_flush();
}

void Comm::on_retry() {
  retry_scheduled_ = false;
  flush_control();
  retrying_.swap(retry_);
  for (Request* r : retrying_) {
    r->queued = false;
    if (r->in_use) advance(*r);
  }
  retrying_.clear();
}

Status Comm::send_control(MessageType type, std::uint32_t seq, std::span<const std::byte> body,
                          bool confirmed) {
  const std::size_t rail = seq % control_rails_;
  const Status status = lane_->control().send(
      rail, peer_control_[rail], static_cast<std::uint8_t>(type), peer_id_, body, confirmed);
  util::log().trace("comm {} on lane {}: control type {} seq {} to comm {}: {}", id_, lane_->id(),
                    static_cast<int>(type), seq, peer_id_, to_string(status));
  if (status != Status::kOk && status != Status::kRetry) [[unlikely]] {
    last_error_ = "control message to the peer failed: " + lane_->control().rail(rail).last_error();
    util::log().warn("{}", last_error_);
  }
  return status;
}

Status Comm::refuse_batch(const char* what) {
  last_error_ = std::string("internal error: a ") + what + " batch could not be encoded";
  util::log().error("comm {} on lane {}: {}", id_, lane_->id(), last_error_);
  return Status::kError;
}

Status Comm::test(Request* request, bool& done, std::span<std::size_t> sizes) {
  std::size_t handled = 0;
  return poll(request, done, sizes, handled);
}

Status Comm::poll(Request* request, bool& done, std::span<std::size_t> sizes,
                  std::size_t& handled) {
  done = false;
  if (!requests_.owns(request) || !request->in_use || request->released) [[unlikely]] {
    return reject(Status::kInvalid, "test: not a pending request of this communicator");
  }
  std::unique_lock lock(lane_->mutex());
  // An earlier CQ read may already have finished it: only poll (a system call on some
  // providers) for requests still pending.
  handled = 1;
  bool ready = finished(*request);
  if (!ready) {
    handled = lane_->progress();
    ready = finished(*request);
  }
  if (!ready) {
    if ((++liveness_polls_ & (kPollsPerLivenessCheck - 1)) == 0) [[unlikely]]
      check_peer();
    lock.unlock();
    flush_other_lanes();
    // Our lane had nothing to do: now and then give another a turn (see
    // LaneRegistry::progress_another). Not every time: on shm each poll contends for the
    // peer's queue lock.
    if (handled == 0 && (++idle_polls_ & (kIdlePollsPerKick - 1)) == 0) {
      lanes_.progress_another(*lane_);
    }
    return Status::kOk;
  }
  done = true;
  for (std::size_t i = 0; i < sizes.size() && i < request->part_count; ++i) {
    sizes[i] = request->parts[i].delivered;
  }
  const Status status = request->status;
  if (status != Status::kOk) {
    last_error_ = std::move(request->error);
  } else if (request->kind != RequestKind::kFlush) {
    for (std::size_t i = 0; i < request->part_count; ++i) {
      ++stats_.messages;
      stats_.bytes += request->parts[i].delivered;
    }
  }
  if (request->ops_outstanding != 0) {
    request->released = true;  // the provider still holds it: out of the pool for good
    return status;
  }
  request->in_use = false;
  requests_.give_back(*request);
  return status;
}

// A dead peer fails the request through check_peer(), so waiting is testing, bounded by the
// caller's timeout, with the CPU given up while nothing happens.
Status Comm::wait(Request* request, std::span<std::size_t> sizes,
                  std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = timeout == std::chrono::milliseconds::max() ? Clock::time_point::max()
                                                                    : Clock::now() + timeout;
  unsigned empty_polls = 0;
  auto sleep = std::chrono::duration_cast<std::chrono::nanoseconds>(kFirstSleep);
  for (unsigned polls = 1;; ++polls) {
    bool done = false;
    std::size_t handled = 0;
    const Status status = poll(request, done, sizes, handled);
    if (done || status != Status::kOk) return status;
    if ((polls & (kPollsPerClockRead - 1)) == 0 && Clock::now() >= deadline) [[unlikely]] {
      return reject(Status::kInProgress, "wait: the request is still pending after " +
                                             std::to_string(timeout.count()) + " ms");
    }
    if (handled != 0) {
      empty_polls = 0;
      sleep = kFirstSleep;
      continue;
    }
    if (++empty_polls < kEmptyPollsBeforeYield) continue;
    if (empty_polls < kEmptyPollsBeforeSleep) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min<std::chrono::nanoseconds>(sleep * 2, kLongestSleep);
  }
}

void Comm::peer_lost(std::string why, bool warn) {
  if (peer_ == PeerState::kLost) return;
  peer_ = PeerState::kLost;
  peer_gone_ = std::move(why);
  if (warn) util::log().warn("comm {} on lane {}: {}", id_, lane_->id(), peer_gone_);
  fail_all(Status::kPeerError, peer_gone_);
}

void Comm::on_peer_close(std::span<const std::byte> body) {
  if (peer_gone()) return;
  CloseNotice notice;
  if (const char* why = decode_close(body, notice)) [[unlikely]] {
    peer_lost(std::string("the peer closed the communicator with a bad close notice: ") + why);
    return;
  }
  peer_ = PeerState::kClosed;
  peer_gone_ = "the peer closed the communicator";
  close_deadline_ =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(core_->config().peer_timeout_ms);
  util::log().debug("comm {} on lane {}: the peer closed; it finished messages below {}", id_,
                    lane_->id(), notice.complete_below);
  fail_unfinished(notice, peer_gone_);
}

CloseNotice Comm::notice_for(std::uint32_t next, const std::vector<std::uint32_t>& unfinished) {
  std::uint32_t below = next;
  for (std::uint32_t seq : unfinished)
    if (seq_before(seq, below)) below = seq;
  CloseNotice notice{.complete_below = below};
  // In-flight sequence numbers lie within kSeqWindow; one beyond the span counts unfinished.
  notice.span = static_cast<std::uint16_t>(std::min<std::uint32_t>(next - below, kCloseWindow));
  for (std::uint32_t offset = 0; offset < notice.span; ++offset) notice.set_finished(offset);
  for (std::uint32_t seq : unfinished) {
    const std::uint32_t offset = seq - below;
    if (offset < notice.span) {
      notice.finished_bits[offset / 8] &= static_cast<std::uint8_t>(~(1u << (offset % 8)));
    }
  }
  return notice;
}

bool Comm::on_liveness(const mux::ControlHeader& header) {
  last_heard_ = std::chrono::steady_clock::now();
  const auto type = static_cast<MessageType>(header.type);
  if (type == MessageType::kPing) {
    // Lost to back-pressure, the next ping asks again.
    if (!closed_ && !peer_control_.empty()) send_control(MessageType::kPong, 0, {});
    return true;
  }
  return type == MessageType::kPong;
}

void Comm::check_peer() {
  if (peer_ == PeerState::kLost || closed_ || peer_control_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  const auto timeout = std::chrono::milliseconds(core_->config().peer_timeout_ms);
  if (peer_ == PeerState::kClosed) {
    // What the notice left pending had that long to finish.
    if (now > close_deadline_) settle_after_close();
    return;
  }
  if (now - last_heard_ > timeout) {
    peer_lost("no sign of life from the peer for LOOM_PEER_TIMEOUT_MS (" +
              std::to_string(timeout.count()) + " ms): taken as dead");
    return;
  }
  if (now < next_ping_) return;
  next_ping_ = now + timeout / 4;
  const Status status = send_control(MessageType::kPing, 0, {});
  if (status != Status::kOk && status != Status::kRetry) {
    peer_lost("the peer is unreachable (" + last_error_ + ")");
  }
}

CommStats Comm::stats() const {
  // Under the lane lock: completions of this communicator's receives (eager and rendezvous
  // counts) may be handled by another thread progressing the shared lane.
  std::lock_guard lock(lane_->mutex());
  CommStats stats = stats_;
  stats.lane_id = lane_->id();
  stats.lane_comms = lane_->stats().comms;
  for (std::size_t i = 0; i < lane_->rails().data_rails(); ++i) {
    stats.data_nics.push_back(lane_->rails().data(i).nic().attributes().domain);
  }
  return stats;
}

void Comm::fail_all(Status status, const std::string& text) {
  for (Request& r : requests_.built()) {
    if (!r.in_use) continue;
    bool all_done = true;
    for (std::size_t i = 0; i < r.part_count; ++i) all_done = all_done && r.parts[i].done;
    if (all_done) continue;  // its outcome is decided: test() reports it
    r.fail(status, text);
    for (std::size_t i = 0; i < r.part_count; ++i) {
      Part& part = r.parts[i];
      if (part.done) continue;
      part.status = status;
      // A part whose receive is still posted finishes when its cancellation completes.
      if (!part.recv_outstanding) part.done = true;
    }
    cancel(r);
  }
}

void Comm::close(std::unique_ptr<Comm> self) {
  if (!self || self->closed_) return;
  mux::Lane& lane = *self->lane_;
  bool drained = false;
  {
    std::unique_lock lock(lane.mutex());
    // A close notice from the peer may be waiting: then the peer's endpoints may be gone, and
    // some providers (shm) cannot take a message for a closed endpoint.
    self->closed_ = true;
    lane.progress();
    util::log().debug("closing comm {} on lane {} (peer comm {}{})", self->id_, lane.id(),
                      self->peer_id_, self->peer_gone() ? ", the peer is gone" : "");
    const auto deadline = std::chrono::steady_clock::now() + kCloseDrain;
    if (!self->peer_gone() && !self->peer_control_.empty()) {
      // Tells the peer how far we got, so that what arrived stays delivered over there.
      std::byte body[close_notice_bytes(kCloseWindow)];
      const std::size_t length = encode_close(self->close_notice(), body);
      Status sent = self->send_control(MessageType::kClose, 0, {body, length}, true);
      while (sent == Status::kRetry && std::chrono::steady_clock::now() < deadline) {
        lane.progress();
        sent = self->send_control(MessageType::kClose, 0, {body, length}, true);
      }
    }
    self->fail_all(Status::kCancelled, "communicator closed");
    // The close notice, too, must have left before the lane (perhaps) closes its endpoints.
    while ((!self->drained() || lane.control().sends_in_flight()) &&
           std::chrono::steady_clock::now() < deadline) {
      lane.progress();
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    // A receiver whose announced buffers a peer may still be writing into waits for those
    // writes: an endpoint closed under one (rxm over tcp crashes), or a buffer given back to
    // the application under one, is worse than a slower close.
    const auto writes_deadline = std::chrono::steady_clock::now() +
                                 std::chrono::milliseconds(self->core_->config().peer_timeout_ms);
    while (self->writes_may_arrive() && !self->peer_gone() &&
           std::chrono::steady_clock::now() < writes_deadline) {
      lane.progress();
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    drained = self->drained();
    // Operations still out keep using their registrations until the lane frees them.
    if (drained) self->release_registrations();
    lane.detach(self->id_);
  }
  std::shared_ptr<ContextCore> core = std::move(self->core_);
  if (!drained) {
    util::log().info(
        "communicator {} on lane {} closed with operations in flight; the lane "
        "frees it once they complete",
        self->id_, lane.id());
    std::lock_guard lock(lane.mutex());
    lane.retire(std::move(self));
  }
  self.reset();
  core->lanes().leave(lane);
}

}  // namespace loom::p2p
