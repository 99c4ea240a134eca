// Clear-to-send: the receiver announces buffers (size, tag, address, a key per data rail),
// batched into one control message per lane progress, with the credits it grants (eager.cpp);
// the sender matches each message to the announcement for its sequence number and judges it
// (verdict.hpp) before anything of it is written. A refused message never carries payload
// except one sent ahead, which the receiver alone judges and drops.
//
// A buffer that only an eager message can fill (one buffer, within the eager size, while the
// sender holds a credit for it: no more such buffers than credits out) is not announced at once:
// the message usually comes ahead on a credit and finishes it, so a small message costs one
// provider message, as a ping-pong of the provider's own does. A sender whose message cannot go
// ahead (no credit, or larger than the eager size) asks (AskClearance) for the buffers of the
// messages it holds; the receiver then announces those, and those posted later up to where the ask
// reached. A message larger than the eager size meets such a buffer only where it does not fit:
// its sender asks at its periodic check, not at once, and a receiver waiting on a buffer left
// quiet for kQuietPatience announces it (settle_late_clearances): whichever end waits settles it.
#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>

#include "ofi/memory_registration.hpp"
#include "p2p/recv_comm.hpp"
#include "p2p/send_comm.hpp"
#include "util/log.hpp"

namespace loom::p2p {

// ---- receiver ----

// Every buffer is announced, in irecv order: the sender writes into it, or judges by it the
// message it sent ahead. A part whose message came ahead is delivered once it is in a batch.
void RecvCommImpl::announce(Request& r) {
  if (batch_limit_ == 0) {
    batch_limit_ = max_cts_entries(data_rails_);
    batched_.reserve(batch_limit_);
    batch_.data_rails = static_cast<std::uint8_t>(data_rails_);
    batch_.keys.resize(batch_limit_ * data_rails_);
  }
  // A group in one batch: its sender matches none of its messages before it knows them all.
  if (batch_.count != 0 && batch_.count + r.part_count > batch_limit_ &&
      r.parts[0].recv == RecvState::kToAnnounce) {
    send_control_batch();
  }
  for (std::size_t i = 0; i < r.part_count; ++i) {
    Part& part = r.parts[i];
    if (part.recv != RecvState::kToAnnounce) continue;
    if (batch_.count == batch_limit_) send_control_batch();
    if (batch_.count == batch_limit_) {
      retry_later(r);  // the batch is stuck behind back-pressure: try again later
      return;
    }
    CtsEntry& entry = batch_.entries[batch_.count++];
    entry.announcement = Announcement{.seq = part.seq,
                                      .size = part.size,
                                      .tag = part.tag,
                                      .refused = part.status != Status::kOk,
                                      .group_index = static_cast<std::uint8_t>(i),
                                      .group_size = r.part_count};
    entry.address = 0;
    if (part.registration != nullptr) {
      entry.address = part.registration->remote_address(part.data);
      std::uint64_t* keys = batch_.keys_of(batch_.count - 1);
      for (std::size_t k = 0; k < data_rails_; ++k) keys[k] = part.registration->key(k);
    }
    claim_posted(part.seq).announced = Announced{.valid = true, .announcement = entry.announcement};
    part.to(RecvState::kAnnounced);
    batched_.push_back({&r, static_cast<std::uint8_t>(i)});
    defer();
    if (!held_.empty() && r.part_count == 1) deliver_held(r, part);
  }
  if (!held_.empty() && r.part_count > 1) place_ahead(r);
}

void RecvCommImpl::on_ask_clearance(std::span<const std::byte> body) {
  AskClearance ask;
  if (const char* why = decode_ask_clearance(body, ask)) [[unlikely]] {
    util::log().warn("comm {} on lane {}: control message dropped: {}", id_, lane_->id(), why);
    return;
  }
  announce_quiet(ask.from, ask.until);
  send_control_batch();  // the sender waits for it
}

void RecvCommImpl::announce_quiet(std::uint32_t from, std::uint32_t until) {
  if (seq_before(asked_until_, until)) asked_until_ = until;
  // Only numbers in flight can be quiet (a peer's ask may name any).
  if (next_seq_ - from > kSeqWindow) from = next_seq_ - static_cast<std::uint32_t>(kSeqWindow);
  for (std::uint32_t seq = from; seq_before(seq, until) && seq_before(seq, next_seq_); ++seq) {
    const PartRef& ref = part_ref(seq);
    Request* r = ref.request;
    if (r == nullptr || !r->in_use() || r->kind != RequestKind::kRecv ||
        ref.part >= r->part_count || r->parts[ref.part].seq != seq ||
        r->parts[ref.part].recv != RecvState::kQuiet) {
      continue;
    }
    announce_quiet_part(*r, r->parts[ref.part]);
  }
}

void RecvCommImpl::announce_quiet_part(Request& r, Part& part) {
  leave_quiet(part);
  part.to(RecvState::kToAnnounce);
  announce(r);
}

// A quiet part whose message did not come ahead while half a window of receives was posted
// after it is announced, as any buffer may be (an announcement costs a message, never a wrong
// delivery): its sender asks for it only if one of its own sends waits, and its number must not
// leave the window in which its entry, and the sender's, are kept (posted_, outgoing_). The
// sender, whose later messages wait behind it, reads this before any later announcement. A scan
// whenever the oldest quiet part may have aged past the limit (quiet_floor_), not per irecv.
void RecvCommImpl::announce_aging_quiet() {
  std::uint32_t floor = next_seq_;
  for (Request& r : requests_.in_use(RequestKind::kRecv)) {
    if (r.part_count != 1 || r.parts[0].recv != RecvState::kQuiet) continue;
    Part& part = r.parts[0];
    if (next_seq_ - part.seq <= kQuietAgeLimit) {
      if (seq_before(part.seq, floor)) floor = part.seq;
      continue;
    }
    announce_quiet_part(r, part);
  }
  quiet_floor_ = floor;
  send_control_batch();  // the sender may wait for it
}

// Parts quiet for kQuietPatience are announced as if their sender asked: their messages did not
// come ahead, and a sender that cannot send one ahead asks only when its own application polls
// it, if the message is above the eager size (SendCommImpl's settle_late_clearances). A receiver
// waiting on such a buffer so settles it itself.
void RecvCommImpl::settle_late_clearances() {
  if (quiet_credits_ == 0 || closed_ || peer_gone()) {
    late_quiet_ = LateQuiet::kNone;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (late_quiet_ == LateQuiet::kNone) {
    late_quiet_ = LateQuiet::kSeen;
    quiet_seen_until_ = next_seq_;
    quiet_seen_at_ = now;
    return;
  }
  if (now - quiet_seen_at_ < kQuietPatience) return;
  // Those posted before the check that saw them, and quiet since.
  announce_quiet(next_seq_ - static_cast<std::uint32_t>(kSeqWindow), quiet_seen_until_);
  send_control_batch();
  late_quiet_ = LateQuiet::kNone;
}

// Sends the batch as a control message of its own: entries at once, since a sender may be
// waiting for them; credits alone only once half the eager buffers wait to be granted again,
// since until then the sender has credits left and a message the other way may carry them.
void RecvCommImpl::send_control_batch() {
  promise_credits();  // what the pool could not promise before (nothing to do, mostly)
  if (batch_.count == 0 && credits_to_grant_ == 0) return;
  if (closed_ || peer_gone()) {
    for (const PartRef& ref : batched_) {
      Part& part = ref.request->parts[ref.part];
      if (part.recv != RecvState::kArrived) continue;
      if (part.peer_seq != part.seq) {
        // A message that came ahead into a grouped receive's buffer other than its own
        // number's, and the sender never learned where: reported delivered by neither end.
        part.status = Status::kCancelled;
        ref.request->fail(Status::kCancelled,
                          "irecv: the communicator closed before the sender heard where message " +
                              std::to_string(part.peer_seq) + " went");
        unsettled_ahead_.push_back(part.seq);
        unsettled_ahead_.push_back(part.peer_seq);
      }
      fail_part(*ref.request, part, part.status);
    }
    batch_.count = 0;
    batched_.clear();
    return;
  }
  if (batch_.count == 0 && 2 * credits_to_grant_ < max_credits_) return;
  if (control_held()) [[unlikely]] {
    defer();
    return;
  }
  std::byte body[mux::kMaxControlBody];
  const std::size_t length = encode_batch(body);
  // See SendCommImpl::send_control_batch: an unencodable batch fails its requests.
  const Status status =
      length == 0 ? refuse_batch("clear-to-send")
                  : send_control(MessageType::kClearToSend,
                                 batch_.count != 0 ? batch_.entries[0].announcement.seq : 0,
                                 {body, length});
  if (status == Status::kRetry) {
    defer();
    return;
  }
  if (status == Status::kOk) ++stats_.cts_sent;
  batch_left(status);
}

// The batch rides on a message our send communicator to the same peer context injects (see
// mux/carried_control.hpp): called by it, under our lane's lock, through the lane registry.
std::size_t RecvCommImpl::take_carried_control(std::span<std::byte> out,
                                               std::uint64_t& target_lane) {
  // Credits alone wait for half the eager buffers, as on their own (send_control_batch): a
  // carrier costs the message it rides on.
  if (closed_ || peer_gone() || (batch_.count == 0 && 2 * credits_to_grant_ < max_credits_) ||
      credits_to_grant_ + batch_.count == 0 || out.size() <= mux::kControlHeaderBytes) {
    return 0;
  }
  const std::size_t length = encode_batch(out.subspan(mux::kControlHeaderBytes));
  if (length == 0) return 0;  // does not fit beside the payload: it goes on its own
  mux::encode_control_header(out, {.type = static_cast<std::uint8_t>(MessageType::kClearToSend),
                                   .comm = peer_id_,
                                   .length = static_cast<std::uint16_t>(length)});
  target_lane = peer_lane_;
  ++stats_.cts_carried;
  batch_left(Status::kOk);
  return mux::kControlHeaderBytes + length;
}

std::size_t RecvCommImpl::encode_batch(std::span<std::byte> out) {
  batch_.data_rails = static_cast<std::uint8_t>(data_rails_);
  batch_.credits = static_cast<std::uint16_t>(std::min(credits_to_grant_, kMaxCreditsPerBatch));
  batch_.eager_size = static_cast<std::uint32_t>(eager_size_);
  return encode_cts(batch_, out);
}

// The batch left (kOk) or could not (the sender never learns of its buffers).
void RecvCommImpl::batch_left(Status status) {
  if (status == Status::kOk) {
    credits_to_grant_ -= batch_.credits;
    credits_out_ += batch_.credits;
  }
  for (const PartRef& ref : batched_) {
    Request& r = *ref.request;
    Part& part = r.parts[ref.part];
    if (part.recv != RecvState::kAnnounced && part.recv != RecvState::kArrived) continue;
    if (status != Status::kOk) {
      // The sender cannot learn of this buffer: the request fails, and what of it the sender
      // never heard of with it.
      r.fail(Status::kError, "irecv: " + last_error_);
      for (std::size_t i = 0; i < r.part_count; ++i) {
        if (!terminal(r.parts[i].recv)) {
          r.parts[i].status = Status::kError;
          fail_part(r, r.parts[i], Status::kError);
        }
      }
      continue;
    }
    // The sender can judge it now: a failed buffer's refusal, or a message that came ahead,
    // may be reported.
    if (part.recv == RecvState::kArrived) {
      part.to(part.status == Status::kOk ? RecvState::kDone : RecvState::kFailed);
    } else {
      part.to(part.status == Status::kOk ? RecvState::kCleared : RecvState::kFailed);
    }
  }
  batch_.count = 0;
  batched_.clear();
}

// A carried batch is lost if the receiving communicator it rode to closed before it landed
// (its eager buffers cancelled): the peer's sender, still waiting, names the oldest message it
// waits for in its pings, and what we announced from there on goes again, as a control
// message. Announcing twice is harmless: the sender takes a clearance once, for the message
// with that sequence number. Credits that were lost stay lost: the sender writes instead.
void RecvCommImpl::repeat_clearances(std::uint32_t from) {
  if (batch_limit_ == 0) {  // nothing announced yet
    announce_quiet(from, next_seq_);
    send_control_batch();
    return;
  }
  // From the first buffer of its group: the sender matches no message of a group it does not
  // know whole.
  const Announced& oldest = posted_.slot(from).entry.announced;
  if (oldest.valid && oldest.announcement.seq == from) from -= oldest.announcement.group_index;
  std::size_t repeated = 0;
  for (std::uint32_t seq = from; seq_before(seq, next_seq_) && seq - from < kSeqWindow; ++seq) {
    const Announced& a = posted_.slot(seq).entry.announced;
    if (!a.valid || a.announcement.seq != seq) continue;
    if (batch_.count == batch_limit_) send_control_batch();
    if (batch_.count == batch_limit_) return;  // back-pressure: the next ping asks again
    CtsEntry& entry = batch_.entries[batch_.count++];
    entry = CtsEntry{.announcement = a.announcement};
    std::fill_n(batch_.keys_of(batch_.count - 1), data_rails_, 0);
    const PartRef& ref = part_ref(seq);
    if (ref.request != nullptr && ref.request->in_use() && ref.part < ref.request->part_count) {
      const Part& part = ref.request->parts[ref.part];
      if (part.seq == seq && part.registration != nullptr && !terminal(part.recv)) {
        entry.address = part.registration->remote_address(part.data);
        std::uint64_t* keys = batch_.keys_of(batch_.count - 1);
        for (std::size_t k = 0; k < data_rails_; ++k) keys[k] = part.registration->key(k);
      }
    }
    ++repeated;
  }
  // A sender still waiting asks for the quiet ones too (its ask may be lost in a back-pressured
  // or broken-off path).
  announce_quiet(from, next_seq_);
  if (repeated != 0) {
    util::log().debug("comm {} on lane {}: {} clearance(s) from message {} announced again", id_,
                      lane_->id(), repeated, from);
  }
  send_control_batch();
}

// ---- sender ----

// Each buffer's announcement is kept by its sequence number; a message is matched once every
// buffer of its group is announced (p2p/group.hpp), in sequence order within the group.
void SendCommImpl::on_clear_to_send(std::span<const std::byte> body) {
  const CtsReader cts(body);
  const char* why = cts.error();
  if (why == nullptr && cts.data_rails() < data_rails_) why = "clear-to-send names too few rails";
  if (why != nullptr) [[unlikely]] {
    util::log().warn("comm {} on lane {}: control message dropped: {}", id_, lane_->id(), why);
    return;
  }
  if (cts.credits() != 0) {
    credits_ += cts.credits();
    eager_size_ = cts.eager_size();
  }
  for (std::size_t i = 0; i < cts.count(); ++i) {
    const CtsEntryView entry = cts.entry(i);
    // A message posted already claimed its number's entry; if that is gone, the message
    // finished and this is an announcement made again (repeat_clearances) for nothing.
    const std::uint32_t seq = entry.announcement.seq;
    Outgoing* outgoing = seq_before(seq, next_seq_) ? outgoing_.find(seq) : &claim_outgoing(seq);
    if (outgoing == nullptr) continue;
    Clearance& clearance = outgoing->clearance;
    // Announced again: what we know of it, and whether it is taken, stands.
    if (clearance.valid && clearance.announcement.seq == seq) continue;
    clearance =
        Clearance{.valid = true, .announcement = entry.announcement, .address = entry.address};
    // The keys of every rail our lane has (data_rails_ never exceeds it): the message can
    // arrive before our own handshake finished (data_rails_ still 0) when the receiver posts
    // right after accepting.
    std::memcpy(outgoing_.extras(seq), entry.keys,
                8 * std::min(lane_->rails().data_rails(), cts.data_rails()));
  }
  for (std::size_t i = 0; i < cts.count(); ++i) settle_group(cts.entry(i).announcement.seq);
  // Matched messages no longer hold back later ones that may go ahead; new credits let them.
  send_ahead_waiting();
}

bool SendCommImpl::group_known(std::uint32_t seq) const noexcept {
  const Clearance& own = announcement(seq);
  if (!own.valid || own.announcement.seq != seq) return false;
  if (own.announcement.group_size == 1) [[likely]]
    return true;
  const std::uint32_t first = seq - own.announcement.group_index;
  for (std::uint32_t k = 0; k < own.announcement.group_size; ++k) {
    const Clearance& buffer = announcement(first + k);
    if (!buffer.valid || buffer.announcement.seq != first + k) return false;
  }
  return true;
}

// The group's messages posted so far, placed in sequence order, and those that wait for it
// matched: the ones that went ahead first (they are its first ones), as the receiver placed them;
// a message that went ahead may have finished already (its tag is kept in outgoing_).
void SendCommImpl::settle_group(std::uint32_t seq) {
  if (!group_known(seq)) return;
  const Clearance& own = announcement(seq);
  const std::uint32_t first = seq - own.announcement.group_index;
  const std::uint32_t size = own.announcement.group_size;
  for (std::uint32_t message = first; message != first + size; ++message) {
    if (!seq_before(message, next_seq_)) return;  // not posted yet
    Request* r = posted(message);
    const bool in_flight =
        r != nullptr && r->in_use() && r->kind == RequestKind::kSend && r->parts[0].seq == message;
    Outgoing* outgoing = outgoing_.find(message);
    if (outgoing != nullptr && outgoing->ahead != Ahead::kNo) {
      if (outgoing->ahead == Ahead::kPlaced) continue;
      outgoing->ahead = Ahead::kPlaced;
      const std::uint32_t buffer = place(message, outgoing->tag);
      if (in_flight) r->parts[0].peer_seq = buffer;
      continue;
    }
    if (!in_flight || r->parts[0].send != SendState::kAwaitingClearance) continue;
    r->parts[0].peer_seq = place(message, r->parts[0].tag);
    match(*r);
    advance(*r);
  }
}

// The buffer of its group the message goes into (p2p/group.hpp): its own sequence number's for
// a receive of one buffer.
std::uint32_t SendCommImpl::place(std::uint32_t seq, Tag tag) {
  Clearance& own = announcement(seq);
  if (own.announcement.group_size == 1) [[likely]] {
    own.taken = true;
    return seq;
  }
  const std::uint32_t first = seq - own.announcement.group_index;
  std::array<Tag, kMaxParts> tags{};
  GroupTaken taken = 0;
  for (std::size_t k = 0; k < own.announcement.group_size; ++k) {
    const Clearance& buffer = announcement(first + k);
    tags[k] = buffer.announcement.tag;
    if (buffer.taken) taken |= static_cast<GroupTaken>(1u << k);
  }
  std::size_t k = place_in_group(tags.data(), own.announcement.group_size, taken, tag);
  // A group has a buffer for each of its messages, placed once each: one is always free.
  assert(k < own.announcement.group_size);
  if (k >= own.announcement.group_size) k = own.announcement.group_index;
  announcement(first + k).taken = true;
  return first + static_cast<std::uint32_t>(k);
}

bool SendCommImpl::awaiting_clearance(std::uint32_t& oldest) const noexcept {
  bool any = false;
  for (const Request& r : requests_.in_use(RequestKind::kSend)) {
    if (r.parts[0].send != SendState::kAwaitingClearance) continue;
    if (!any || seq_before(r.parts[0].seq, oldest)) oldest = r.parts[0].seq;
    any = true;
  }
  return any;
}

SendCommImpl::Unasked SendCommImpl::unasked_waiting() const noexcept {
  Unasked waiting{.oldest = next_seq_};
  for (const Request& r : requests_.in_use(RequestKind::kSend)) {
    const Part& part = r.parts[0];
    // One partly sent in fragments waits for room in the provider's queue, not for an answer.
    if (part.send != SendState::kAwaitingClearance || seq_before(part.seq, asked_until_) ||
        part.fragments_sent != 0) {
      continue;
    }
    if (seq_before(part.seq, waiting.oldest)) waiting.oldest = part.seq;
    waiting.any = true;
    waiting.prompt = waiting.prompt || asks_promptly(part);
  }
  return waiting;
}

// One ask covers every message posted so far that waits: those posted later are asked for
// after them, so a window of isends costs one ask, and none where credits or announcements came
// first. Not at the deferred run that finds a message waiting: that runs before the lane's
// queues are read, where its announcement (or credits) usually wait already. The oldest waiting
// then (armed_seq_) asks at a later run if it still waits and the control queues were read since
// (a lane that found data skips its control read: a sender whose sends all finish at once reads
// its grants only when it ran out of credits). A run that finds another one oldest starts over
// with it: the arming was for a wait that ended. Only messages that may meet a quiet buffer make
// one (asks_promptly); it covers the others waiting too.
void SendCommImpl::ask_for_clearances() {
  if (closed_ || peer_gone()) return;
  if (!seq_before(asked_until_, next_seq_)) {  // every message posted is asked for: no scan
    ask_ = AskState::kNone;
    ask_scope_ = AskScope::kWithinEagerSize;
    return;
  }
  // From the oldest message waiting unasked, whether it asks promptly or not: the ask covers
  // it, and asked_until_ says so.
  const Unasked waiting = unasked_waiting();
  if (!waiting.prompt) {
    ask_ = AskState::kNone;
    if (ask_scope_ == AskScope::kEveryMessage) {
      ask_scope_ = AskScope::kWithinEagerSize;  // none waits unasked (a late one is seen again)
    }
    return;
  }
  ofi::RailSet& rails = lane_->rails();
  if (ask_ != AskState::kArmed || armed_seq_ != waiting.oldest) {
    ask_ = AskState::kArmed;
    armed_seq_ = waiting.oldest;
    armed_reads_ = rails.control_reads();
  }
  if (rails.control_reads() == armed_reads_) {
    rails.read_control_next();
    defer();
    return;
  }
  const std::uint32_t from = waiting.oldest;
  const AskClearance ask{.from = from, .until = next_seq_};
  std::byte body[kAskClearanceBytes];
  const std::size_t length = encode_ask_clearance(ask, body);
  const Status status = send_control(MessageType::kAskClearance, from, {body, length});
  if (status == Status::kRetry) {
    defer();
    return;
  }
  // A failed send broke the communicator off (its requests fail); a lost ask is asked again
  // by the pings of a sender still waiting (repeat_clearances).
  ask_ = AskState::kNone;
  ask_scope_ = AskScope::kWithinEagerSize;
  if (status == Status::kOk) {
    asked_until_ = next_seq_;
    ++stats_.asks_sent;
  }
}

// A message that waits without asking promptly (above the receiver's eager size), still the
// oldest waiting unasked at the next check, is asked for then, at the deferred runs' pace, with
// every other waiting one.
void SendCommImpl::settle_late_clearances() {
  if (ask_scope_ == AskScope::kEveryMessage) return;
  const Unasked waiting = unasked_waiting();
  if (!waiting.any) {
    ask_scope_ = AskScope::kWithinEagerSize;
    return;
  }
  if (ask_scope_ == AskScope::kWithinEagerSize || waiting.oldest != late_seq_) {
    ask_scope_ = AskScope::kLateSeen;
    late_seq_ = waiting.oldest;
    return;
  }
  ask_scope_ = AskScope::kEveryMessage;
  defer();  // the deferred run finds whether one is unasked
}

// The message meets its buffer's announcement. A refusal sends no payload, only a
// ready-to-send from which the receiver reaches the same verdict; none for a receive that
// failed over there, whose buffer is back with the application. A message that fits goes on
// a credit when there is one, else by write: never onto a receive that is not posted.
void SendCommImpl::match(Request& r) {
  Part& part = r.parts[0];
  const Clearance& clearance = announcement(part.peer_seq);
  const Verdict verdict = judge(clearance.announcement, part.size, part.tag);
  if (verdict != Verdict::kFits) [[unlikely]] {
    r.fail(status_of(verdict),
           explain(verdict, Side::kSender, part.seq, clearance.announcement, part.size, part.tag));
    part.status = r.status;
    if (verdict == Verdict::kRefused) {
      part.to(SendState::kFailed);
      return;
    }
    r.stripes = part.size == 0 ? 0 : 1;  // what the ready-to-send says; none are written
    r.to(ReadyToSendState::kWanted);
    part.to(SendState::kFailing);
    return;
  }
  if (credits_ != 0 && eager_fits(part.size)) {
    --credits_;  // taken now: a retry must not find it gone
    ++stats_.eager;
    part.to(SendState::kEagerReady);
    return;
  }
  ++stats_.rendezvous;
  r.stripes = part.size == 0 ? 0 : stripe_count(part.size);
  // A written message that fills its buffer says so in its writes' CQ data (an empty one needs
  // its ready-to-send: it has no write). Otherwise the receiver hears the size from a
  // ready-to-send.
  const bool fills = part.size == clearance.announcement.size && part.size != 0;
  if (!fills) r.to(ReadyToSendState::kWanted);
  part.to(SendState::kWriting);
}

}  // namespace loom::p2p
