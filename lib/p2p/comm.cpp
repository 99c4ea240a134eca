#include "p2p/comm.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "p2p/context_core.hpp"
#include "util/log.hpp"
#include "util/step_trace.hpp"

namespace loom::p2p {
namespace {

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

std::size_t eager_limit(std::size_t configured, std::size_t max_msg_size,
                        std::size_t paced_above) noexcept {
  std::size_t limit = std::min(configured, max_msg_size == 0 ? SIZE_MAX : max_msg_size);
  return paced_above == 0 ? limit : std::min(limit, paced_above);
}

void Request::on_completion(ofi::OpContext& op, const ofi::Completion& completion) {
  comm->on_op(*this, op_index(op), completion);
  if (record == RecordState::kReleased && ops_outstanding == 0) [[unlikely]]
    comm->release_regions(*this);
}

Comm::Comm(ContextCore& core, mux::Lane& lane, mux::Direction direction, std::uint64_t peer)
    : settings_{.eager_max = core.config().eager_max,
                .eager_credits = core.config().eager_credits,
                .eager_fragments = core.config().eager_fragments,
                .inject_max = core.config().inject_max,
                .carry_control = core.config().carry_control,
                .min_stripe = core.config().min_stripe,
                .peer_timeout = std::chrono::milliseconds(core.config().peer_timeout_ms),
                .peer_isolation = core.config().peer_isolation,
                .force_flush = core.config().force_flush,
                .gpu_flush = core.config().gpu_flush,
                .provider = core.provider()},
      lanes_(core.lanes()),
      lane_(&lane),
      direction_(direction),
      peer_context_(peer),
      serial_(core.next_comm_serial()),
      context_id_(core.id()),
      regions_(&core.regions()),
      // Both directions use it: no eager send, and no eager receive, past it.
      paced_above_(
          settings_.peer_isolation ? lane.rails().data(0).nic().attributes().peer_paced_above : 0),
      eager_max_(eager_limit(settings_.eager_max, lane.rails().max_msg_size(), paced_above_)),
      requests_(this, kMaxRequests) {
  retry_.reserve(kMaxRequests);
  retrying_.reserve(kMaxRequests);
  std::lock_guard lock(lane.lock());
  id_ = lane.attach(*this);
}

// Comm::close() is the way out. A communicator destroyed without it (a constructor that threw
// after attaching, whose maker leaves the lane; or an owner's bug) still detaches, so the lane
// never routes to freed memory.
//
// A retired communicator is destroyed by its lane, under the lane lock, once drained: the
// registrations its operations used go back to the cache only then.
Comm::~Comm() {
  // Comm's own: a derived communicator released its registrations in its destructor.
  if (closed_) {
    Comm::release_registrations();
    release_peer_addresses();
    return;
  }
  std::lock_guard lock(lane_->lock());
  Comm::release_registrations();
  release_peer_addresses();
  lane_->detach(id_);
}

// Once only: a communicator closed and drained gave them back under the lane lock in close(),
// and its destructor (outside the lock) must not touch the lane again.
void Comm::release_peer_addresses() noexcept {
  if (peer_data_.empty() && peer_control_.empty()) return;
  lane_->release_peer(peer_data_, peer_control_);
  peer_data_.clear();
  peer_control_.clear();
}

void Comm::release_registrations() {
  for (auto& entry : registrations_) {
    if (entry.registration != nullptr)
      lane_->rails().registration_table().release(*entry.registration);
    entry.registration = nullptr;
  }
}

void Comm::abandon_registrations() noexcept {
  for (auto& entry : registrations_) entry.registration = nullptr;
}

bool Comm::drained() const noexcept {
  for (const Request& r : requests_.built())
    if (r.in_use() && r.ops_outstanding != 0) return false;
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
  std::lock_guard lock(lane_->lock());
  auto& rails = lane_->rails();
  data_rails_ = std::min(rails.data_rails(), peer.data.size());
  control_rails_ = std::min(rails.control_rails(), peer.control.size());
  peer_id_ = peer.comm;
  peer_lane_ = peer.lane;
  inject_max_ = settings_.inject_max;
  carry_control_ = settings_.carry_control == CarryControl::kAlways ||
                   (settings_.carry_control == CarryControl::kWhereItHelps &&
                    rails.data(0).nic().attributes().carry_control);
  inject_size_ = rails.data(0).nic().attributes().inject_size;
  eager_fragments_ = std::min<std::size_t>(
      settings_.eager_fragments.value_or(rails.data(0).nic().attributes().eager_fragments),
      mux::kMaxEagerFragments);
  for (std::size_t i = 0; i < data_rails_; ++i) {
    peer_data_.push_back(lane_->acquire_peer(i, peer.data[i]));
    inject_max_ = std::min(inject_max_, rails.data(i).nic().attributes().inject_size);
    inject_writes_ = inject_writes_ && rails.data(i).nic().attributes().inject_writes;
  }
  for (std::size_t i = 0; i < control_rails_; ++i) {
    peer_control_.push_back(lane_->acquire_peer(rails.data_rails() + i, peer.control[i]));
  }
  on_peer_connected();
  if (writes_posted_owed_) {
    writes_posted_owed_ = false;
    send_writes_posted();
  }
}

MemoryRegion Comm::register_memory(const void* data, std::size_t size, MemoryType type, int device,
                                   const Dmabuf* dmabuf) {
  std::lock_guard lock(lane_->lock());
  if (closed_) throw Error("register memory", settings_.provider, 0, "communicator is closed");
  ofi::MemoryRegistration& registration =
      lane_->rails().registration_table().acquire(data, size, type, device, dmabuf);
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
  region.owner_ = serial_;
  region.slot_ = slot;
  region.generation_ = entry.generation;
  return region;
}

// A region pending requests still use goes once the last of them is retired: until then the
// provider may read or write through it (a rendezvous write posted when its clear-to-send
// comes). The handle is invalid from now on either way.
void Comm::deregister(MemoryRegion region) {
  std::lock_guard lock(lane_->lock());
  if (region.owner_ != serial_ || region.slot_ >= registrations_.size()) return;
  Registration& entry = registrations_[region.slot_];
  if (entry.registration == nullptr || entry.deregistered ||
      entry.generation != region.generation_) {
    return;
  }
  if (entry.users != 0) {
    util::log().debug(
        "comm {} on lane {}: region deregistered while {} pending buffer(s) use it: "
        "released once they end",
        id_, lane_->id(), entry.users);
    entry.deregistered = true;
    ++entry.generation;
    return;
  }
  release_slot(region.slot_);
}

void Comm::release_slot(std::uint32_t slot) {
  Registration& entry = registrations_[slot];
  lane_->rails().registration_table().release(*entry.registration);
  entry.registration = nullptr;
  entry.deregistered = false;
  free_registrations_.push_back(slot);
}

// lookup() just found or made the lane's entry: found again, not registered again.
void Comm::hold_shared_region(Part& part, const MemoryRegion& region) noexcept {
  mux::SharedRegions& shared = lane_->shared_regions();
  const std::uint32_t entry = shared.find(region.slot_, region.generation_);
  shared.hold(entry);
  part.region = entry | kSharedRegion;
}

void Comm::release_shared_region(std::uint32_t entry) noexcept {
  lane_->shared_regions().let_go(entry);
}

// A region of the context: the lane's registration of it. Once the lane has one, a post takes
// only the lane lock; the context's table (and its mutex) is read at the lane's first use. A
// deregistration drops the lanes' entries before Region::reset returns.
std::uint32_t Comm::shared_entry(const MemoryRegion& region) {
  mux::SharedRegions& shared = lane_->shared_regions();
  const std::uint32_t entry = shared.find(region.slot_, region.generation_);
  if (entry != mux::SharedRegions::kNone) [[likely]]
    return entry;
  const auto found = regions_->find({region.slot_, region.generation_});
  if (!found) {
    reject(Status::kInvalid, "the context's memory region is deregistered");
    return mux::SharedRegions::kNone;
  }
  try {
    return shared.add(region.slot_, region.generation_, found->base, found->size, found->type,
                      found->device);
  } catch (const Error& e) {
    reject(Status::kInvalid, std::string("the context's memory region could not be registered "
                                         "on this communicator's lane: ") +
                                 e.what());
    return mux::SharedRegions::kNone;
  }
}

const ofi::MemoryRegistration* Comm::lookup_shared(const MemoryRegion& region, const void* data,
                                                   std::size_t size) {
  mux::SharedRegions& shared = lane_->shared_regions();
  const std::uint32_t entry = shared_entry(region);
  if (entry == mux::SharedRegions::kNone) [[unlikely]]
    return nullptr;
  if (!shared.covers(entry, data, size)) [[unlikely]] {
    reject(Status::kInvalid, "buffer of " + std::to_string(size) +
                                 " bytes lies outside its registered region of " +
                                 std::to_string(shared.size(entry)) + " bytes");
    return nullptr;
  }
  return &shared.registration(entry);
}

const ofi::MemoryRegistration* Comm::lookup_elsewhere(const MemoryRegion& region, const void* data,
                                                      std::size_t size) {
  if (region.owner_ == context_id_) [[unlikely]]
    return lookup_shared(region, data, size);
  if (region.owner_ != serial_ || region.slot_ >= registrations_.size() ||
      registrations_[region.slot_].registration == nullptr ||
      registrations_[region.slot_].generation != region.generation_) [[unlikely]] {
    reject(Status::kInvalid, !region.valid()            ? "an empty memory region"
                             : region.owner_ != serial_ ? "the memory region was registered on "
                                                          "another communicator or context"
                                                        : "the memory region is deregistered");
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

Status Comm::refuse_post(const char* operation) {
  if (closed_)
    return reject(Status::kInvalid, std::string(operation) + " on a closed communicator");
  return reject(Status::kPeerError, std::string(operation) + ": " + peer_gone_);
}

Status Comm::refuse_full(const char* operation) {
  return reject(Status::kRetry, std::string(operation) + ": " + std::to_string(kMaxRequests) +
                                    " requests already in flight; test some first");
}

void Comm::retry_later(Request& request) {
  if (!request.backpressured) {
    request.backpressured = true;
    retry_.push_back(&request);
  }
  defer();
}

void Comm::on_deferred() {
  if (control_failure_ != ControlFailure::kNone) [[unlikely]]
    settle_control_failure();
  if (control_held()) [[unlikely]] {
    // Held back (note_control_pushback): the batch and the posts waiting for room in it wait.
    --control_waits_left_;
    defer();
    return;
  }
  send_control_batch();
  retrying_.swap(retry_);
  for (Request* r : retrying_) {
    r->backpressured = false;
    if (r->in_use()) advance(*r);
  }
  retrying_.clear();
}

Status Comm::send_control(MessageType type, std::uint32_t seq, std::span<const std::byte> body,
                          bool confirmed) {
  if (control_rails_ == 0) [[unlikely]]
    return Status::kRetry;  // before connect_peer: no peer address to send to yet
  if (control_held()) [[unlikely]]
    return Status::kRetry;
  const std::size_t rail = seq % control_rails_;
  const Status status = lane_->control().send(
      rail, peer_control_[rail], static_cast<std::uint8_t>(type), peer_id_, body, confirmed);
  util::log().trace("comm {} on lane {}: control type {} seq {} to comm {}: {}", id_, lane_->id(),
                    static_cast<int>(type), seq, peer_id_, to_string(status));
  if (status == Status::kOk) [[likely]] {
    control_pushbacks_ = 0;
  } else if (status == Status::kRetry) {
    note_control_pushback();
  }
  if (status != Status::kOk && status != Status::kRetry && status != Status::kInvalid)
      [[unlikely]] {
    // The provider refused it: the peer's endpoint is gone (closed, or its process died). Its
    // close notice may already wait in our queue, and says more than the provider's text: the
    // message is retried like back-pressure until the queues were read (settle_control_failure).
    if (control_failure_ == ControlFailure::kNone) {
      control_failure_ = ControlFailure::kFailed;
      control_failure_text_ = lane_->control().rail(rail).last_error();
      util::log().debug("comm {} on lane {}: control message to the peer failed: {}", id_,
                        lane_->id(), control_failure_text_);
    }
    lane_->rails().read_control_next();
    defer();
    return Status::kRetry;
  }
  return status;
}

void Comm::note_control_pushback() {
  ++stats_.control_pushed_back;
  // Counted only as far as the longest wait needs (a bounded shift below).
  if (control_pushbacks_ <= kPromptControlRetries + 8) ++control_pushbacks_;
  control_waits_left_ =
      control_pushbacks_ <= kPromptControlRetries
          ? 0
          : std::min(1u << (control_pushbacks_ - kPromptControlRetries - 1), kLongestControlWait);
}

// Two lane progresses after a refused control message, whose control queues were read: a
// close notice from the peer would have come by then.
void Comm::settle_control_failure() {
  if (peer_gone()) {
    control_failure_ = ControlFailure::kNone;
    return;
  }
  if (control_failure_ == ControlFailure::kFailed) {
    control_failure_ = ControlFailure::kQueuesRead;
    lane_->rails().read_control_next();
    defer();
    return;
  }
  control_failure_ = ControlFailure::kNone;
  peer_lost("the peer is unreachable: a control message to it failed (" + control_failure_text_ +
            ")");
}

Status Comm::refuse_batch(const char* what) {
  last_error_ = std::string("internal error: a ") + what + " batch could not be encoded";
  util::log().error("comm {} on lane {}: {}", id_, lane_->id(), last_error_);
  return Status::kError;
}

Request* Comm::refuse_handle(const loom::Request& handle, const char* operation) {
  const Request* r = handle.comm_ == serial_ ? requests_.at(handle.index_) : nullptr;
  const char* why = !handle.valid()           ? "an empty request handle"
                    : handle.comm_ != serial_ ? "a request of another communicator"
                    : r == nullptr            ? "not a request of this communicator"
                                              : "a request already reported done";
  reject(Status::kInvalid, std::string(operation) + ": " + why);
  return nullptr;
}

Status Comm::poll(Request& r, std::span<std::size_t> sizes, std::size_t& handled) {
  Request* request = &r;
  util::record_step(util::Step::kTestBegin);
  std::unique_lock lock(lane_->lock());
  // An earlier CQ read may already have finished it: only poll (a system call on some
  // providers) for requests still pending.
  handled = 1;
  bool ready = finished(*request);
  if (!ready) {
    handled = lane_->progress(awaits_control(*request) ? ofi::RailSet::Awaiting::kAnything
                                                       : ofi::RailSet::Awaiting::kData);
    ready = finished(*request);
  }
  if (!ready) {
    const bool periodic = (++liveness_polls_ & (kPollsPerLivenessCheck - 1)) == 0;
    if (periodic) [[unlikely]] {
      check_peer();
      settle_late_clearances();
    }
    lock.unlock();
    kick_other_lanes();
    // Without a progress thread (LOOM_PROGRESS_THREAD=0) the waiting polls run the registry's
    // turn for the lanes nobody polls.
    if (periodic) [[unlikely]]
      lanes_.run_due_turn();
    // Our lane had nothing to do: now and then give another a turn (see
    // LaneRegistry::progress_another). Not every time: on shm each poll contends for the
    // peer's queue lock.
    if (handled == 0 && (++idle_polls_ & (kIdlePollsPerProgressAnother - 1)) == 0) {
      lanes_.progress_another(*lane_);
    }
    return Status::kInProgress;
  }
  util::record_step(util::Step::kTestFinished);
  for (std::size_t i = 0; i < sizes.size() && i < request->part_count; ++i) {
    sizes[i] = request->parts[i].delivered;
  }
  const Status status = request->status;
  if (status != Status::kOk) {
    last_error_ = std::move(request->error);
  } else if (request->kind != RequestKind::kFlush) {
    for (std::size_t i = 0; i < request->part_count; ++i)
      count_message(request->parts[i].delivered);
  }
  if (request->ops_outstanding != 0) {
    // The provider still holds it: out of the pool for good, its regions held until the
    // provider hands it back (if ever).
    request->record = RecordState::kReleased;
    return status;
  }
  release_regions(*request);
  request->record = RecordState::kFree;
  requests_.give_back(*request);
  return status;
}

// A dead peer fails the request through check_peer(), so waiting is testing, bounded by the
// caller's timeout, with the CPU given up while nothing happens.
Status Comm::wait(const loom::Request& handle, std::span<std::size_t> sizes,
                  std::chrono::milliseconds timeout) {
  if (is_done_at_post(handle)) return report_done_at_post(handle, sizes);
  Request* request = find(handle, "wait");
  if (request == nullptr) [[unlikely]]
    return Status::kInvalid;
  using Clock = std::chrono::steady_clock;
  const auto deadline = timeout == std::chrono::milliseconds::max() ? Clock::time_point::max()
                                                                    : Clock::now() + timeout;
  unsigned empty_polls = 0;
  auto sleep = std::chrono::duration_cast<std::chrono::nanoseconds>(kFirstSleep);
  for (unsigned polls = 1;; ++polls) {
    std::size_t handled = 0;
    const Status status = poll(*request, sizes, handled);
    if (status != Status::kInProgress) return status;
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

CommStats Comm::stats() const {
  // Under the lane lock: completions of this communicator's receives (eager and rendezvous
  // counts) may be handled by another thread progressing the shared lane.
  std::lock_guard lock(lane_->lock());
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
    if (!r.in_use() || r.decided()) continue;  // a decided request keeps its outcome
    if (r.is_batch()) {
      fail_batch(r, status, text);
      continue;
    }
    bool failed = false;
    for (std::size_t i = 0; i < r.part_count; ++i) {
      fail_part(r, r.parts[i], status);
      failed = failed || r.parts[i].status != Status::kOk;
    }
    if (failed) r.fail(status, text);
  }
}

}  // namespace loom::p2p
