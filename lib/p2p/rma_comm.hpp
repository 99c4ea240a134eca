// One-sided connections, both ends (rma_comm.cpp): the initiator's batches of writes and reads,
// and the notification a write batch carries to its target. They join the context's lanes as
// communicators do (initiator on a send lane, target on a receive lane), so they add no
// endpoints, and share the communicators' liveness, close notices and request handles.
//
// The notification rule: every write goes with FI_DELIVERY_COMPLETE, so its completion means its
// bytes are in the target's memory; a batch's notification is a control message sent only once
// every write of the batch completed, numbered per connection so that the target hands them out
// in post order whichever control rail each came by. No remote CQ data: the target spends no
// completion per block, and providers without write-after-write ordering keep the rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "loom/rma.hpp"
#include "p2p/comm.hpp"
#include "p2p/rma_descriptor.hpp"

namespace loom::p2p {

class RmaInitiatorImpl final : public Comm, ofi::CompletionHandler {
 public:
  RmaInitiatorImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer);

  // Throws loom::Error naming what is wrong with the descriptor.
  loom::RemoteRegion import_region(std::span<const std::byte> bytes);
  void forget(const loom::RemoteRegion& region);
  // RequestKind kWrite or kRead; see loom::RmaInitiator::write.
  Status post(RequestKind kind, std::span<const RmaBlock> blocks,
              const std::optional<Notification>& notification, Request*& request,
              NotifyProtocol protocol);
  [[nodiscard]] RmaStats rma_stats() const;

  void on_op(Request& /*request*/, std::size_t /*index*/,
             const ofi::Completion& /*completion*/) override {}
  void on_completion(ofi::OpContext& op, const ofi::Completion& completion) override;
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_remote_write(mux::WriteImmediate /*immediate*/) override {}
  void on_deferred() override;

 private:
  // One provider operation: a whole block, or a piece of one too long for one transfer or
  // striped over the data rails.
  struct Piece {
    std::byte* local = nullptr;
    void* desc = nullptr;  // the local registration's descriptor on `rail`
    std::uint64_t remote_address = 0;
    std::uint64_t key = 0;
    std::size_t length = 0;
    std::uint32_t rail = 0;
    std::uint32_t block = 0;  // for error texts
  };
  // A batch as posted, by its request's index in the pool.
  struct Batch {
    std::vector<Piece> pieces;
    std::size_t next = 0;  // the first piece not handed to the provider
    std::vector<std::uint32_t> held;  // the lane's region entries its blocks hold, one per block
    std::optional<Notify> notification;
    std::uint32_t blocks = 0;
    std::uint64_t bytes = 0;
  };
  struct Imported {
    RegionDescriptor descriptor;
    std::uint32_t generation = 0;
    bool live = false;
  };

  Batch& batch_of(const Request& r) noexcept { return batches_[requests_.index_of(r)]; }
  // Checks every block and plans its pieces; false with last_error_ set (nothing held).
  bool plan(Request& r, std::span<const RmaBlock> blocks);
  // Hands the oldest batches' pieces to the provider while op contexts are free.
  void post_pending();
  // A batch all of whose pieces came back: done, failed, or its notification's turn.
  void settle(Request& r);
  // Sends the notifications whose turn came, in post order.
  void send_notifications();
  void answer_writes_posted();

  void advance(Request& request) override;
  void send_control_batch() override {}
  void fail_part(Request& /*request*/, Part& /*part*/, Status /*status*/) override {}
  void fail_batch(Request& request, Status status, const std::string& why) override;
  void release_batch(Request& request) noexcept override;
  [[nodiscard]] CloseNotice close_notice(CloseReason reason) override;
  void fail_unfinished(const CloseNotice& notice, Status status, const std::string& why) override;
  void settle_after_close() override;
  void send_writes_posted() override;

  std::vector<Batch> batches_;     // parallel to the request pool
  std::deque<Request*> posting_;   // batches with pieces not handed over, oldest first
  std::deque<Request*> notifying_;  // write batches with a notification, in post order
  std::vector<ofi::OpContext> ops_;
  std::vector<Request*> op_owner_;   // the batch of each op context in use
  std::vector<std::uint32_t> free_ops_;
  std::vector<Imported> imported_;
  std::vector<std::uint32_t> free_imported_;
  std::size_t next_rail_ = 0;      // whole blocks go round the data rails
  std::uint32_t next_notify_ = 0;  // the next notification's number
  bool writes_posted_owed_ = false;  // the target's close notice waits for our writes
  RmaStats rma_stats_;
};

class RmaTargetImpl final : public Comm {
 public:
  RmaTargetImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer);

  // Throws loom::Error.
  std::vector<std::byte> export_region(const MemoryRegion& region);
  std::optional<Notification> poll_notification();
  [[nodiscard]] RmaStats rma_stats() const;

  void on_op(Request& /*request*/, std::size_t /*index*/,
             const ofi::Completion& /*completion*/) override {}
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_remote_write(mux::WriteImmediate /*immediate*/) override {}

 private:
  void on_notify(std::span<const std::byte> body);

  void advance(Request& /*request*/) override {}
  void send_control_batch() override {}
  void fail_part(Request& /*request*/, Part& /*part*/, Status /*status*/) override {}
  [[nodiscard]] CloseNotice close_notice(CloseReason reason) override;
  void fail_unfinished(const CloseNotice& /*notice*/, Status /*status*/,
                       const std::string& /*why*/) override {}
  void settle_after_close() override {}
  // Closing: the initiator's writes may still be arriving until it answered our close notice
  // (it answers once they all completed), or closed itself (its close notice says they did).
  [[nodiscard]] bool writes_may_arrive() const noexcept override {
    return awaiting_writes_ && !writes_answered_ && peer_ == PeerState::kConnected;
  }

  std::deque<Notification> ready_;          // landed, in post order, not polled yet
  std::map<std::uint32_t, Notify> early_;  // came by another control rail ahead of their turn
  std::uint32_t next_expected_ = 0;
  bool awaiting_writes_ = false;  // closing: our close notice asked for the initiator's word
  bool writes_answered_ = false;  // and it came: its writes all completed
  RmaStats rma_stats_;
};

}  // namespace loom::p2p
