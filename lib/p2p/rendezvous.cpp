// Rendezvous: a message that does not go eagerly (above the receiver's eager size, or no
// credit left when its buffer's clear-to-send came) is written with fi_writedata in stripes over
// the data rails (fi_inject_writedata, with no completion, where it fits an inject and the
// provider's profile allows), each carrying comm id | seq | fills | stripe count as remote CQ
// data. A message that fills its buffer says so in that CQ data and nothing else goes; otherwise
// a ready-to-send carries size and tag (an empty message rides on it alone) and the receiver
// judges it as the sender did (verdict.hpp).
#include <algorithm>

#include "ofi/memory_registration.hpp"
#include "p2p/recv_comm.hpp"
#include "p2p/send_comm.hpp"
#include "util/log.hpp"

namespace loom::p2p {

// ---- sender ----

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

void SendCommImpl::queue_ready_to_send(Request& r) {
  if (batch_.count == kMaxBatch) send_control_batch();
  if (batch_.count == kMaxBatch) {
    retry_later(r);  // the batch is stuck behind back-pressure: try again later
    return;
  }
  const Part& part = r.parts[0];
  batch_.entries[batch_.count++] =
      RtsEntry{.seq = part.peer_seq, .size = part.size, .tag = part.tag, .stripes = r.stripes};
  batched_.push_back(&r);
  r.to(ReadyToSendState::kBatched);
  defer();
}

void SendCommImpl::send_control_batch() {
  ask_for_clearances();
  if (batch_.count == 0) return;
  if (closed_ || peer_gone()) {
    batch_.count = 0;
    batched_.clear();
    return;
  }
  if (control_held()) [[unlikely]] {
    defer();
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
    defer();
    return;
  }
  for (Request* r : batched_) {
    if (r->ready_to_send != ReadyToSendState::kBatched) continue;
    if (status == Status::kOk) {
      r->to(ReadyToSendState::kSent);
      settle(*r);
    } else {
      r->to(ReadyToSendState::kDropped);
      r->fail(Status::kError, "isend: " + last_error_);
      fail_part(*r, r->parts[0], Status::kError);
    }
  }
  batch_.count = 0;
  batched_.clear();
}

// Posts what each stripe is ready for, stripe by stripe in bits of `written`: its write with
// the CQ data; where the provider paces long writes by the peer (paced_above_), first its body
// without CQ data, and the rest once that completed (on_op).
void SendCommImpl::post_stripes(Request& r) {
  if (r.stripes == 0) return;  // an empty message: its ready-to-send says all
  Part& part = r.parts[0];
  const Clearance& clearance = announcement(part.peer_seq);
  const std::uint64_t* keys = outgoing_.extras(part.peer_seq);
  const bool fills = r.ready_to_send == ReadyToSendState::kNotNeeded;
  const std::uint32_t immediate = mux::encode_immediate(
      {peer_id_, static_cast<std::uint16_t>(part.peer_seq & mux::kImmSeqMask), fills, r.stripes});
  const std::size_t base = part.size / r.stripes;
  const bool host = part.registration->type() == MemoryType::kHost;
  for (std::size_t i = 0; i < r.stripes; ++i) {
    const auto bit = static_cast<std::uint8_t>(1u << i);
    if ((r.written & bit) != 0) continue;
    // Even split; the last stripe takes the remainder.
    const std::size_t offset = i * base;
    const std::size_t length = i + 1 == r.stripes ? part.size - offset : base;
    const std::size_t rail = (part.seq + i) % data_rails_;
    ofi::Rail& data_rail = lane_->rails().data(rail);
    void* desc = part.registration->desc(rail);
    const bool paced = paced_above_ != 0 && host && length > paced_above_;
    const std::size_t body = paced ? length : 0;
    if (body != 0) {
      if ((r.bodies & bit) == 0) {
        const Status status = data_rail.write(peer_data_[rail], part.data + offset, body, desc,
                                              clearance.address + offset, keys[rail], &r.ops[i]);
        if (status != Status::kOk) {
          break_or_retry(r, data_rail, status);
          return;
        }
        r.bodies |= bit;
        ++r.ops_outstanding;
        // shm completes a write it could make itself in the call: the CQ data goes at once
        // (from on_op, which calls this again).
        data_rail.progress();
        if (part.send != SendState::kWriting) return;  // failed meanwhile
      }
      if ((r.written & bit) != 0 || (r.bodies_done & bit) == 0) continue;
    }
    // An injected stripe is written once the call returns: no completion comes for it. A
    // body's CQ data goes as an empty write after it.
    const bool inject = inject_writes_ && (body != 0 || injects(part.size, part.registration));
    const std::size_t at = offset + body;
    const Status status =
        inject ? data_rail.inject_write(peer_data_[rail], part.data + at, length - body,
                                        clearance.address + at, keys[rail], immediate)
               : data_rail.write(peer_data_[rail], part.data + at, length - body, desc,
                                 clearance.address + at, keys[rail], immediate, &r.ops[i]);
    if (status != Status::kOk) {
      break_or_retry(r, data_rail, status);
      return;
    }
    r.written |= bit;
    ++r.stripes_posted;
    ++writes_posted_;
    if (inject) {
      ++r.stripes_done;
    } else {
      ++r.ops_outstanding;
    }
  }
}

void SendCommImpl::break_or_retry(Request& r, ofi::Rail& rail, Status status) {
  if (status == Status::kRetry) {
    retry_later(r);
    return;
  }
  r.fail(Status::kError, "isend: " + rail.last_error());
  fail_part(r, r.parts[0], Status::kError);
  break_off(rail.last_error());
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
    break_off(text);
  }
}

// ---- receiver ----

void RecvCommImpl::finish_rendezvous(Part& part) {
  if (part.recv != RecvState::kWriting) return;
  if (part.writes_seen < part.writes_expected) return;
  ++stats_.rendezvous;
  part.to(RecvState::kDone);
}

void RecvCommImpl::on_ready_to_send(std::span<const std::byte> body) {
  ReadyToSend batch;
  if (const char* why = decode_rts(body, batch)) [[unlikely]] {
    util::log().warn("comm {} on lane {}: ready-to-send dropped: {}", id_, lane_->id(), why);
    return;
  }
  for (std::size_t k = 0; k < batch.count; ++k) {
    const RtsEntry& rts = batch.entries[k];
    Request* r = nullptr;
    std::size_t i = 0;
    // The sender answers a clear-to-send: the buffer is posted, unless it failed meanwhile.
    Part* part = waiting_part(rts.seq, ~0u, &r, &i);
    if (part != nullptr &&
        (part->recv == RecvState::kCleared || part->recv == RecvState::kWritesAhead)) {
      apply_ready_to_send(*r, i, rts);
      continue;
    }
    util::log().warn(
        "comm {} on lane {}: ready-to-send for message {} dropped: no buffer "
        "waits for it",
        id_, lane_->id(), rts.seq);
  }
}

// What the sender says the message is; the receiver's verdict matches the sender's.
void RecvCommImpl::apply_ready_to_send(Request& r, std::size_t i, const RtsEntry& rts) {
  Part& part = r.parts[i];
  if (part.recv == RecvState::kWritesAhead && part.writes_expected != rts.stripes) {
    part.status = Status::kError;
    r.fail(Status::kError, "irecv: stripe counts disagree for message " + std::to_string(rts.seq));
  }
  part.writes_expected = rts.stripes;
  const Announcement buffer{.seq = part.seq, .size = part.size, .tag = part.tag};
  const Verdict verdict = judge(buffer, rts.size, rts.tag);
  if (verdict != Verdict::kFits) {
    part.status = status_of(verdict);
    r.fail(part.status, explain(verdict, Side::kReceiver, rts.seq, buffer, rts.size, rts.tag));
  } else if (part.status == Status::kOk) {
    part.delivered = rts.size;
  }
  if (part.status != Status::kOk) {
    fail_part(r, part, part.status);
    return;
  }
  part.to(RecvState::kWriting);
  finish_rendezvous(part);
}

void RecvCommImpl::on_remote_write(mux::WriteImmediate immediate) {
  ++writes_arrived_;
  if (closed_) return;  // one of those the close waits for
  Request* r = nullptr;
  std::size_t i = 0;
  Part* part = waiting_part(immediate.seq, mux::kImmSeqMask, &r, &i);
  if (part == nullptr) [[unlikely]] {
    util::log().warn("comm {} on lane {}: remote write for message {} that no buffer waits for",
                     id_, lane_->id(), immediate.seq);
    return;
  }
  switch (part->recv) {
    case RecvState::kCleared:
      // Cleared: announced with status kOk (batch_left), so the write is welcome.
      part->writes_expected = immediate.stripes;
      if (immediate.fills) {
        // What a ready-to-send would say, with no verdict to reach: the message is the
        // buffer's own size (the sender checked it and the tag).
        part->delivered = part->size;
        part->to(RecvState::kWriting);
      } else {
        part->to(RecvState::kWritesAhead);  // its ready-to-send is still on the way
      }
      break;
    case RecvState::kWritesAhead:
    case RecvState::kWriting:
      if (immediate.stripes != part->writes_expected) {
        part->status = Status::kError;
        r->fail(Status::kError,
                "irecv: stripe counts disagree for message " + std::to_string(part->seq));
        fail_part(*r, *part, Status::kError);
        return;
      }
      break;
    default:
      util::log().warn("comm {} on lane {}: remote write for message {} before its clear-to-send",
                       id_, lane_->id(), immediate.seq);
      return;
  }
  ++part->writes_seen;
  finish_rendezvous(*part);
}

}  // namespace loom::p2p
