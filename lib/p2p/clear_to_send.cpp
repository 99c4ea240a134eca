// Clear-to-send: the receiver announces each buffer (size, tag, address, a key per data rail,
// whether an eager receive waits in it) once its eager receive is posted, batched into one
// control message per lane progress; the sender matches each message to the announcement for
// its sequence number and judges it (verdict.hpp) before anything of it is sent. So an eager
// message never arrives before its receive, and a refused one never carries payload.
#include <algorithm>
#include <cstring>

#include "p2p/recv_comm.hpp"
#include "p2p/send_comm.hpp"
#include "util/log.hpp"

namespace loom::p2p {

std::string explain(Verdict verdict, Side side, std::uint32_t seq, const BufferFacts& buffer,
                    std::uint64_t message_size, Tag message_tag) {
  const std::string message = std::to_string(seq);
  if (side == Side::kSender) {
    switch (verdict) {
      case Verdict::kRefused:
        return "isend: the peer's receive for message " + message + " failed; nothing was sent";
      case Verdict::kTooLarge:
        return "isend: message of " + std::to_string(message_size) +
               " bytes is larger than the peer's posted buffer of " + std::to_string(buffer.size) +
               " bytes (message " + message + ")";
      case Verdict::kWrongTag:
        return "isend: tag " + std::to_string(message_tag) +
               " does not match the peer's buffer tag " + std::to_string(buffer.tag) +
               " (message " + message + ")";
      case Verdict::kFits:
        break;
    }
    return {};
  }
  switch (verdict) {
    case Verdict::kRefused:
      return "irecv: message " + message + " refused";
    case Verdict::kTooLarge:
      return "irecv: message " + message + " of " + std::to_string(message_size) +
             " bytes is larger than the posted buffer of " + std::to_string(buffer.size) + " bytes";
    case Verdict::kWrongTag:
      return "irecv: message " + message + " carries tag " + std::to_string(message_tag) +
             ", the buffer expects " + std::to_string(buffer.tag);
    case Verdict::kFits:
      break;
  }
  return {};
}

// ---- receiver ----

// Receives go to the provider in sequence order, the order the sender sends in. When the
// provider's queue is full, later buffers wait behind earlier ones: a queue whose entries were
// taken by receives for messages far ahead (a newer irecv finding an entry free while older
// ones waited for a retry) held none for the messages the sender could send, and both sides
// stopped.
void RecvCommImpl::post_in_order() {
  while (post_next_ != next_seq_) {
    const PartRef& ref = by_seq_[post_next_ % kSeqWindow];
    Request* r = ref.request;
    if (r != nullptr && r->in_use && r->kind == RequestKind::kRecv && ref.part < r->part_count &&
        r->parts[ref.part].seq == post_next_) {
      if (!post_receive(*r, ref.part)) return;  // retried from here
      announce(*r);
    }
    ++post_next_;
  }
}

// A buffer is announced only once the provider holds its eager receive (or it needs none: its
// message comes by write, or the buffer already failed); the sender sends eagerly only
// after the announcement (see SendCommImpl::advance). So an eager message never arrives before
// its receive and never occupies a provider queue entry that posted receives need. Buffers
// whose receive waits for room in the provider's queue are announced when it is posted.
void RecvCommImpl::announce(Request& r) {
  if (batch_limit_ == 0) {
    batch_limit_ = max_cts_entries(data_rails_);
    batched_.reserve(batch_limit_);
  }
  for (std::size_t i = 0; i < r.part_count; ++i) {
    Part& part = r.parts[i];
    if (part.recv != RecvState::kToAnnounce) continue;
    if (batch_.count == batch_limit_) send_control_batch();
    if (batch_.count == batch_limit_) {
      retry_later(r);  // the batch is stuck behind back-pressure: try again later
      return;
    }
    batch_.data_rails = static_cast<std::uint8_t>(data_rails_);
    CtsEntry& entry = batch_.entries[batch_.count++];
    entry.seq = part.seq;
    entry.size = part.size;
    entry.tag = part.tag;
    entry.eager_receive = !part.by_write;
    entry.refused = part.status != Status::kOk;
    entry.address = 0;
    if (part.registration != nullptr) {
      entry.address = part.registration->remote_address(part.data);
      for (std::size_t k = 0; k < data_rails_; ++k) entry.keys[k] = part.registration->key(k);
    }
    part.to(RecvState::kAnnounced);
    batched_.push_back({&r, static_cast<std::uint8_t>(i)});
    defer();
  }
}

void RecvCommImpl::send_control_batch() {
  if (batch_.count == 0) return;
  if (closed_ || peer_gone()) {
    batch_.count = 0;
    batched_.clear();
    return;
  }
  std::byte body[mux::kMaxControlBody];
  const std::size_t length = encode_cts(batch_, body);
  // See SendCommImpl::send_control_batch: an unencodable batch fails its requests.
  const Status status =
      length == 0 ? refuse_batch("clear-to-send")
                  : send_control(MessageType::kClearToSend, batch_.entries[0].seq, {body, length});
  if (status == Status::kRetry) {
    defer();
    return;
  }
  for (const PartRef& ref : batched_) {
    Request& r = *ref.request;
    Part& part = r.parts[ref.part];
    if (part.recv != RecvState::kAnnounced) continue;  // failed meanwhile
    if (status != Status::kOk) {
      // The sender cannot learn of this buffer: the request fails, and what of it the sender
      // never heard of with it.
      r.fail(Status::kError, "irecv: " + last_error_);
      for (std::size_t i = 0; i < r.part_count; ++i) {
        if (!terminal(r.parts[i].recv)) fail_part(r, r.parts[i], Status::kError);
      }
      continue;
    }
    // A failed buffer's refusal is out: the request may report it.
    part.to(part.status == Status::kOk ? RecvState::kCleared : RecvState::kFailed);
  }
  batch_.count = 0;
  batched_.clear();
}

// ---- sender ----

void SendCommImpl::on_clear_to_send(std::span<const std::byte> body) {
  const CtsReader cts(body);
  const char* why = cts.error();
  if (why == nullptr && cts.data_rails() < data_rails_) why = "clear-to-send names too few rails";
  if (why != nullptr) [[unlikely]] {
    util::log().warn("comm {} on lane {}: control message dropped: {}", id_, lane_->id(), why);
    return;
  }
  for (std::size_t i = 0; i < cts.count(); ++i) {
    const CtsEntryView entry = cts.entry(i);
    const std::size_t slot = entry.seq % kSeqWindow;
    clearances_[slot] = Clearance{.valid = true,
                                  .seq = entry.seq,
                                  .buffer = {entry.size, entry.tag, entry.refused},
                                  .eager_receive = entry.eager_receive,
                                  .address = entry.address};
    // The keys of every rail our lane has (data_rails_ never exceeds it): the message can
    // arrive before our own handshake finished (data_rails_ still 0) when the receiver posts
    // right after accepting.
    std::memcpy(&keys_[slot * key_stride_], entry.keys,
                8 * std::min(key_stride_, cts.data_rails()));
    Request* r = waiting_[slot];
    if (r != nullptr && r->in_use && r->kind == RequestKind::kSend &&
        r->parts[0].seq == entry.seq && r->parts[0].send == SendState::kAwaitingClearance) {
      match(*r);
      advance(*r);
    }
  }
}

// The message meets its buffer's announcement. A refusal sends no payload, only a
// ready-to-send from which the receiver reaches the same verdict (and cancels an eager receive
// if one waits); none for a receive that failed over there, whose buffer is back with the
// application. Never a truncated receive on the wire: rxm over tcp without a shared receive
// queue drops the connection on one. Never an eager message into a buffer with no receive
// posted: it would wait unmatched forever.
void SendCommImpl::match(Request& r) {
  Part& part = r.parts[0];
  Clearance& clearance = clearances_[part.seq % kSeqWindow];
  clearance.valid = false;
  const Verdict verdict = judge(clearance.buffer, part.size, part.tag);
  if (verdict != Verdict::kFits) [[unlikely]] {
    r.fail(status_of(verdict),
           explain(verdict, Side::kSender, part.seq, clearance.buffer, part.size, part.tag));
    part.status = r.status;
    if (verdict == Verdict::kRefused) {
      part.to(SendState::kFailed);
      return;
    }
    r.stripes = part.size == 0 ? 0 : 1;  // what the ready-to-send says; none are written
    r.ready_to_send = ReadyToSendState::kWanted;
    part.to(SendState::kFailing);
    return;
  }
  const bool eager = part.size <= eager_max_ && part.size <= lane_->rails().max_msg_size() &&
                     clearance.eager_receive;
  if (eager) {
    ++stats_.eager;
    part.to(SendState::kEagerReady);
    return;
  }
  // Written: a buffer above the receiver's eager limit has no receive waiting (an empty message
  // needs no write there: its ready-to-send carries it), or the message is above ours.
  ++stats_.rendezvous;
  r.stripes = part.size == 0 ? 0 : stripe_count(part.size);
  // A written message that fills its buffer says so in its writes' CQ data (an empty one never
  // does: a buffer without an eager receive is above the eager limit). Otherwise the receiver
  // hears the size from a ready-to-send, which also makes it cancel an eager receive waiting
  // in the buffer (a receiver whose eager limit is above ours).
  const bool fills = part.size == clearance.buffer.size && !clearance.eager_receive;
  r.ready_to_send = fills ? ReadyToSendState::kNotNeeded : ReadyToSendState::kWanted;
  part.to(SendState::kWriting);
}

}  // namespace loom::p2p
