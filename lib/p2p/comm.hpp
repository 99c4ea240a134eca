// What send and receive communicators share: their lane, the peer's addresses, registrations,
// the request pool, back-pressure retries, test/wait, liveness and close.
//
// Work a communicator cannot do at once is deferred to its lane's next progress
// (mux::Lane::defer): control entries batched for one message (send_control_batch) and posts
// the provider pushed back (retry_later). See mux::Lane::progress for when they leave.
#pragma once

#include <array>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/p2p.hpp"
#include "mux/lane.hpp"
#include "mux/lane_registry.hpp"
#include "p2p/context_regions.hpp"
#include "p2p/messages.hpp"
#include "p2p/request.hpp"

namespace loom::p2p {

class ContextCore;

// Requests in flight per communicator, and the sequence window that covers every buffer they
// can hold. Remote CQ data carries 12 sequence bits, so the window must divide 4096.
inline constexpr std::size_t kMaxRequests = kMaxRequestsPerComm;
inline constexpr std::size_t kSeqWindow = 1024;
// Idle test() calls between turns given to another lane (a power of two).
inline constexpr unsigned kIdlePollsPerProgressAnother = 16;
static_assert((kIdlePollsPerProgressAnother & (kIdlePollsPerProgressAnother - 1)) == 0);
static_assert(kMaxRequests * kMaxParts <= kSeqWindow);
static_assert(kMaxRequests <= 256, "Request::index is a byte");
static_assert(mux::kMaxEagerFragments == 4, "LOOM_EAGER_FRAGMENTS's range (lib/util/config.cpp)");
static_assert(mux::kMaxEagerFragments <= 8, "Part::fragments_arrived has a bit per fragment");
// The eager buffers of `eager_size` bytes a message of `size` bytes fills, one at least: its
// credits, and its fragments where it goes ahead in several (eager.cpp).
constexpr std::size_t eager_buffers(std::size_t size, std::size_t eager_size) noexcept {
  return size <= eager_size ? 1 : (size + eager_size - 1) / eager_size;
}
// One limit under two names: the public one, and the wire's and the request's.
static_assert(kMaxParts == kMaxRecvBuffers, "a receive request's parts are irecv's buffers");
static_assert(kMaxOps >= kMaxParts && kMaxOps >= kMaxSendStripes,
              "a request's op contexts cover its parts' receives and its stripes' writes");
static_assert(kSeqWindow <= kCloseWindow, "a close notice covers every sequence in flight");
static_assert(((std::size_t{1} << mux::kImmSeqBits) % kSeqWindow) == 0);
static_assert(kSeqWindow <= (std::size_t{1} << mux::kTagSeqBits));

// The largest eager message: LOOM_EAGER_MAX (`configured`), within what the provider takes in
// one transfer (`max_msg_size`, 0: unbounded) and where it completes sends without waiting for
// the peer (Profile::peer_paced_above, 0: always).
[[nodiscard]] std::size_t eager_limit(std::size_t configured, std::size_t max_msg_size,
                                      std::size_t paced_above) noexcept;

// The configuration a communicator reads, copied at construction: nothing on its data path
// reaches back into the context.
struct CommSettings {
  std::size_t eager_max = 0;
  std::optional<std::size_t> eager_credits;    // none: the data rail's provider profile decides
  std::optional<std::size_t> eager_fragments;  // none: the data rail's provider profile decides
  std::size_t inject_max = 0;
  CarryControl carry_control = CarryControl::kNever;
  std::size_t min_stripe = 0;
  std::chrono::milliseconds peer_timeout{0};
  bool peer_isolation = true;
  bool force_flush = false;
  bool gpu_flush = true;
  std::string provider;  // for error texts
};

class Comm : public mux::CommPort {
 public:
  // `peer` is the peer context's id (the lane registry counts each peer's communicators).
  Comm(ContextCore& core, mux::Lane& lane, mux::Direction direction, std::uint64_t peer);
  ~Comm() override;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  [[nodiscard]] mux::Lane& lane() const noexcept { return *lane_; }
  [[nodiscard]] mux::CommId id() const noexcept { return id_; }
  // Our lane's addresses and comm id, for the handshake.
  [[nodiscard]] LaneAddresses local_addresses() const;
  // Inserts the peer's lane addresses; from now on the communicator can reach its peer.
  void connect_peer(const LaneAddresses& peer);

  MemoryRegion register_memory(const void* data, std::size_t size, MemoryType type, int device,
                               const Dmabuf* dmabuf = nullptr);
  void deregister(MemoryRegion region);
  // The user's handle of a request it posted (valid while the request is kPending).
  [[nodiscard]] loom::Request handle_of(const Request& request) const noexcept {
    return {serial_, requests_.index_of(request), request.generation};
  }
  // The handle of send `seq` of `size` bytes, done at its post (sent ahead whole, by an inject):
  // it names no request, as UCX's send that completed in place gives none. The mark in its index
  // says so, its size is beside it, and its sequence number keeps two such handles apart.
  static constexpr std::uint32_t kDoneAtPost = 0x8000'0000u;
  [[nodiscard]] loom::Request done_at_post(std::uint32_t seq, std::size_t size) const noexcept {
    assert(size < kDoneAtPost);  // an inject's size: a few KiB
    return {serial_, kDoneAtPost | static_cast<std::uint32_t>(size), seq | kDoneAtPost};
  }
  // kInProgress while the request runs, its outcome once done (see loom::Communicator::test).
  // Inline: the user's polling loop calls it many times per message.
  Status test(const loom::Request& handle, std::span<std::size_t> sizes) {
    if (is_done_at_post(handle)) return report_done_at_post(handle, sizes);
    Request* request = find(handle, "test");
    if (request == nullptr) [[unlikely]]
      return Status::kInvalid;
    std::size_t handled = 0;
    return poll(*request, sizes, handled);
  }
  // test() until done; kInProgress once `timeout` passed with the request still pending. Backs
  // off (yield, then short sleeps) while nothing completes, so a wait for a peer that is slow
  // to post leaves the CPU to others.
  Status wait(const loom::Request& handle, std::span<std::size_t> sizes,
              std::chrono::milliseconds timeout);
  [[nodiscard]] const std::string& last_error() const noexcept { return last_error_; }
  [[nodiscard]] CommStats stats() const;
  // What the connecting side passed to connect (0: nothing), the same at both ends.
  [[nodiscard]] std::uint64_t label() const noexcept { return label_; }
  void set_label(std::uint64_t label) noexcept { label_ = label; }

  // Cancels what is pending, tells the peer, and leaves the lane; `self` is destroyed, or kept
  // by the lane until its endpoints close if the provider still holds operations of it.
  static void close(std::unique_ptr<Comm> self);

  // Called by a request's completion (under the lane lock).
  virtual void on_op(Request& request, std::size_t index, const ofi::Completion& completion) = 0;
  // The request is retired: neither the provider nor its user holds it any more (under the
  // lane lock). Its parts let go of their regions. Inline: every test that finds a request
  // done retires it.
  void release_regions(Request& request) noexcept {
    if (request.is_batch()) [[unlikely]]
      return release_batch(request);
    for (std::size_t i = 0; i < request.part_count; ++i) {
      const Part& part = request.parts[i];
      if (part.registration == nullptr) continue;
      if ((part.region & kSharedRegion) != 0) [[unlikely]] {
        release_shared_region(part.region & ~kSharedRegion);
        continue;
      }
      Registration& entry = registrations_[part.region];
      if (--entry.users == 0 && entry.deregistered) [[unlikely]]
        release_slot(part.region);
    }
  }
  // No operation of the communicator is left with the provider.
  [[nodiscard]] bool drained() const noexcept override;
  [[nodiscard]] bool abandoned() const noexcept override { return peer_ == PeerState::kLost; }
  void abandon_registrations() noexcept override;

 protected:
  struct Registration {
    ofi::MemoryRegistration* registration = nullptr;
    const std::byte* base = nullptr;  // what the user registered (the cache may cover more)
    std::size_t size = 0;
    std::uint32_t generation = 0;
    // Parts of requests not retired yet that use it: a deregister() meanwhile takes effect
    // once the last of them is (the provider may still read or write through it).
    std::uint32_t users = 0;
    bool deregistered = false;
  };

  // A request taken from the pool and made new for a post of `kind`, or nullptr when
  // kMaxRequests are in flight. Inline: every post starts here.
  Request* allocate(RequestKind kind) {
    // The peer's silence counts only while something waits on it (from the next check_peer).
    const bool idle = requests_.all_free();
    Request* taken = requests_.take();
    if (taken == nullptr) [[unlikely]]
      return nullptr;
    if (idle) since_check_ = SinceCheck::kWaitBegan;
    Request& r = *taken;
    r.kind = kind;
    r.record = RecordState::kPending;
    if (++r.generation == 0) r.generation = 1;  // 0 is the empty handle's
    r.backpressured = false;
    r.part_count = 0;
    r.batch = BatchState::kPosting;
    r.ops_outstanding = 0;
    r.status = Status::kOk;
    r.stripes = r.stripes_posted = r.stripes_done = 0;
    r.written = r.bodies = r.bodies_done = 0;
    r.ready_to_send = ReadyToSendState::kNotNeeded;
    r.placed_ahead = 0;
    r.taken_ahead = 0;
    r.error.clear();
    return &r;
  }
  // Gives every registration back to the lane's cache (under the lane lock).
  virtual void release_registrations();
  // The peer's addresses are in (connect_peer, under the lane lock): what needs them starts.
  virtual void on_peer_connected() {}
  // Closing: takes back what the communicator keeps posted whatever its requests (close()).
  virtual void cancel_standing() {}
  // Gives the peer's addresses back to the lane (under the lane lock): once no communicator
  // uses them, the peer leaves the lane's AVs.
  void release_peer_addresses() noexcept;
  // The registration behind `region` covering [data, data + size), or nullptr (last_error_ set).
  // Inline: every post with a buffer passes here, mostly with a region of its own communicator.
  const ofi::MemoryRegistration* lookup(const MemoryRegion& region, const void* data,
                                        std::size_t size) {
    if (region.owner_ == serial_ && region.slot_ < registrations_.size()) [[likely]] {
      const Registration& entry = registrations_[region.slot_];
      const auto* p = static_cast<const std::byte*>(data);
      if (entry.registration != nullptr && entry.generation == region.generation_ &&
          p >= entry.base && size <= entry.size &&
          static_cast<std::size_t>(p - entry.base) <= entry.size - size) [[likely]] {
        return entry.registration;
      }
    }
    return lookup_elsewhere(region, data, size);
  }
  // lookup() for a region of the context, or one it refuses (saying why).
  [[gnu::noinline]] const ofi::MemoryRegistration* lookup_elsewhere(const MemoryRegion& region,
                                                                    const void* data,
                                                                    std::size_t size);
  const ofi::MemoryRegistration* lookup_shared(const MemoryRegion& region, const void* data,
                                               std::size_t size);
  // The lane's entry for the context's `region`, registered on the lane now if it had none; or
  // SharedRegions::kNone with last_error_ saying why (deregistered, or the provider refused).
  std::uint32_t shared_entry(const MemoryRegion& region);
  // Whether `region` is one of the context's (Context::register_memory), and its name there.
  [[nodiscard]] bool is_context_region(const MemoryRegion& region) const noexcept {
    return region.owner_ == context_id_;
  }
  [[nodiscard]] static ContextRegions::Name name_of(const MemoryRegion& region) noexcept {
    return {region.slot_, region.generation_};
  }
  // Part::region of a part that holds a region of the context: the lane's entry, this bit set.
  static constexpr std::uint32_t kSharedRegion = 1u << 31;
  // `part` uses `region` (lookup() accepted it): the registration stays until the part's
  // request is retired (release_regions), whatever deregister() does meanwhile.
  void hold_region(Part& part, const MemoryRegion& region) noexcept {
    if (region.owner_ == context_id_) [[unlikely]]
      return hold_shared_region(part, region);
    part.region = region.slot_;
    ++registrations_[region.slot_].users;
  }
  void hold_shared_region(Part& part, const MemoryRegion& region) noexcept;
  void release_shared_region(std::uint32_t entry) noexcept;
  void release_slot(std::uint32_t slot);
  Status reject(Status status, std::string text);  // records last_error_
  // A post (`operation`) refused because the communicator is closed or its peer gone, or because
  // kMaxRequests are in flight.
  [[gnu::cold]] Status refuse_post(const char* operation);
  [[gnu::cold]] Status refuse_full(const char* operation);
  // The provider pushed back: advance() runs again at the lane's next progress.
  void retry_later(Request& request);
  // Where the peer stands. kClosed: it closed its end and said how far it got (its close
  // notice): what it sent or received before that still finishes here; the rest failed.
  // kBroken: this side ended the communicator after a provider error (break_off) and told the
  // peer so, as a close would. kLost: dead, unreachable or silent; everything pending failed.
  enum class PeerState : std::uint8_t { kConnected, kClosed, kBroken, kLost };
  [[nodiscard]] bool peer_gone() const noexcept { return peer_ != PeerState::kConnected; }

  // Inline: test() asks it once or twice per call. Every part is decided, and the provider
  // holds none of the request's operations, except sends and one-sided batches to a peer that
  // is gone: those may never complete (shm waits for the peer to take them), and a send only
  // reads its buffer (see RecordState::kReleased; a read batch's buffers are the caveat the
  // README's one-sided section states). A receive is never reported while the provider may still
  // write into its buffer.
  [[nodiscard]] bool finished(const Request& r) const noexcept {
    if (!r.decided()) return false;
    return r.ops_outstanding == 0 ||
           ((r.kind == RequestKind::kSend || r.is_batch()) && peer_gone());
  }
  // Sends a control message to the peer: kOk, or kRetry (back-pressure, or a message the
  // provider refused: see settle_control_failure). `confirmed`: see mux::ControlChannel::send.
  Status send_control(MessageType type, std::uint32_t seq, std::span<const std::byte> body,
                      bool confirmed = false);
  void settle_control_failure();
  // A control message the provider pushed back (EAGAIN). The first kPromptControlRetries go
  // again at the lane's next progress; after that the wait doubles, up to kLongestControlWait
  // progresses, during which control messages to the peer, and the posts waiting for room in a
  // batch, are held back (control_held). A peer that takes nothing (stopped, its receive queue
  // full) would otherwise have the batch encoded and injected again at every progress of a lane
  // its lane-mates poll, once per post waiting for the batch.
  void note_control_pushback();
  [[nodiscard]] bool control_held() const noexcept { return control_waits_left_ != 0; }
  static constexpr unsigned kPromptControlRetries = 4;
  static constexpr unsigned kLongestControlWait = 64;
  // A batch of `what` its encoder refused: kError with last_error_ set (logged once).
  [[gnu::cold]] Status refuse_batch(const char* what);
  // Every request not decided yet fails with `status`/`text`. A part that arrived keeps its
  // outcome, and a request whose parts all did keeps its own: it was delivered.
  void fail_all(Status status, const std::string& text);
  // An undecided part of `request` fails (the request's status says why).
  virtual void fail_part(Request& request, Part& part, Status status) = 0;
  // An undecided one-sided batch fails (one-sided connections).
  virtual void fail_batch(Request& /*request*/, Status /*status*/, const std::string& /*why*/) {}
  // A retired one-sided batch lets go of the regions its blocks hold.
  virtual void release_batch(Request& /*request*/) noexcept {}
  // The peer is gone (dead or unreachable): every request fails, new ones are refused.
  void peer_lost(std::string why, bool warn = true);
  // Tells the peer how far this side got when it gave up on it (`lost_notice_`).
  void tell_lost();
  // The peer's close notice: which messages it finished. Fails what the peer will never
  // finish; the rest runs on, bounded by LOOM_PEER_TIMEOUT_MS.
  void on_peer_close(std::span<const std::byte> body);
  // What our close notice tells the peer: which messages were handed to the provider whole
  // (sender) or arrived (receiver). Taken before what is pending fails.
  // `reason` kLost: everything undecided counts unfinished, since it fails here next.
  [[nodiscard]] virtual CloseNotice close_notice(CloseReason reason) = 0;
  // Sends `notice`, queued behind the provider's first contact if need be (close(), break_off,
  // peer_lost).
  void send_close_notice(const CloseNotice& notice);
  // A provider error failed one of our requests: the peer could otherwise wait for it forever
  // (it is alive and answers pings). The communicator ends as a close would end it, without
  // closing the object: the peer is told how far this side got, what had left still
  // finishes, the rest fails on both sides, and later posts are refused with `why`.
  void break_off(const std::string& why);
  [[nodiscard]] bool gave_up_on_peer() const noexcept;
  // A receiver that sends `notice` in close() waits for the writes it says may come.
  virtual void await_writes(const CloseNotice& /*notice*/) {}
  // Every sequence number below `next` finished except those in `unfinished`.
  static CloseNotice notice_for(std::uint32_t next, const std::vector<std::uint32_t>& unfinished);
  // A sender answers its closing receiver's notice with every write it posted (WritesPosted).
  virtual void send_writes_posted() {}
  // Fails the pending parts the notice does not call finished, with `status` and `why`.
  virtual void fail_unfinished(const CloseNotice& notice, Status status,
                               const std::string& why) = 0;
  // LOOM_PEER_TIMEOUT_MS after the peer's close notice: settles what is still pending.
  virtual void settle_after_close() = 0;
  // Closing: whether writes the peer posted towards this side may still be arriving (see
  // WritesPosted); close() keeps the lane's endpoints until they did, or the peer timed out.
  [[nodiscard]] virtual bool writes_may_arrive() const noexcept { return false; }
  // The pending request `handle` names, or nullptr with last_error_ saying why not. Only the
  // user's thread changes what this reads (posts and reports), so it needs no lock.
  Request* find(const loom::Request& handle, const char* operation) {
    Request* r = handle.comm_ == serial_ ? requests_.at(handle.index_) : nullptr;
    if (r != nullptr && r->generation == handle.generation_ && r->record == RecordState::kPending)
        [[likely]] {
      return r;
    }
    return refuse_handle(handle, operation);
  }
  [[gnu::cold]] Request* refuse_handle(const loom::Request& handle, const char* operation);
  // A send or received buffer reported done (a send done at its post counts at its post).
  void count_message(std::size_t bytes) noexcept {
    ++stats_.messages;
    stats_.bytes += bytes;
  }
  [[nodiscard]] bool is_done_at_post(const loom::Request& handle) const noexcept {
    return handle.comm_ == serial_ && (handle.index_ & kDoneAtPost) != 0;
  }
  // Done whenever asked: nothing is held for it, so a second test cannot tell it was reported.
  static Status report_done_at_post(const loom::Request& handle,
                                    std::span<std::size_t> sizes) noexcept {
    if (!sizes.empty()) sizes[0] = handle.index_ & ~kDoneAtPost;
    return Status::kOk;
  }
  // Whether a control message from the peer may be what `r` waits for: a send's clearance or
  // credits, a receive's ready-to-send; one-sided batches, whose notifications wait for their
  // turn. An eager message's arrival and a send's or flush's completion come on the data rails.
  [[nodiscard]] static bool awaits_control(const Request& r) noexcept {
    switch (r.kind) {
      case RequestKind::kSend:
        return r.parts[0].send == SendState::kAwaitingClearance;
      case RequestKind::kRecv:
        for (std::size_t i = 0; i < r.part_count; ++i) {
          if (r.parts[i].recv == RecvState::kCleared || r.parts[i].recv == RecvState::kWritesAhead)
            return true;
        }
        return false;
      case RequestKind::kFlush:
        return false;
      default:
        return true;
    }
  }
  // One test() pass; `handled` counts the completions it processed.
  Status poll(Request& request, std::span<std::size_t> sizes, std::size_t& handled);
  // Pings and pongs: true when `header` was one (and consumed). Anything from the peer is a
  // sign of life.
  bool on_liveness(const mux::ControlHeader& header, std::span<const std::byte> body);
  // A sender: whether a message waits for its clearance, and the oldest that does (named in
  // our pings).
  virtual bool awaiting_clearance(std::uint32_t& /*oldest*/) const noexcept { return false; }
  // A receiver: the peer's ping says its messages from `from` on wait for their clearances.
  virtual void repeat_clearances(std::uint32_t /*from*/) {}
  // Every kPollsPerLivenessCheck waiting polls: what waits long for a clearance is settled by
  // whichever end polls. A sender asks for a message it did not ask for at once, still waiting
  // at two checks (SendCommImpl); a receiver announces buffers quiet for kQuietPatience
  // (RecvCommImpl).
  virtual void settle_late_clearances() {}
  // While requests wait on the peer: pings it every LOOM_PEER_TIMEOUT_MS / 4 and declares it
  // lost when nothing came back for LOOM_PEER_TIMEOUT_MS (or a ping cannot be sent).
  void check_peer();

  // Posts whatever `request` is ready for; retry_later() on back-pressure.
  virtual void advance(Request& request) = 0;
  // Sends the batched control entries (clear-to-sends or ready-to-sends) in one message.
  virtual void send_control_batch() = 0;
  // Asks for on_deferred() at the lane's next progress.
  void defer() { lane_->defer(*this, id_); }
  // Runs the work other lanes of the context deferred (see LaneRegistry::run_deferred_elsewhere);
  // costs two relaxed loads when there is none.
  void kick_other_lanes() {
    if (lanes_.deferred_elsewhere(*lane_)) [[unlikely]]
      lanes_.run_deferred_elsewhere(*lane_);
  }

  // The lane's next progress: the control batch leaves, back-pressured requests advance.
  void on_deferred() override;

  const CommSettings settings_;
  mux::LaneRegistry& lanes_;  // the context's
  mux::Lane* lane_;
  mux::Direction direction_;
  std::uint64_t peer_context_;
  std::uint64_t label_ = 0;
  // Unique in the process: what the user's request and region handles must carry. A region
  // that carries the context's id instead is one of the context's (regions_).
  std::uint64_t serial_;
  std::uint64_t context_id_;
  ContextRegions* regions_;
  mux::CommId id_ = 0;
  mux::CommId peer_id_ = 0;
  std::uint64_t peer_lane_ = 0;  // the peer communicator's lane, in its context
  std::size_t data_rails_ = 0;   // used with this peer: min of both sides
  std::size_t control_rails_ = 0;
  std::vector<ofi::Address> peer_data_;
  std::vector<ofi::Address> peer_control_;
  // Profile::peer_paced_above of the data rails' provider (0 with LOOM_PEER_ISOLATION=0).
  std::size_t paced_above_;
  std::size_t eager_max_;
  // Eager buffers one message sent ahead may fill (LOOM_EAGER_FRAGMENTS, else the profile's): the
  // sender's most fragments, the receiver's largest quiet buffer in eager sizes.
  std::size_t eager_fragments_ = 1;
  std::size_t inject_max_ = 0;   // eager sends up to this size are injected (no completion)
  bool inject_writes_ = true;    // writes up to inject_max_ too (every data rail's profile allows)
  std::size_t inject_size_ = 0;  // what the provider injects (a payload and a carried message)
  bool carry_control_ = false;   // sends carry control messages (LOOM_CARRY_CONTROL, profile)
  bool closed_ = false;
  PeerState peer_ = PeerState::kConnected;
  std::string peer_gone_;  // why, once peer_ is not kConnected
  // kLost: what this side told the peer, again in answer to its pings (it may only have been
  // stopped, and run again).
  std::unique_ptr<CloseNotice> lost_notice_;
  std::chrono::steady_clock::time_point close_deadline_;  // kClosed: the rest must arrive by then
  std::chrono::steady_clock::time_point last_heard_;
  std::chrono::steady_clock::time_point next_ping_;
  // The first ping since the peer was last heard from (or the wait began); epoch when none.
  std::chrono::steady_clock::time_point first_unanswered_ping_;
  // What happened since the last liveness check, which reads the clock for it: a clock read at
  // every request and every control message would sit on the message's path (~25 ns each).
  enum class SinceCheck : std::uint8_t { kNothing, kHeard, kWaitBegan };
  SinceCheck since_check_ = SinceCheck::kNothing;
  unsigned liveness_polls_ = 0;
  std::vector<Registration> registrations_;
  std::vector<std::uint32_t> free_registrations_;
  RequestPool requests_;
  std::vector<Request*> retry_;  // back-pressured requests
  std::vector<Request*> retrying_;
  std::string last_error_;
  CommStats stats_;
  unsigned idle_polls_ = 0;
  // The peer's close notice asked for our WritesPosted before we knew its addresses.
  bool writes_posted_owed_ = false;
  // A control message the provider refused, and whether the control queues were read since.
  enum class ControlFailure : std::uint8_t { kNone, kFailed, kQueuesRead };
  ControlFailure control_failure_ = ControlFailure::kNone;
  std::string control_failure_text_;
  // Control messages the provider pushed back in a row, and the deferred runs to let pass
  // before the next try (see note_control_pushback).
  unsigned control_pushbacks_ = 0;
  unsigned control_waits_left_ = 0;
};

}  // namespace loom::p2p
