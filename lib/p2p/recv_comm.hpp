// The receiving communicator. Its protocol is spread over the files of each concern, next to
// the sender's half: clear_to_send.cpp (posting order, announcing buffers), eager.cpp,
// rendezvous.cpp (ready-to-send, remote writes), close.cpp; recv_comm.cpp holds irecv, iflush
// and the dispatch of events to those.
#pragma once

#include <optional>
#include <vector>

#include "p2p/comm.hpp"

namespace loom::p2p {

class RecvCommImpl final : public Comm {
 public:
  RecvCommImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer);

  Status irecv(std::span<const RecvBuffer> buffers, Request*& request);
  Status iflush(std::span<const RecvBuffer> buffers, Request*& request);

  void on_op(Request& request, std::size_t index, const ofi::Completion& completion) override;
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_remote_write(mux::WriteImmediate immediate) override;

 private:
  // One buffer of a request.
  struct PartRef {
    Request* request = nullptr;
    std::uint8_t part = 0;
  };

  void advance(Request& request) override;
  // A part leaves for kCancelling (its eager receive is taken back first) or kFailed.
  void fail_part(Request& request, Part& part, Status status) override;
  // iflush: one read per data rail (see iflush), and the completion of one.
  void post_flush_reads(Request& request);
  void on_flush_read(Request& request, const ofi::Completion& completion);

  // clear_to_send.cpp
  // Posts the eager receives not posted yet, lowest sequence first, until the provider pushes
  // back.
  void post_in_order();
  // Adds the request's parts in kToAnnounce to the clear-to-send batch (sending it first when
  // it is full).
  void announce(Request& request);
  void send_control_batch() override;  // the clear-to-sends
  // eager.cpp
  // False when the provider pushed back (the request is queued for retry).
  bool post_receive(Request& request, std::size_t index);
  void on_eager(Request& request, Part& part, const ofi::Completion& completion);
  // rendezvous.cpp
  void on_ready_to_send(std::span<const std::byte> body);
  void apply_ready_to_send(Request& request, std::size_t index, const RtsEntry& rts);
  void finish_rendezvous(Part& part);
  // The unfinished part for `seq` (compared on `mask` bits), or nullptr if none is.
  Part* waiting_part(std::uint32_t seq, std::uint32_t mask, Request** owner, std::size_t* index);
  // close.cpp
  [[nodiscard]] CloseNotice close_notice() override;
  void fail_unfinished(const CloseNotice& notice, const std::string& why) override;
  void settle_after_close() override;
  [[nodiscard]] bool writes_may_arrive() const noexcept override;
  void on_writes_posted(std::span<const std::byte> body);

  std::uint32_t next_seq_ = 0;
  std::uint32_t post_next_ = 0;   // the lowest sequence whose receive may still need posting
  std::vector<PartRef> by_seq_;   // by seq % kSeqWindow
  ClearToSend batch_;             // entries not sent yet
  std::vector<PartRef> batched_;  // the buffers they describe
  std::size_t batch_limit_ = 0;
  std::size_t receives_held_ = 0;  // eager receives posted (the lane limits each comm's share)
  // Closing with announced buffers unfinished: the writes the sender says it posted towards
  // them, and those seen (before the close in the parts, after it here).
  bool awaiting_writes_ = false;
  std::optional<std::uint32_t> writes_posted_;
  std::uint32_t writes_seen_ = 0;
};

}  // namespace loom::p2p
