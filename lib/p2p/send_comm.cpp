// Sender protocol. Every message waits for the receiver's clear-to-send for its sequence
// number, which says the buffer's size, tag and address and whether an eager receive is posted
// in it. Eager: one tagged send (tag = kind | peer comm id | seq, CQ data = user tag) straight
// into that receive; the request completes once the send completed locally. Rendezvous (larger
// messages, and any message to a buffer without an eager receive): the payload is written with
// fi_writedata in stripes over the data rails, each carrying comm id | seq | fills | stripe
// count as remote CQ data. A message that fills its buffer with the buffer's tag says so in
// that CQ data and nothing else goes; otherwise a ready-to-send carries size and tag (an empty
// message rides on it alone), and the receiver decides with the same facts as the sender.
#include "p2p/send_comm.hpp"

#include <algorithm>
#include <cstring>

#include "ofi/memory_registration.hpp"
#include "p2p/context_core.hpp"
#include "util/log.hpp"

namespace loom::p2p {

SendCommImpl::SendCommImpl(std::shared_ptr<ContextCore> core, mux::Lane& lane)
    : Comm(std::move(core), lane, mux::Direction::kSend),
      min_stripe_(core_->config().min_stripe),
      clearances_(kSeqWindow),
      key_stride_(lane.rails().data_rails()),
      keys_(kSeqWindow * key_stride_),
      waiting_(kSeqWindow, nullptr),
      writes_posted_(kSeqWindow, 0) {
  batched_.reserve(kMaxBatch);
}

// No stripe may be longer than the provider's max_msg_size: a message that would need longer
// ones takes more stripes, up to kMaxSendStripes (isend refuses one that still does not fit).
// The last stripe takes the remainder, so it is the longest.
std::uint8_t SendCommImpl::stripe_count(std::size_t size) const noexcept {
  const std::size_t by_size = std::max<std::size_t>(1, size / min_stripe_);
  std::size_t stripes = std::min({by_size, data_rails_, kMaxSendStripes});
  const std::size_t max_msg = lane_->rails().max_msg_size();
  while (stripes < kMaxSendStripes && size - (stripes - 1) * (size / stripes) > max_msg) ++stripes;
  return static_cast<std::uint8_t>(stripes);
}

Status SendCommImpl::isend(const void* data, std::size_t size, Tag tag, const MemoryRegion& region,
                           Request*& request) {
  request = nullptr;
  // Clear-to-sends batched on our receive lanes go before this message: the peer may be
  // waiting for them to send what we wait for next (it could be what this message releases).
  flush_other_lanes();
  std::lock_guard lock(lane_->mutex());
  if (closed_) [[unlikely]]
    return reject(Status::kInvalid, "isend on a closed communicator");
  if (peer_gone()) [[unlikely]] {
    return reject(Status::kPeerError, "isend: " + peer_gone_);
  }
  const ofi::MemoryRegistration* registration = nullptr;
  if (size != 0) {
    registration = lookup(region, data, size);
    if (registration == nullptr) [[unlikely]]
      return Status::kInvalid;
  }
  const std::size_t max_msg = lane_->rails().max_msg_size();
  if (size > max_msg && size - (kMaxSendStripes - 1) * (size / kMaxSendStripes) > max_msg)
      [[unlikely]] {
    return reject(Status::kInvalid, "isend: " + std::to_string(size) + " bytes do not fit in " +
                                        std::to_string(kMaxSendStripes) + " writes of at most " +
                                        std::to_string(max_msg) + " bytes (max_msg_size of " +
                                        core_->provider() + ")");
  }
  Request* r = allocate(RequestKind::kSend);
  if (r == nullptr) [[unlikely]] {
    return reject(Status::kRetry, "isend: " + std::to_string(kMaxRequests) +
                                      " requests already in flight; test some first");
  }
  const std::uint32_t seq = next_seq_++;
  r->part_count = 1;
  r->parts[0] = Part{.data = static_cast<std::byte*>(const_cast<void*>(data)),
                     .size = size,
                     .tag = tag,
                     .registration = registration,
                     .seq = seq};
  r->eager = size <= eager_max_ && size <= max_msg;
  r->stripes = r->eager ? 0 : stripe_count(size);
  ++(r->eager ? stats_.eager : stats_.rendezvous);
  waiting_[seq % kSeqWindow] = r;
  writes_posted_[seq % kSeqWindow] = 0;
  const Clearance& clearance = clearances_[seq % kSeqWindow];
  if (clearance.valid && clearance.seq == seq) match(*r);
  advance(*r);
  request = r;
  return Status::kOk;
}

// A clear-to-send that shows a mismatch turns the message into a ready-to-send without payload
// (see match()): the receiver must reach the same verdict from what it gets, or its request
// would never end.
//
// Nothing goes before the clear-to-send: an eager message's receive is posted then, so it
// never waits in the provider's bounded unexpected-message pool (see Lane::may_post_receive),
// and a written message's sender knows whether the receiver needs a ready-to-send at all.
void SendCommImpl::advance(Request& r) {
  Part& part = r.parts[0];
  // Closing: what has not left stays (the close notice tells the receiver it never will).
  const bool sendable = !closed_ && !r.abandoned && !part.done;
  if (r.eager) {
    // No division for the common single rail: it would cost more than the rest of the choice.
    const std::size_t rail = data_rails_ <= 1 ? 0 : part.seq % data_rails_;
    if (!r.eager_posted && sendable && r.cts_matched) {
      ofi::Rail& data_rail = lane_->rails().data(rail);
      const std::uint64_t wire_tag = mux::encode_tag({mux::TagKind::kEager, peer_id_, part.seq});
      // An inject leaves no completion to generate and read: on shm that is a CQ write less
      // under the receiver's queue lock, which both processes take for every message.
      const bool inject =
          part.size <= inject_max_ &&
          (part.registration == nullptr || part.registration->type() == MemoryType::kHost);
      const Status status =
          inject
              ? data_rail.tagged_inject(peer_data_[rail], part.data, part.size, wire_tag, part.tag)
              : data_rail.tagged_send(peer_data_[rail], part.data, part.size,
                                      part.registration ? part.registration->desc(rail) : nullptr,
                                      wire_tag, part.tag, &r.ops[0]);
      if (status == Status::kOk) {
        r.eager_posted = true;
        if (inject) {
          r.local_done = true;
        } else {
          ++r.ops_outstanding;
        }
      } else if (status == Status::kRetry) {
        queue_retry(r);
      } else {
        r.fail(Status::kError, "isend: " + data_rail.last_error());
        r.abandoned = true;
      }
    }
  } else {
    if (r.rts_needed && !r.rts_queued && sendable) {
      if (batch_.count == kMaxBatch) flush_control();
      if (batch_.count == kMaxBatch) {
        queue_retry(r);  // the batch is stuck behind back-pressure: try again later
      } else {
        batch_.entries[batch_.count++] =
            RtsEntry{.seq = part.seq, .size = part.size, .tag = part.tag, .stripes = r.stripes};
        batched_.push_back(&r);
        r.rts_queued = true;
        schedule_flush();
      }
    }
    if (r.cts_matched && r.status == Status::kOk && sendable) post_stripes(r);
  }
  update_done(r);
}

void SendCommImpl::flush_control() {
  if (batch_.count == 0) return;
  if (closed_ || peer_gone()) {
    batch_.count = 0;
    batched_.clear();
    return;
  }
  std::byte body[rts_bytes(kMaxBatch)];
  const std::size_t length = encode_rts(batch_, body);
  // An entry its decoder would refuse is loom's own bug: an empty message would leave both
  // sides waiting, so the batch's requests fail instead.
  const Status status =
      length == 0 ? refuse_batch("ready-to-send")
                  : send_control(MessageType::kReadyToSend, batch_.entries[0].seq, {body, length});
  if (status == Status::kRetry) {
    schedule_flush();
    return;
  }
  for (Request* r : batched_) {
    r->rts_sent = true;
    if (status != Status::kOk) {
      r->fail(Status::kError, "isend: " + last_error_);
      r->abandoned = true;
    }
    update_done(*r);
  }
  batch_.count = 0;
  batched_.clear();
}

void SendCommImpl::post_stripes(Request& r) {
  Part& part = r.parts[0];
  const Clearance& clearance = clearances_[part.seq % kSeqWindow];
  const std::uint64_t* keys = &keys_[(part.seq % kSeqWindow) * key_stride_];
  const std::uint32_t immediate =
      mux::encode_immediate({peer_id_, static_cast<std::uint16_t>(part.seq & mux::kImmSeqMask),
                             !r.rts_needed, r.stripes});
  const std::size_t base = r.stripes == 0 ? 0 : part.size / r.stripes;
  while (r.stripes_posted < r.stripes) {
    const std::size_t i = r.stripes_posted;
    // Even split; the last stripe takes the remainder.
    const std::size_t offset = i * base;
    const std::size_t length = i + 1 == r.stripes ? part.size - offset : base;
    const std::size_t rail = (part.seq + i) % data_rails_;
    ofi::Rail& data_rail = lane_->rails().data(rail);
    const Status status =
        data_rail.write(peer_data_[rail], part.data + offset, length, part.registration->desc(rail),
                        clearance.address + offset, keys[rail], immediate, &r.ops[i]);
    if (status == Status::kRetry) {
      queue_retry(r);
      return;
    }
    if (status != Status::kOk) {
      r.fail(Status::kError, "isend: " + data_rail.last_error());
      r.abandoned = true;
      return;
    }
    ++r.stripes_posted;
    ++writes_posted_[part.seq % kSeqWindow];
    ++r.ops_outstanding;
  }
}

void SendCommImpl::match(Request& r) {
  Part& part = r.parts[0];
  Clearance& clearance = clearances_[part.seq % kSeqWindow];
  clearance.valid = false;
  r.cts_matched = true;
  if (clearance.refused) {
    r.fail(Status::kError, "isend: the peer's receive for message " + std::to_string(part.seq) +
                               " failed; nothing was sent");
  } else if (clearance.size < part.size) {
    r.fail(Status::kTruncated, "isend: message of " + std::to_string(part.size) +
                                   " bytes is larger than the peer's posted buffer of " +
                                   std::to_string(clearance.size) + " bytes (message " +
                                   std::to_string(part.seq) + ")");
  } else if (clearance.tag != part.tag) {
    r.fail(Status::kInvalid,
           "isend: tag " + std::to_string(part.tag) + " does not match the peer's buffer tag " +
               std::to_string(clearance.tag) + " (message " + std::to_string(part.seq) + ")");
  }
  if (r.status != Status::kOk) {
    // Refused: no payload goes, only a ready-to-send, from which the receiver reaches the same
    // verdict (and cancels an eager receive if one waits); none for a receive that failed over
    // there, whose buffer is back with the application. Never a truncated receive on the wire:
    // rxm over tcp without a shared receive queue drops the connection on one. Never an eager
    // message into a buffer with no receive posted: it would wait unmatched forever.
    r.eager = false;
    r.stripes = part.size == 0 ? 0 : 1;
    r.rts_needed = !clearance.refused;
    return;
  }
  if (r.eager && !clearance.eager_receive) {
    // A buffer above the receiver's eager limit: no receive waits there, so the message is
    // written (an empty one needs no write: its ready-to-send carries it).
    r.eager = false;
    r.stripes = part.size == 0 ? 0 : stripe_count(part.size);
    --stats_.eager;
    ++stats_.rendezvous;
  }
  // A written message that fills its buffer says so in its writes' CQ data (an empty one never
  // does: a buffer without an eager receive is above the eager limit). Otherwise the receiver
  // hears the size from a ready-to-send, which also makes it cancel an eager receive waiting
  // in the buffer (a receiver whose eager limit is above ours).
  r.rts_needed = !r.eager && (part.size != clearance.size || clearance.eager_receive);
}

void SendCommImpl::update_done(Request& r) {
  Part& part = r.parts[0];
  if (part.done) return;
  const bool ok = r.status == Status::kOk;
  if (r.eager) {
    part.done = (r.local_done && (r.cts_matched || !ok)) || (r.abandoned && !r.eager_posted);
  } else if (ok) {
    // The ready-to-send, where one is needed, is part of the message: a send done before it
    // left would never queue it (advance() skips done parts) and the receiver would wait.
    part.done = r.cts_matched && r.stripes_done == r.stripes && (!r.rts_needed || r.rts_sent);
  } else {
    // Failed: done once the receiver was told (ready-to-send) and no write is in flight.
    part.done = (!r.rts_needed || r.rts_sent || r.abandoned) && r.stripes_done == r.stripes_posted;
  }
  if (part.done && ok) part.delivered = part.size;
}

// Handed to the provider whole: the payload (and a ready-to-send where one is needed) left, or
// the message failed with a verdict the receiver reaches too.
CloseNotice SendCommImpl::close_notice() {
  std::vector<std::uint32_t> unfinished;
  for (const Request& r : requests_.built()) {
    if (!r.in_use || r.kind != RequestKind::kSend || r.parts[0].done) continue;
    const bool told = !r.rts_needed || r.rts_sent;
    const bool left = r.status != Status::kOk
                          ? told
                          : (r.eager ? r.eager_posted : r.stripes_posted == r.stripes && told);
    if (!left) unfinished.push_back(r.parts[0].seq);
  }
  return notice_for(next_seq_, unfinished);
}

// The receiver waits for the writes already posted towards what it did not finish, those of
// sends that completed here included (their records may be back in the pool).
void SendCommImpl::send_writes_posted(const CloseNotice& notice) {
  WritesPosted answer;
  for (std::uint32_t seq = notice.complete_below; seq_before(seq, next_seq_); ++seq) {
    if (!notice.finished(seq)) answer.writes += writes_posted_[seq % kSeqWindow];
  }
  std::byte bytes[kWritesPostedBytes];
  const std::size_t length = encode_writes_posted(answer, bytes);
  (void)send_control(MessageType::kWritesPosted, 0, {bytes, length}, true);
}

void SendCommImpl::fail_unfinished(const CloseNotice& notice, const std::string& why) {
  if (notice.awaits_writes && !closed_) send_writes_posted(notice);
  for (Request& r : requests_.built()) {
    Part& part = r.parts[0];
    if (!r.in_use || r.kind != RequestKind::kSend || part.done) continue;
    // Arrived over there: its own completions finish it, with their outcome.
    if (notice.finished(part.seq) && r.status == Status::kOk) continue;
    r.fail(Status::kPeerError,
           "isend: " + why + " before receiving message " + std::to_string(part.seq));
    part.status = Status::kPeerError;
    part.done = true;  // finished() still waits for writes in flight
    r.abandoned = true;
  }
}

// The receiver said it had these messages: they are delivered, whether or not the provider
// ever hands back their sends (shm needs the peer's progress for that).
void SendCommImpl::settle_after_close() {
  for (Request& r : requests_.built()) {
    Part& part = r.parts[0];
    if (!r.in_use || r.kind != RequestKind::kSend || part.done) continue;
    part.done = true;
    if (r.status == Status::kOk) part.delivered = part.size;
  }
}

// Sends are never cancelled by loom: a provider that cancels one (rxm, when the connection to
// a peer that died or closed goes down) says the peer is gone.
void SendCommImpl::fail_send(Request& r, const ofi::Completion& completion) {
  const std::string text(completion.error_text);
  if (completion.status == Status::kCancelled) {
    r.fail(Status::kPeerError,
           "isend: the provider cancelled the send: the connection to the "
           "peer is gone" +
               (text.empty() ? "" : " (" + text + ")"));
  } else if (completion.status == Status::kPeerError) {
    r.fail(Status::kPeerError, "isend: the connection to the peer is gone: " + text);
  } else {
    r.fail(Status::kError, "isend: " + text);
  }
}

void SendCommImpl::on_op(Request& r, std::size_t, const ofi::Completion& completion) {
  --r.ops_outstanding;
  if (completion.status != Status::kOk) [[unlikely]]
    fail_send(r, completion);
  if (r.eager) {
    r.local_done = true;
  } else {
    ++r.stripes_done;
  }
  update_done(r);
}

void SendCommImpl::on_control(const mux::ControlHeader& header, std::span<const std::byte> body) {
  if (on_liveness(header)) return;
  const auto type = static_cast<MessageType>(header.type);
  if (type == MessageType::kClose) {
    on_peer_close(body);
    return;
  }
  // A clear-to-send that crossed the peer's close notice: its buffers are gone.
  if (peer_gone()) return;
  const CtsReader cts(type == MessageType::kClearToSend ? body : std::span<const std::byte>{});
  const char* why =
      type != MessageType::kClearToSend ? "unexpected message type for a sender" : cts.error();
  if (why == nullptr && cts.data_rails() < data_rails_) why = "clear-to-send names too few rails";
  if (why != nullptr) [[unlikely]] {
    util::log().warn("comm {} on lane {}: control message dropped: {}", id_, lane_->id(), why);
    return;
  }
  for (std::size_t i = 0; i < cts.count(); ++i) {
    const CtsEntryView entry = cts.entry(i);
    const std::size_t slot = entry.seq % kSeqWindow;
    clearances_[slot] = Clearance{
        true, entry.seq, entry.size, entry.tag, entry.eager_receive, entry.refused, entry.address};
    // The keys of every rail our lane has (data_rails_ never exceeds it): the message can
    // arrive before our own handshake finished (data_rails_ still 0) when the receiver posts
    // right after accepting.
    std::memcpy(&keys_[slot * key_stride_], entry.keys,
                8 * std::min(key_stride_, cts.data_rails()));
    Request* r = waiting_[slot];
    if (r != nullptr && r->in_use && r->kind == RequestKind::kSend &&
        r->parts[0].seq == entry.seq && !r->cts_matched) {
      match(*r);
      advance(*r);
    }
  }
}

void SendCommImpl::on_remote_write(mux::WriteImmediate immediate) {
  util::log().warn("comm {} on lane {}: remote write (seq {}) on a sending communicator dropped",
                   id_, lane_->id(), immediate.seq);
}

}  // namespace loom::p2p
