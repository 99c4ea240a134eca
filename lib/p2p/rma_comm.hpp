// One-sided connections, both ends (rma_comm.cpp): the initiator's batches of writes and reads,
// and the notification a write batch carries to its target. They join the context's lanes as
// communicators do (an initiator as a sending one, a target as a receiving one), so they add no
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

// What both ends share: the region notes (revocations and import queries, RegionNote), sent on
// control rail 0 in order, and held back under back-pressure until the lane's next progress.
//
// Revocation: a region's keys close only once every initiator that may hold them said it will
// write no more into it. Deregistering the region (LaneRegistry::drop_shared_region) asks each
// target on a lane that holds it to send kRevoke; its initiator refuses further blocks into the
// region, lets the blocks it already handed to the provider complete, and answers kRevoked.
// Importing asks the target whether the region is live (kRegionQuery), so a stale descriptor is
// refused at once. No provider then has to check keys (shm drops a write with a closed key
// without completing it; tcp breaks the connection).
class RmaComm : public Comm {
 public:
  using Comm::Comm;
  void on_deferred() override;

 protected:
  void send_note(MessageType type, const RegionNote& note);

 private:
  std::vector<std::pair<MessageType, RegionNote>> notes_out_;  // back-pressured, in order
};

class RmaInitiatorImpl final : public RmaComm, ofi::CompletionHandler {
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
    std::uint32_t block = 0;         // for error texts
    bool delivery_complete = false;  // a write that completes once it is in the target's memory
  };
  // A batch as posted, by its request's index in the pool.
  struct Batch {
    std::vector<Piece> pieces;
    std::size_t next = 0;             // the first piece not handed to the provider
    std::vector<std::uint32_t> held;  // the lane's region entries its blocks hold, one per block
    std::optional<Notify> notification;
    NotifyProtocol protocol = NotifyProtocol::kAfterCompletion;
    bool notified = false;  // its notification is sent
    std::uint32_t blocks = 0;
    std::uint64_t bytes = 0;
    // The target's regions it writes into or reads from, as the target names them.
    std::vector<ContextRegions::Name> targets;
  };
  struct Imported {
    RegionDescriptor descriptor;
    std::uint32_t generation = 0;
    bool live = false;
    bool revoked = false;  // the target deregistered the region
  };
  // A revocation the target asked for, answered once no block into the region is out.
  struct Revocation {
    std::uint32_t seq = 0;
    ContextRegions::Name region;
  };

  Batch& batch_of(const Request& r) noexcept { return batches_[requests_.index_of(r)]; }
  // Checks every block and plans its pieces; false with last_error_ set (nothing held).
  bool plan(Request& r, std::span<const RmaBlock> blocks);
  // Which of a write batch's pieces are posted FI_DELIVERY_COMPLETE (see the definition).
  void choose_delivery_waits(Batch& batch);
  // Hands the oldest batches' pieces to the provider while op contexts are free.
  void post_pending();
  // A batch all of whose pieces came back: done, failed, or its notification's turn.
  void settle(Request& r);
  // Sends the notifications whose turn came, in post order.
  void send_notifications();
  void answer_writes_posted();
  void on_revoke(const RegionNote& note);
  // Answers the revocations whose regions no block handed to the provider uses any more.
  void answer_revocations();
  [[nodiscard]] bool in_flight(ContextRegions::Name region) const noexcept;

  void advance(Request& request) override;
  void send_control_batch() override {}
  void fail_part(Request& /*request*/, Part& /*part*/, Status /*status*/) override {}
  void fail_batch(Request& request, Status status, const std::string& why) override;
  void release_batch(Request& request) noexcept override;
  [[nodiscard]] CloseNotice close_notice(CloseReason reason) override;
  void fail_unfinished(const CloseNotice& notice, Status status, const std::string& why) override;
  void settle_after_close() override;
  void send_writes_posted() override;

  std::vector<Batch> batches_;      // parallel to the request pool
  std::deque<Request*> posting_;    // batches with pieces not handed over, oldest first
  std::deque<Request*> notifying_;  // write batches with a notification, in post order
  std::vector<ofi::OpContext> ops_;
  std::vector<Request*> op_owner_;  // the batch of each op context in use
  std::vector<std::uint32_t> free_ops_;
  std::vector<Imported> imported_;
  std::vector<std::uint32_t> free_imported_;
  std::size_t next_rail_ = 0;        // whole blocks go round the data rails
  std::uint32_t next_notify_ = 0;    // the next notification's number
  std::uint32_t next_counter_ = 0;   // kCountedCqData: the next batch's CQ data counter
  bool writes_posted_owed_ = false;  // the target's close notice waits for our writes
  std::vector<Revocation> revocations_;
  std::uint32_t next_query_ = 0;
  std::optional<RegionNote> answer_;  // to the import's query in flight
  RmaStats rma_stats_;
};

class RmaTargetImpl final : public RmaComm {
 public:
  RmaTargetImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer);

  // Throws loom::Error.
  std::vector<std::byte> export_region(const MemoryRegion& region);
  std::optional<Notification> poll_notification();
  [[nodiscard]] RmaStats rma_stats() const;

  void on_op(Request& /*request*/, std::size_t /*index*/,
             const ofi::Completion& /*completion*/) override {}
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_remote_write(mux::WriteImmediate immediate) override;
  bool revoke_region(std::uint32_t slot, std::uint32_t generation) override;
  [[nodiscard]] bool revoking() override;

 private:
  void on_notify(std::span<const std::byte> body);
  void on_notify_cancel(std::span<const std::byte> body);
  // Hands out, in order, the notifications whose turn came.
  void release_in_order();
  void on_region_note(MessageType type, std::span<const std::byte> body);

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

  std::deque<Notification> ready_;  // landed, in post order, not polled yet
  // The data rails' provider may complete a write before it applied it here (shm): progress
  // once more before a notification is handed out (RmaInitiatorImpl::choose_delivery_waits).
  const bool progress_before_notifying_;
  // Complete, ahead of their turn (another control rail was faster); nullopt: cancelled.
  std::map<std::uint32_t, std::optional<Notify>> early_;
  // kCountedCqData: writes counted per counter, and the notifications waiting for their count.
  std::vector<std::uint32_t> counts_;
  std::map<std::uint32_t, Notify> counting_;  // by counter
  std::uint32_t next_expected_ = 0;
  std::uint32_t next_revoke_ = 0;
  std::vector<std::uint32_t> awaiting_revoked_;  // revocations sent, not answered yet
  bool awaiting_writes_ = false;  // closing: our close notice asked for the initiator's word
  bool writes_answered_ = false;  // and it came: its writes all completed
  RmaStats rma_stats_;
};

}  // namespace loom::p2p
