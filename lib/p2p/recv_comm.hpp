// The receiving side: posts each buffer up to the eager limit as an eager tagged receive and
// announces every buffer to the sender with a clear-to-send (size, tag, address and a key per
// data rail). Larger buffers are RDMA-write targets; so is a smaller one whose sender sends a
// ready-to-send for it instead (its eager receive is cancelled).
#pragma once

#include <optional>
#include <vector>

#include "p2p/comm.hpp"

namespace loom::p2p {

class RecvCommImpl final : public Comm {
 public:
  RecvCommImpl(std::shared_ptr<ContextCore> core, mux::Lane& lane);

  Status irecv(std::span<const RecvBuffer> buffers, Request*& request);
  Status iflush(std::span<const RecvBuffer> buffers, Request*& request);

  void on_op(Request& request, std::size_t index, const ofi::Completion& completion) override;
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_remote_write(mux::WriteImmediate immediate) override;

 private:
  struct Slot {
    Request* request = nullptr;
    std::uint8_t part = 0;
  };
  // A buffer in the clear-to-send batch.
  struct Announced {
    Request* request = nullptr;
    std::uint8_t part = 0;
  };

  void advance(Request& request) override;
  void cancel(Request& request) override;
  [[nodiscard]] CloseNotice close_notice() override;
  void fail_unfinished(const CloseNotice& notice, const std::string& why) override;
  void settle_after_close() override;
  [[nodiscard]] bool writes_may_arrive() const noexcept override;
  void flush_control() override;
  // Posts the eager receives not posted yet, lowest sequence first, until the provider pushes
  // back.
  void post_in_order();
  // False when the provider pushed back (the request is queued for retry).
  bool post_receive(Request& request, std::size_t index);
  // Adds the request's buffers whose receives are posted to the clear-to-send batch (flushing
  // first when it is full).
  void announce(Request& request);
  void on_ready_to_send(std::span<const std::byte> body);
  void apply_ready_to_send(Request& request, std::size_t index, const RtsEntry& rts);
  // The part waiting for `seq` (compared on `mask` bits), or nullptr if none is.
  Part* waiting_part(std::uint32_t seq, std::uint32_t mask, Request** owner, std::size_t* index);
  void finish_rendezvous(Part& part);
  // iflush: one read per data rail (see iflush), and the completion of one.
  void post_flush_reads(Request& request);
  void on_flush_read(Request& request, const ofi::Completion& completion);

  std::uint32_t next_seq_ = 0;
  std::uint32_t post_next_ = 0;     // the lowest sequence whose receive may still need posting
  std::vector<Slot> by_seq_;        // by seq % kSeqWindow
  ClearToSend batch_;               // entries not sent yet
  std::vector<Announced> batched_;  // the buffers they describe
  std::size_t batch_limit_ = 0;
  // Closing with announced buffers unfinished: the writes the sender says it posted towards
  // them, and those seen (before the close in the parts, after it here).
  bool awaiting_writes_ = false;
  std::optional<std::uint32_t> writes_posted_;
  std::uint32_t writes_seen_ = 0;
};

}  // namespace loom::p2p
