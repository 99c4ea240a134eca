// The sending communicator. Its protocol is spread over the files of each concern, next to the
// receiver's half: clear_to_send.cpp (matching a message to the buffer announced for it),
// eager.cpp, rendezvous.cpp (writes and ready-to-send), close.cpp; send_comm.cpp holds isend
// and the dispatch of events to those.
#pragma once

#include <array>
#include <vector>

#include "mux/carried_control.hpp"
#include "p2p/comm.hpp"
#include "p2p/seq_ring.hpp"
#include "p2p/verdict.hpp"

namespace loom::p2p {

class SendCommImpl final : public Comm {
 public:
  SendCommImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer);

  // `handle` names the request, or is a done_at_post handle where the send finished in the call.
  Status isend(const void* data, std::size_t size, Tag tag, const MemoryRegion& region,
               loom::Request& handle);

  void on_op(Request& request, std::size_t index, const ofi::Completion& completion) override;
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_remote_write(mux::WriteImmediate immediate) override;

 private:
  // What the receiver announced about the buffer posted for one sequence number (its
  // clear-to-send entry), once it came.
  struct Clearance {
    bool valid = false;
    bool taken = false;  // a message was placed into the buffer (p2p/group.hpp)
    Announcement announcement;
    std::uint64_t address = 0;
  };

  // By sequence number: the send posted with it (until it finished) and its buffer's
  // announcement, with the buffer's remote key on each of the lane's data rails as extras.
  // A message sent ahead keeps its tag here: it may finish before its group is announced, and
  // the sender still places it then, as the receiver did (p2p/group.hpp).
  enum class Ahead : std::uint8_t { kNo, kUnplaced, kPlaced };
  struct Outgoing {
    Request* send = nullptr;
    Clearance clearance;
    Ahead ahead = Ahead::kNo;
    Tag tag = 0;  // kUnplaced: the message's
  };

  // The buffer announced for sequence number `seq`, or the slot's other entry (compare .seq).
  [[nodiscard]] Clearance& announcement(std::uint32_t seq) noexcept {
    return outgoing_.slot(seq).entry.clearance;
  }
  [[nodiscard]] const Clearance& announcement(std::uint32_t seq) const noexcept {
    return outgoing_.slot(seq).entry.clearance;
  }
  // The send posted with `seq` while it is in flight, else another request or nullptr.
  [[nodiscard]] Request* posted(std::uint32_t seq) noexcept {
    return outgoing_.slot(seq).entry.send;
  }
  Outgoing& claim_outgoing(std::uint32_t seq);
  // The oldest sequence number an entry of outgoing_ may still be read for: a send in flight
  // reads its group's announcements (at most kMaxParts - 1 before its own), a close notice the
  // buffers of groups not fully taken.
  [[nodiscard]] std::uint32_t in_flight_floor() const noexcept;

  [[gnu::cold]] Status refuse_size(std::size_t size);
  void advance(Request& request) override;
  // A part of `request` leaves for kFailed or kFailing (what it owes drains first).
  void fail_part(Request& request, Part& part, Status status) override;
  // Moves a part whose last event arrived to kDone or kFailed.
  void settle(Request& request);

  // clear_to_send.cpp
  void on_clear_to_send(std::span<const std::byte> body);
  // Whether every buffer of the group the buffer announced for `seq` belongs to is announced.
  [[nodiscard]] bool group_known(std::uint32_t seq) const noexcept;
  void settle_group(std::uint32_t seq);
  // The buffer of its group message `seq` with `tag` goes into (its sequence number).
  std::uint32_t place(std::uint32_t seq, Tag tag);
  void match(Request& request);
  // Asks the receiver to announce the buffers of messages waiting for their clear-to-send that
  // no ask covers yet (the receiver leaves buffers an eager message can fill unannounced).
  void ask_for_clearances();
  bool awaiting_clearance(std::uint32_t& oldest) const noexcept override;
  // Whether a message waiting for its clearance is asked for as soon as it waits. The receiver
  // leaves only buffers a message sent ahead can fill quiet (may_stay_quiet: within its eager
  // size, or as many of them as LOOM_EAGER_FRAGMENTS), and announces the others when they are
  // posted: a larger message meets a quiet buffer only where it does not fit, a refusal the
  // periodic check asks for (settle_late_clearances). An ask the receiver did not need costs a
  // stream of rendezvous sends on tcp;ofi_rxm a quarter of its bandwidth.
  [[nodiscard]] bool asks_promptly(const Part& part) const noexcept {
    return eager_size_ == 0 || part.size <= eager_size_ * eager_fragments_ ||
           ask_scope_ == AskScope::kEveryMessage;
  }
  void settle_late_clearances() override;
  // The messages waiting for their clearance that no ask covers yet: the oldest of them
  // (next_seq_ when none), whether there is one, and whether one asks promptly.
  struct Unasked {
    std::uint32_t oldest = 0;
    bool any = false;
    bool prompt = false;
  };
  [[nodiscard]] Unasked unasked_waiting() const noexcept;
  // eager.cpp
  // Whether a message may use a credit: up to the receiver's eager size (0 until its first
  // grant) and our own eager limit (eager_max_: never above the provider's max_msg_size).
  [[nodiscard]] bool eager_fits(std::size_t size) const noexcept {
    return size <= eager_size_ && size <= eager_max_;
  }
  [[nodiscard]] bool injects(std::size_t size,
                             const ofi::MemoryRegistration* registration) const noexcept;
  // The eager messages a message of `size` goes ahead in: 1 where it fits a credit, more where it
  // fits that many (LOOM_EAGER_FRAGMENTS, each injected: from host memory, within the inject
  // size), 0 where it cannot go ahead.
  [[nodiscard]] std::size_t fragments_for(
      std::size_t size, const ofi::MemoryRegistration* registration) const noexcept {
    if (eager_fits(size)) [[likely]]
      return 1;
    if (eager_fragments_ < 2 || eager_size_ == 0 || eager_size_ > eager_max_ ||
        !injects(eager_size_, registration)) {
      return 0;
    }
    const std::size_t count = eager_buffers(size, eager_size_);
    return count <= eager_fragments_ ? count : 0;
  }
  // Whether the message goes ahead now, on the credits we hold (one partly sent already has its).
  [[nodiscard]] bool goes_ahead(const Part& part) const noexcept {
    if (part.fragments_sent != 0) [[unlikely]]
      return true;
    const std::size_t count = fragments_for(part.size, part.registration);
    return count != 0 && credits_ >= count;
  }
  void post_eager(Request& request);
  // A message sent ahead in several eager fragments, from the one it stopped at (back-pressure).
  void post_fragments(Request& request);
  Status inject_eager(const Part& part, std::uint32_t wire_seq, bool placed);
  // Message `seq` leaves now, with no request, where post_eager would inject it at once (with
  // its carrier, if one rides along): next in line, on a credit, from host memory. Its entry in
  // outgoing_, claimed before it left; nullptr: it did not leave (another case, or the provider
  // refused), and isend posts it the general way.
  Outgoing* inject_first(const void* data, std::size_t size, Tag tag,
                         const ofi::MemoryRegistration* registration, std::uint32_t seq);
  // What a message sent ahead on a credit leaves behind once it is out (`outgoing`: its entry).
  void note_sent_ahead(Outgoing* outgoing, Tag tag);
  // The carrier built for an inject in the lane's carrier buffer: its length (0: none).
  std::size_t fill_carrier(const Part& part);
  void send_ahead_waiting();
  // rendezvous.cpp
  void queue_ready_to_send(Request& request);
  void send_control_batch() override;  // the asks for clearance and the ready-to-sends
  void post_stripes(Request& request);
  // A stripe's post failed: retried after progress (kRetry), else the send fails (break_off).
  void break_or_retry(Request& request, ofi::Rail& rail, Status status);
  [[nodiscard]] std::uint8_t stripe_count(std::size_t size) const noexcept;
  [[gnu::cold]] void fail_send(Request& request, const ofi::Completion& completion);
  // close.cpp
  [[nodiscard]] CloseNotice close_notice(CloseReason reason) override;
  void fail_unfinished(const CloseNotice& notice, Status status, const std::string& why) override;
  void settle_after_close() override;
  void send_writes_posted() override;

  std::uint32_t next_seq_ = 0;
  std::uint32_t ahead_next_ = 0;  // the oldest message that may be waiting for a credit
  std::size_t credits_ = 0;       // eager buffers the receiver has posted for us
  std::size_t eager_size_ = 0;    // their size (0 until the first grant)
  std::size_t min_stripe_;
  const std::size_t max_size_;  // the largest message isend takes (max_message_size of the rails')
  SeqRing<Outgoing, kSeqWindow> outgoing_;
  // Below this sequence number no entry is used any more (see in_flight_floor).
  std::uint32_t floor_ = 0u - static_cast<std::uint32_t>(kMaxParts - 1);
  std::uint32_t asked_until_ = 0;  // messages before it are covered by an AskClearance sent
  // kArmed: armed_seq_ was the oldest message waiting unasked at a deferred run, when the lane
  // had read its control queues armed_reads_ times (ask_for_clearances).
  enum class AskState : std::uint8_t { kNone, kArmed };
  AskState ask_ = AskState::kNone;
  std::uint32_t armed_seq_ = 0;
  std::uint64_t armed_reads_ = 0;
  // The messages whose waiting makes an ask (asks_promptly): those within the receiver's eager
  // size; every one from the second periodic check in a row that found the same message
  // waiting (late_seq_; the first leaves kLateSeen) until the next ask.
  enum class AskScope : std::uint8_t { kWithinEagerSize, kLateSeen, kEveryMessage };
  AskScope ask_scope_ = AskScope::kWithinEagerSize;
  std::uint32_t late_seq_ = 0;
  std::uint32_t writes_posted_ = 0;  // every write posted (the close notice says it)
  ReadyToSend batch_;                // ready-to-sends not sent yet
  std::vector<Request*> batched_;    // the requests they belong to
  // Carried control (eager.cpp, fill_carrier; the message is built in the lane's carrier
  // buffer): a control message taken from a receiving communicator that no inject has
  // carried yet.
  std::array<std::byte, mux::kMaxCarriedControl> held_control_{};
  std::size_t carried_length_ = 0;
  std::uint64_t carried_lane_ = 0;
};

}  // namespace loom::p2p
