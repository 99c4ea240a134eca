// The receiving communicator. Its protocol is spread over the files of each concern, next to
// the sender's half: clear_to_send.cpp (posting order, announcing buffers), eager.cpp,
// rendezvous.cpp (ready-to-send, remote writes), close.cpp; recv_comm.cpp holds irecv, iflush
// and the dispatch of events to those.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "p2p/comm.hpp"
#include "p2p/seq_ring.hpp"
#include "p2p/verdict.hpp"

namespace loom::p2p {

class RecvCommImpl final : public Comm {
 public:
  RecvCommImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer);
  ~RecvCommImpl() override;
  RecvCommImpl(const RecvCommImpl&) = delete;
  RecvCommImpl& operator=(const RecvCommImpl&) = delete;

  Status irecv(std::span<const RecvBuffer> buffers, Request*& request);
  Status iflush(std::span<const RecvBuffer> buffers, Request*& request);

  void on_op(Request& request, std::size_t index, const ofi::Completion& completion) override;
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_remote_write(mux::WriteImmediate immediate) override;
  std::size_t take_carried_control(std::span<std::byte> out, std::uint64_t& target_lane) override;

 private:
  // One buffer of a request.
  struct PartRef {
    Request* request = nullptr;
    std::uint8_t part = 0;
  };

  // What each buffer's announcement said, kept for repeat_clearances: the
  // buffer's request may be finished and reused by then.
  // What this side announced for the buffer posted with one sequence number, once it did.
  struct Announced {
    bool valid = false;
    Announcement announcement;
  };
  // By sequence number: the receive part posted with it, and its announcement.
  struct Posted {
    PartRef part;
    Announced announced;
  };

  // The part posted with `seq` (validate it: the slot may hold another number's).
  [[nodiscard]] const PartRef& part_ref(std::uint32_t seq) const noexcept {
    return posted_.slot(seq).entry.part;
  }
  Posted& claim_posted(std::uint32_t seq);

  void advance(Request& request) override;
  // A part leaves for kFailed (kArrived: for the outcome it has).
  void fail_part(Request& request, Part& part, Status status) override;
  void on_peer_connected() override;
  void cancel_standing() override;
  // iflush: one read per data rail (see iflush), and the completion of one.
  void post_flush_reads(Request& request);
  void on_flush_read(Request& request, const ofi::Completion& completion);

  // clear_to_send.cpp
  // Adds the request's parts in kToAnnounce to the clear-to-send batch (sending it first when
  // it is full).
  void announce(Request& request);
  void send_control_batch() override;  // the clear-to-sends and the credits granted
  std::size_t encode_batch(std::span<std::byte> out);
  void batch_left(Status status);
  void repeat_clearances(std::uint32_t from) override;
  // Whether the part may wait unannounced (kQuiet) for a message sent ahead: the request's only
  // one, and the sender's credits cover it (buffers beyond them are announced: their messages
  // could not come ahead, and would ask for it, as a window of small receives deeper than the
  // credits would).
  [[nodiscard]] bool may_stay_quiet(const Request& r, const Part& part) const noexcept {
    return r.part_count == 1 && pool_ != nullptr && part.size <= eager_size_ * eager_fragments_ &&
           part.status == Status::kOk && quiet_credits_ + credits_for(part.size) <= credits_out_ &&
           !seq_before(part.seq, asked_until_);
  }
  // The credits a message filling `size` bytes takes when it comes ahead.
  [[nodiscard]] std::size_t credits_for(std::size_t size) const noexcept {
    return eager_buffers(size, eager_size_);
  }
  // A part leaves kQuiet (its message came, its sender asked, or it failed).
  void leave_quiet(const Part& part) noexcept { quiet_credits_ -= credits_for(part.size); }
  // A newly posted one-part request that may stay quiet does (delivered at once if its message
  // came ahead); false for any other, which announce_posted() takes.
  bool stay_quiet(Request& r) {
    Part& part = r.parts[0];
    if (!may_stay_quiet(r, part)) return false;
    part.to(RecvState::kQuiet);
    // The first quiet part since none was (a ping-pong's every receive) starts the floor; one
    // posted behind others looks at their age.
    const bool first = quiet_credits_ == 0;
    quiet_credits_ += credits_for(part.size);
    if (first) {
      quiet_floor_ = part.seq;
    } else {
      check_quiet_age();
    }
    if (!held_.empty()) deliver_held(r, part);
    return true;
  }
  // The posted parts not quiet are announced (at once where the sender can do nothing before).
  void announce_posted(Request& r);
  void on_ask_clearance(std::span<const std::byte> body);
  // Announces the quiet parts posted with [from, until).
  void announce_quiet(std::uint32_t from, std::uint32_t until);
  // One quiet part leaves kQuiet to be announced (announce_quiet, announce_aging_quiet).
  void announce_quiet_part(Request& r, Part& part);
  // A quiet part half a sequence window behind the newest receive is announced: its number
  // must not leave the window its entry lives in (posted_) unsettled. Looked at by each receive
  // posted while quiet parts exist (stay_quiet, announce_posted).
  void check_quiet_age() {
    if (quiet_credits_ != 0 && next_seq_ - quiet_floor_ > kQuietAgeLimit) [[unlikely]]
      announce_aging_quiet();
  }
  void announce_aging_quiet();
  void settle_late_clearances() override;
  // eager.cpp: a message sent ahead, in one of the lane's pool buffers until its irecv.
  struct Held {
    std::uint32_t buffer = 0;
    std::uint32_t seq = 0;
    std::uint32_t length = 0;
    bool has_tag = false;  // the message carried CQ data (its tag)
    Tag tag = 0;
    bool placed = false;        // `seq` names the buffer the sender placed it in (mux::DataTag)
    std::uint8_t fragment = 0;  // of a message sent in several (mux::DataTag)
    std::uint8_t fragments = 1;
  };
  void on_eager(const mux::EagerArrival& arrival) override;
  void promise_credits();
  void deliver_held(Request& request, Part& part);
  // The grouped receive a message that came ahead with sequence number `message` belongs to.
  [[nodiscard]] Request* group_of(std::uint32_t message) const noexcept;
  void place_ahead(Request& request);
  void deliver(Request& request, Part& part, const Held& held);
  void deliver_fragment(Request& request, Part& part, const Held& held);
  // Every fragment of `message` held for its grouped receive, delivered into `part`, where
  // place_ahead put the message.
  void deliver_held_fragments(Request& request, Part& part, std::uint32_t message);
  // A fragment for a grouped receive that placed its message already: into its part, or
  // dropped if that part is gone (failed).
  void deliver_placed_fragment(Request& group, const Held& held);
  // The verdict on a message that came ahead, whole (`length` bytes, `tag`, judged against
  // `facts`), and the part's state once it is reached.
  void settle_arrival(Request& request, Part& part, const Announcement& facts, Verdict verdict,
                      std::size_t length, Tag tag);
  // The eager buffer goes back to the pool, and the credit with it.
  void release_held(const Held& held);
  // A message's bytes (`length` of them from the held buffer) copied to `offset` in the part's
  // buffer; a copy into device memory that failed fails the part.
  void copy_in(Request& request, Part& part, std::size_t offset, const Held& held);
  [[gnu::cold]] void copy_to_device(Request& request, Part& part, std::size_t offset,
                                    const Held& held);
  // Fragments of the part posted with `seq` held for its verdict: copied in (`keep`) or not,
  // and released.
  void take_unjudged(Request& request, Part& part, bool keep);
  [[nodiscard]] const char* fragment_error(const mux::DataTag& tag, std::size_t length) const;
  [[nodiscard]] std::uint32_t full_seq(std::uint32_t low) const noexcept;
  // rendezvous.cpp
  void on_ready_to_send(std::span<const std::byte> body);
  void apply_ready_to_send(Request& request, std::size_t index, const RtsEntry& rts);
  void finish_rendezvous(Part& part);
  // The unfinished part for `seq` (compared on `mask` bits), or nullptr if none is. Inline:
  // every message that arrives looks for its part.
  Part* waiting_part(std::uint32_t seq, std::uint32_t mask, Request** owner, std::size_t* index) {
    const PartRef& ref = part_ref(seq);
    if (ref.request == nullptr || !ref.request->in_use() ||
        ref.request->kind != RequestKind::kRecv || ref.part >= ref.request->part_count) {
      return nullptr;
    }
    Part& part = ref.request->parts[ref.part];
    if ((part.seq & mask) != (seq & mask) || terminal(part.recv)) return nullptr;
    *owner = ref.request;
    *index = ref.part;
    return &part;
  }
  // close.cpp
  [[nodiscard]] CloseNotice close_notice(CloseReason reason) override;
  void fail_unfinished(const CloseNotice& notice, Status status, const std::string& why) override;
  void settle_after_close() override;
  [[nodiscard]] bool writes_may_arrive() const noexcept override;
  void await_writes(const CloseNotice& notice) override;
  void on_writes_posted(std::span<const std::byte> body);

  std::uint32_t next_seq_ = 0;
  std::uint32_t asked_until_ = 0;  // the sender asked for the buffers before it (AskClearance)
  ClearToSend batch_;              // entries not sent yet
  std::vector<PartRef> batched_;   // the buffers they describe
  std::size_t batch_limit_ = 0;
  SeqRing<Posted, kSeqWindow> posted_;
  // Closing before the sender heard where a grouped receive placed messages that came ahead:
  // both numbers of each such buffer, unfinished in our close notice (send_control_batch).
  std::vector<std::uint32_t> unsettled_ahead_;
  // Sending ahead: the lane's eager pool (its buffers are eager_size_ bytes), the credits the
  // sender may hold at most (LOOM_EAGER_CREDITS), those it holds, those promised by the pool
  // for the next batch, and the messages held for their irecvs.
  mux::EagerPool* pool_ = nullptr;
  std::size_t eager_size_ = 0;
  std::size_t max_credits_ = 0;
  std::size_t credits_out_ = 0;
  std::size_t credits_to_grant_ = 0;
  // The credits the messages of the parts in kQuiet take: at most credits_out_ (may_stay_quiet).
  std::size_t quiet_credits_ = 0;
  // No quiet part is older (announce_aging_quiet): the first of the quiet parts since none was,
  // or the oldest at the last scan.
  std::uint32_t quiet_floor_ = 0;
  static constexpr std::uint32_t kQuietAgeLimit = kSeqWindow / 2;
  // settle_late_clearances: kSeen, a periodic check found quiet parts at quiet_seen_at_, all
  // posted before quiet_seen_until_.
  enum class LateQuiet : std::uint8_t { kNone, kSeen };
  LateQuiet late_quiet_ = LateQuiet::kNone;
  std::uint32_t quiet_seen_until_ = 0;
  std::chrono::steady_clock::time_point quiet_seen_at_;
  // How long a buffer stays quiet before its receiver announces it unasked: far longer than a
  // sender that can send ahead takes (a ping-pong's buffers wait a round each).
  static constexpr std::chrono::milliseconds kQuietPatience{100};
  std::vector<Held> held_;
  // Fragments of messages that may or may not fit their buffer, held until the last one tells
  // the size; `seq` is the buffer's.
  std::vector<Held> unjudged_;
  // What closing waits for (writes_may_arrive). kNone: no write can come. kAwaitingCount: the
  // sender was told of a buffer this side did not finish, and has not said yet how many writes
  // it posted. kCounting: it said (its close notice or its WritesPosted answer): the wait ends
  // once every write it posted arrived.
  enum class CloseWait : std::uint8_t { kNone, kAwaitingCount, kCounting };
  CloseWait close_wait_ = CloseWait::kNone;
  std::uint32_t writes_arrived_ = 0;
  std::uint32_t writes_posted_ = 0;  // kCounting: the sender's count
};

}  // namespace loom::p2p
