// The eager buffers of a lane, shared by all its receiving communicators whatever their peers.
// A message a sender sends ahead on a credit lands in any of them (the receives match every
// comm id); the tag's comm id says whose it is, the lane hands it to that communicator, which
// holds the buffer until the receive for the message is posted and then gives it back. A
// lane's eager memory is then this pool's, fixed, not a set of buffers per communicator that
// grows with the peers; and only the buffers promises need are posted (see idle_).
//
// Credits are promises of posted buffers: never more outstanding than buffers posted, so every
// message sent ahead finds one and none waits in the provider's bounded unexpected-message
// pool (where messages for posted receives would queue behind it). A communicator holds at most
// its fair share of them (the pool over the lane's communicators, at least kMinShare): an idle
// or dead peer ties up no more. A closing communicator's unspent credits stay promised until
// LOOM_PEER_TIMEOUT_MS after its close, since messages its sender sent on them may still come.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "loom/error.hpp"
#include "mux/routing.hpp"
#include "ofi/completion.hpp"

namespace loom::ofi {
class MemoryRegistration;
class RailSet;
}  // namespace loom::ofi

namespace loom::mux {

// A message that landed in one of the pool's buffers (or a receive that failed).
struct EagerArrival {
  std::uint32_t buffer = 0;  // for EagerPool::data and release
  Status status = Status::kOk;
  std::size_t length = 0;    // bytes received
  std::size_t overflow = 0;  // kTruncated: bytes beyond the buffer
  DataTag tag{};             // whose (comm id), which message (low sequence bits), carrier bit
  bool has_data = false;     // remote CQ data: the user's tag
  std::uint64_t data = 0;
  std::string_view error_text;
};

class EagerArrivalSink {
 public:
  // Who `arrival` is for decides what happens to its buffer; it must release() it. Returns
  // whether a communicator still attached took it (else a closed one's credit was spent).
  virtual bool on_eager_arrival(const EagerArrival& arrival) = 0;

 protected:
  ~EagerArrivalSink() = default;
};

class EagerPool final : ofi::CompletionHandler {
 public:
  // Credits a communicator may hold whatever the share.
  static constexpr std::size_t kMinShare = 4;

  // `count` buffers of `buffer_size` bytes, registered once on `rails` (bound to its
  // endpoints under FI_MR_ENDPOINT) and posted on data rail 0. Throws loom::Error.
  EagerPool(ofi::RailSet& rails, std::size_t count, std::size_t buffer_size, EagerArrivalSink& sink,
            std::chrono::milliseconds promise_timeout);
  // Cancels what is posted; the endpoints close after (the lane's declaration order).
  ~EagerPool();
  EagerPool(const EagerPool&) = delete;
  EagerPool& operator=(const EagerPool&) = delete;

  [[nodiscard]] std::size_t buffer_size() const noexcept { return buffer_size_; }
  [[nodiscard]] std::size_t count() const noexcept { return slots_.size(); }
  [[nodiscard]] const std::byte* data(std::uint32_t buffer) const noexcept {
    return memory_.get() + std::size_t{buffer} * buffer_size_;
  }
  // The communicator is done with the buffer: back in the pool at retry(), which the lane runs
  // at its next progress before reading its CQs. Not now: the release comes while a message is
  // handed to its receive, and a repost there (a provider call, shm's queue lock) would delay
  // every message's delivery to the user, and so the reply it waits to send.
  void release(std::uint32_t buffer) { reposts_.push_back(buffer); }

  // Up to `wanted` new credits for a communicator that holds `held` (promised, not spent)
  // while `comms` communicators share the lane: within the communicator's share and the
  // buffers not promised, idle ones posted for it now (fewer where the provider refuses).
  [[nodiscard]] std::size_t promise(std::size_t wanted, std::size_t held,
                                    std::size_t comms) noexcept;
  // A closing communicator's unspent credits: promised until the timeout, since its sender may
  // have sent on them.
  void forget(std::size_t credits);
  // Takes back what was released (posted again where promises lack buffers, else idle), posts
  // what the provider refused, and frees the promises whose time is up; returns whether buffers
  // came back (credits may be promised again). Inline: every progress of the lane asks, and
  // mostly there is nothing.
  [[nodiscard]] bool retry() { return (!reposts_.empty() || !forgotten_.empty()) && take_back(); }

  [[nodiscard]] std::size_t posted() const noexcept { return posted_; }
  [[nodiscard]] std::size_t promised() const noexcept { return promised_; }
  // Buffers a promise may take now: posted and not promised, or idle.
  [[nodiscard]] std::size_t unpromised() const noexcept {
    return (posted_ > promised_ ? posted_ - promised_ : 0) + idle_.size();
  }

 private:
  struct Slot {
    ofi::OpContext op;  // first: the completion hands back &op
    bool posted = false;
  };
  struct Forgotten {
    std::size_t credits;
    std::chrono::steady_clock::time_point until;
  };

  void on_completion(ofi::OpContext& op, const ofi::Completion& completion) override;
  bool post(std::uint32_t buffer);
  bool take_back();  // retry()'s work
  [[nodiscard]] std::uint32_t index_of(const ofi::OpContext& op) const noexcept {
    return static_cast<std::uint32_t>(reinterpret_cast<const Slot*>(&op) - slots_.data());
  }

  ofi::RailSet* rails_;
  EagerArrivalSink* sink_;
  std::size_t buffer_size_;
  std::chrono::milliseconds promise_timeout_;
  std::unique_ptr<std::byte[]> memory_;  // not initialized: a page is touched by what lands
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> reposts_;  // released, or refused by the provider: seen at retry()
  // Neither posted nor held: a stack, so that the buffers posted for new promises are the ones
  // used last, still in cache. Posting every buffer would make each message land in the
  // least recently used one (providers match posted receives in order): a ring of the whole
  // pool (768 KiB on shm) through the cache instead of about one communicator's credits.
  std::vector<std::uint32_t> idle_;
  std::size_t posted_ = 0;
  std::size_t promised_ = 0;
  std::size_t most_promised_ = 0;  // the most promised_ has been: what stays posted
  std::vector<Forgotten> forgotten_;
  // Declared last, closed first: bound to the endpoints under FI_MR_ENDPOINT.
  ofi::MemoryRegistration* registration_ = nullptr;
};

}  // namespace loom::mux
