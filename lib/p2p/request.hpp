// A request is a pooled, fixed-size record of one isend, irecv (up to kMaxParts buffers) or
// iflush. Its provider operations carry OpContexts that live inside it, so a request goes back
// to the pool only when no operation of it is outstanding. The user holds a loom::Request, a
// {communicator, index, generation} value that names the record only while the generation
// matches and the record is kPending.
#pragma once

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/error.hpp"
#include "loom/p2p.hpp"
#include "ofi/completion.hpp"
#include "p2p/group.hpp"
#include "p2p/messages.hpp"
#include "p2p/part_state.hpp"
#include "p2p/state_edges.hpp"
#include "util/log.hpp"

namespace loom::ofi {
class MemoryRegistration;
}

namespace loom::p2p {

class Comm;

// Most stripes one rendezvous message is split into (one write each).
inline constexpr std::size_t kMaxSendStripes = kMaxParts;
static_assert(kMaxSendStripes <= mux::kMaxStripes, "writes count their stripes in the CQ data");

// The largest size up to which isend takes every message when no write may be longer than
// the provider's `max_msg_size` (0: unbounded). A message goes in at most kMaxSendStripes
// stripes of size / stripes bytes, the last also taking the remainder (up to stripes - 1).
constexpr std::size_t max_message_size(std::size_t max_msg_size) noexcept {
  if (max_msg_size == 0) return SIZE_MAX;
  if (max_msg_size < kMaxSendStripes) return max_msg_size;
  const std::size_t per_stripe = max_msg_size - (kMaxSendStripes - 1);
  return per_stripe > SIZE_MAX / kMaxSendStripes ? SIZE_MAX : per_stripe * kMaxSendStripes;
}
static_assert(max_message_size(65536) == 8 * (65536 - 7) && max_message_size(SIZE_MAX) == SIZE_MAX);
inline constexpr std::size_t kMaxOps = kMaxParts;

// kWrite and kRead: a one-sided batch (p2p/rma_comm.hpp); it has no parts, its blocks' provider
// operations use its connection's op contexts, and BatchState says where it is.
enum class RequestKind : std::uint8_t { kSend, kRecv, kFlush, kWrite, kRead };

// A one-sided batch: kPosting (blocks still to hand to the provider) -> kCompleting (all handed
// over) -> kNotifying (a write batch with a notification: every block completed, the
// notification waits for its turn or the provider) -> kDone. Any of them -> kFailed.
enum class BatchState : std::uint8_t { kPosting, kCompleting, kNotifying, kDone, kFailed };

constexpr std::string_view to_string(BatchState s) {
  constexpr std::string_view kNames[] = {"posting", "completing", "notifying", "done", "failed"};
  return kNames[static_cast<unsigned>(s)];
}

// kFree: in the pool. kPending: posted, and not yet reported done to the user. kReleased:
// reported done while the provider still held operations of it (the peer is gone, and they may
// never complete): its handle names nothing, and the record stays out of the pool until the
// provider hands them back, if ever.
enum class RecordState : std::uint8_t { kFree, kPending, kReleased };

// kFree, kPending, kReleased.
constexpr std::string_view to_string(RecordState s) {
  constexpr std::string_view kNames[] = {"free", "pending", "released"};
  return kNames[static_cast<unsigned>(s)];
}

// Debug builds log every state change at trace level, as rxm's RXM_UPDATE_STATE does, and record
// its edge (state_edges.hpp); release builds keep even the level check off the message path.
template <typename State>
void trace_transition([[maybe_unused]] const char* machine, [[maybe_unused]] std::uint32_t seq,
                      [[maybe_unused]] State from, [[maybe_unused]] State to) noexcept {
#ifndef NDEBUG
  util::log().trace("{} {}: {} -> {}", machine, seq, to_string(from), to_string(to));
#endif
}

struct Part {
  std::byte* data = nullptr;
  std::size_t size = 0;  // buffer size (receives) or message size (sends)
  Tag tag = 0;
  std::uint32_t region = 0;  // with `registration`: the communicator's slot it came from
  const ofi::MemoryRegistration* registration = nullptr;
  std::uint32_t seq = 0;
  // The sequence number the peer knows this part's other end by (p2p/group.hpp). Sends: the
  // receiver's buffer the message was placed into; its own seq until then. Receives: the
  // message that came ahead into this buffer; the buffer's own seq otherwise.
  std::uint32_t peer_seq = 0;
  std::size_t delivered = 0;
  Status status = Status::kOk;
  SendState send = SendState::kAwaitingClearance;  // sends
  RecvState recv = RecvState::kAwaitingPost;       // receives and flushes
  std::uint8_t writes_expected = 0;
  std::uint8_t writes_seen = 0;
  // A message sent ahead in several eager fragments (eager.cpp): how many it has (the
  // receiver's, from the first to arrive), the sender's count of those that left, and the
  // receiver's of those that arrived (bit i: fragment i).
  std::uint8_t fragments = 0;
  std::uint8_t fragments_sent = 0;
  std::uint8_t fragments_arrived = 0;

  void to(SendState next) noexcept {
    assert(legal(send, next) && "illegal send state transition");
    trace_transition("send", seq, send, next);
    record_edge(send, next);
    send = next;
  }
  void to(RecvState next) noexcept {
    assert(legal(recv, next) && "illegal receive state transition");
    trace_transition("receive", seq, recv, next);
    record_edge(recv, next);
    recv = next;
  }
};

struct Request final : ofi::CompletionHandler {
  Comm* comm = nullptr;
  std::uint32_t generation = 0;  // new at every post: what the user's handle must match
  std::uint8_t index = 0;        // its place in the communicator's pool (the handle names it)
  RequestKind kind = RequestKind::kSend;
  RecordState record = RecordState::kFree;
  bool backpressured = false;  // in the communicator's retry list
  std::uint8_t part_count = 0;
  BatchState batch = BatchState::kPosting;  // kWrite and kRead
  // Provider operations of the request not completed yet (a batch's: up to kMaxRmaOpsInFlight).
  std::uint16_t ops_outstanding = 0;
  Status status = Status::kOk;
  // Sends: the writes that carry a rendezvous message, and its ready-to-send.
  std::uint8_t stripes = 0;
  std::uint8_t stripes_posted = 0;  // writes carrying CQ data posted (bits: `written`)
  std::uint8_t stripes_done = 0;
  // Bit i for stripe i: its write with the CQ data is posted; and where the provider paces
  // long writes by the peer (Profile::peer_paced_above), its body is posted, and completed.
  std::uint8_t written = 0;
  std::uint8_t bodies = 0;
  std::uint8_t bodies_done = 0;
  ReadyToSendState ready_to_send = ReadyToSendState::kNotNeeded;  // sends: see part_state.hpp
  // Grouped receives (p2p/group.hpp): how many of the group's messages that came ahead were
  // placed, and the buffers they took.
  std::uint8_t placed_ahead = 0;
  GroupTaken taken_ahead = 0;
  std::array<Part, kMaxParts> parts;
  std::array<ofi::OpContext, kMaxOps> ops;
  std::string error;  // why status is not kOk (allocates only on errors)

  void to(ReadyToSendState next) noexcept {
    assert(legal(ready_to_send, next) && "illegal ready-to-send transition");
    trace_transition("ready-to-send", parts[0].seq, ready_to_send, next);
    record_edge(ready_to_send, next);
    ready_to_send = next;
  }
  // The message still owes the receiver its ready-to-send.
  [[nodiscard]] bool owes_ready_to_send() const noexcept {
    return ready_to_send == ReadyToSendState::kWanted ||
           ready_to_send == ReadyToSendState::kBatched;
  }
  // Posted and not back in the pool: pending, or released with operations still out.
  [[nodiscard]] bool in_use() const noexcept { return record != RecordState::kFree; }
  void on_completion(ofi::OpContext& op, const ofi::Completion& completion) override;
  [[nodiscard]] std::size_t op_index(const ofi::OpContext& op) const noexcept {
    return static_cast<std::size_t>(&op - ops.data());
  }
  // Records the first failure; later ones keep the first reason.
  void fail(Status why, std::string text) {
    if (status == Status::kOk) {
      status = why;
      error = std::move(text);
    }
  }
  [[nodiscard]] bool is_batch() const noexcept {
    return kind == RequestKind::kWrite || kind == RequestKind::kRead;
  }
  void to(BatchState next) noexcept {
    trace_transition("batch", generation, batch, next);
    batch = next;
  }
  // Every part reached kDone or kFailed (a batch: it did).
  [[nodiscard]] bool decided() const noexcept {
    if (is_batch()) [[unlikely]]
      return batch == BatchState::kDone || batch == BatchState::kFailed;
    for (std::size_t i = 0; i < part_count; ++i) {
      if (kind == RequestKind::kSend ? !terminal(parts[i].send) : !terminal(parts[i].recv))
        return false;
    }
    return true;
  }
};

// The requests of one kind in use, out of all a pool built (RequestPool::in_use).
template <typename R>
class InUse {
 public:
  class Iterator {
   public:
    Iterator(R* at, R* end, RequestKind kind) noexcept : at_(at), end_(end), kind_(kind) { skip(); }
    R& operator*() const noexcept { return *at_; }
    Iterator& operator++() noexcept {
      ++at_;
      skip();
      return *this;
    }
    bool operator==(const Iterator& other) const noexcept { return at_ == other.at_; }

   private:
    void skip() noexcept {
      while (at_ != end_ && !(at_->in_use() && at_->kind == kind_)) ++at_;
    }
    R* at_;
    R* end_;
    RequestKind kind_;
  };
  InUse(std::span<R> all, RequestKind kind) noexcept : all_(all), kind_(kind) {}
  [[nodiscard]] Iterator begin() const noexcept {
    return {all_.data(), all_.data() + all_.size(), kind_};
  }
  [[nodiscard]] Iterator end() const noexcept {
    return {all_.data() + all_.size(), all_.data() + all_.size(), kind_};
  }

 private:
  std::span<R> all_;
  RequestKind kind_;
};

// A communicator's requests. Their addresses never move (a request is the user's handle, and
// its provider operations carry contexts inside it): the vector's capacity is reserved once and
// never exceeded. Requests are built the first time they are needed, not with the
// communicator: a request is over a KiB, and most communicators keep far fewer than 128 in
// flight, so building them all would be most of a communicator's setup time. Freed requests
// are reused last-in first-out, so a communicator with a window of 8 touches 8.
class RequestPool {
 public:
  RequestPool(Comm* owner, std::size_t capacity) : owner_(owner), capacity_(capacity) {
    // Request::index is a byte.
    assert(capacity <= std::size_t{std::numeric_limits<decltype(Request::index)>::max()} + 1);
    requests_.reserve(capacity);
    free_.reserve(capacity);
  }
  RequestPool(const RequestPool&) = delete;
  RequestPool& operator=(const RequestPool&) = delete;

  // A free request (still kFree), or nullptr when all `capacity` are in use.
  Request* take() {
    if (!free_.empty()) [[likely]] {
      Request* r = free_.back();
      free_.pop_back();
      return r;
    }
    return build();
  }
  void give_back(Request& request) { free_.push_back(&request); }
  // Whether take() would give a request.
  [[nodiscard]] bool can_take() const noexcept { return !free_.empty() || built_ < capacity_; }
  // The request built `index`-th, or nullptr (any index may come in: it is the user's).
  [[nodiscard]] Request* at(std::uint32_t index) noexcept {
    return index < built_ ? &requests_[index] : nullptr;
  }
  [[nodiscard]] std::uint32_t index_of(const Request& request) const noexcept {
    return request.index;
  }
  // The requests of `kind` in use (pending, or released with operations out), to walk with
  // a range-for that takes or gives back none.
  [[nodiscard]] InUse<Request> in_use(RequestKind kind) noexcept { return {requests_, kind}; }
  [[nodiscard]] InUse<const Request> in_use(RequestKind kind) const noexcept {
    return {requests_, kind};
  }
  [[nodiscard]] bool all_free() const noexcept { return free_.size() == built_; }
  [[nodiscard]] std::size_t in_use_count() const noexcept { return built_ - free_.size(); }
  [[nodiscard]] std::span<Request> built() noexcept { return requests_; }
  [[nodiscard]] std::span<const Request> built() const noexcept { return requests_; }

 private:
  // A request not built before, or nullptr when all `capacity` are.
  [[gnu::noinline]] Request* build() {
    if (built_ == capacity_) return nullptr;
    Request& r = requests_.emplace_back();  // within the reserved capacity: nothing moves
    r.comm = owner_;
    r.index = static_cast<std::uint8_t>(built_++);
    for (auto& op : r.ops) op.handler = &r;
    return &r;
  }

  Comm* owner_;
  std::size_t capacity_;
  std::vector<Request> requests_;
  // requests_.size(), kept: a request is not a power of two in size, and the posts and tests
  // that ask would divide by it.
  std::uint32_t built_ = 0;
  std::vector<Request*> free_;
};

}  // namespace loom::p2p
