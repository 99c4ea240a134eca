// The sending communicator: isend, and the dispatch of provider completions and control
// messages to the protocol concerns (clear_to_send.cpp, eager.cpp, rendezvous.cpp, close.cpp).
#include "p2p/send_comm.hpp"

#include <algorithm>
#include <cstring>

#include "ofi/memory_registration.hpp"
#include "util/log.hpp"

namespace loom::p2p {

SendCommImpl::SendCommImpl(ContextCore& core, mux::Lane& lane, std::uint64_t peer)
    : Comm(core, lane, mux::Direction::kSend, peer),
      min_stripe_(settings_.min_stripe),
      max_size_(max_message_size(lane.rails().max_msg_size())),
      outgoing_(lane.rails().data_rails()) {
  batched_.reserve(kMaxBatch);
}

SendCommImpl::Outgoing& SendCommImpl::claim_outgoing(std::uint32_t seq) {
  return outgoing_.claim(seq, [this](const auto& slot) {
    if (seq_before(slot.seq, floor_)) return false;
    floor_ = in_flight_floor();  // it only moves up: worth a look only when it says "in use"
    return !seq_before(slot.seq, floor_);
  });
}

std::uint32_t SendCommImpl::in_flight_floor() const noexcept {
  std::uint32_t oldest = next_seq_;
  for (const Request& r : requests_.in_use(RequestKind::kSend)) {
    if (seq_before(r.parts[0].seq, oldest)) oldest = r.parts[0].seq;
  }
  return oldest - static_cast<std::uint32_t>(kMaxParts - 1);
}

Status SendCommImpl::isend(const void* data, std::size_t size, Tag tag, const MemoryRegion& region,
                           loom::Request& handle) {
  handle = {};
  std::unique_lock lock(lane_->lock());
  if (closed_ || peer_gone()) [[unlikely]]
    return refuse_post("isend");
  const ofi::MemoryRegistration* registration = nullptr;
  if (size != 0) {
    registration = lookup(region, data, size);
    if (registration == nullptr) [[unlikely]]
      return Status::kInvalid;
  }
  if (size > max_size_) [[unlikely]]
    return refuse_size(size);
  // The common small send leaves before any bookkeeping and is done at its post: no request,
  // nothing for a test to find (a pool of pending requests does not hold it back either).
  if (Outgoing* sent = inject_first(data, size, tag, registration, next_seq_)) {
    const std::uint32_t seq = next_seq_++;
    trail_ask(asked_until_, seq);
    sent->send = nullptr;
    note_sent_ahead(sent, tag);
    ahead_next_ = seq + 1;
    handle = done_at_post(seq, size);
    count_message(size);  // as test() counts a send it reports done
    lock.unlock();
    kick_other_lanes();
    return Status::kOk;
  }
  // A clearance that came carried on the peer's last message waits in our inbox (our receiving
  // lane put it there). A message that cannot go ahead on a credit needs it now; one that can
  // leaves at once and meets its clearance at the next progress. Before this message has a
  // sequence number: what the inbox holds settles only messages posted before it.
  if (const std::size_t count = fragments_for(size, registration); count == 0 || credits_ < count)
    lane_->drain_inbox();
  Request* r = allocate(RequestKind::kSend);
  if (r == nullptr) [[unlikely]]
    return refuse_full("isend");
  const std::uint32_t seq = next_seq_++;
  trail_ask(asked_until_, seq);
  r->part_count = 1;
  Part& part = r->parts[0];
  part = Part{.data = static_cast<std::byte*>(const_cast<void*>(data)),
              .size = size,
              .tag = tag,
              .registration = registration,
              .seq = seq,
              .peer_seq = seq};
  if (registration != nullptr) hold_region(part, region);
  claim_outgoing(seq).send = r;
  if (group_known(seq)) {
    part.peer_seq = place(seq, tag);
    match(*r);
  } else if (ahead_next_ == seq && goes_ahead(part)) [[likely]] {
    // Next in line, on a credit: send_ahead_waiting's first step, without looking it up.
    post_eager(*r);
    if (part.send != SendState::kAwaitingClearance) ahead_next_ = seq + 1;  // else pushed back
  } else {
    send_ahead_waiting();  // this one too, on a credit, unless older ones wait for credits
  }
  if (!terminal(part.send)) advance(*r);
  handle = handle_of(*r);
  lock.unlock();
  // Clear-to-sends batched on our receive lanes follow this message: the peer may be waiting
  // for them to send what we wait for next, but not before this one.
  kick_other_lanes();
  return Status::kOk;
}

Status SendCommImpl::refuse_size(std::size_t size) {
  const std::size_t max_msg = lane_->rails().max_msg_size();
  return reject(Status::kInvalid, "isend: " + std::to_string(size) + " bytes do not fit in " +
                                      std::to_string(kMaxSendStripes) + " writes of at most " +
                                      std::to_string(max_msg) + " bytes (max_msg_size of " +
                                      settings_.provider + ")");
}

// Posts what the part's state allows. Closing: what has not left stays (the close notice
// tells the receiver it never will).
void SendCommImpl::advance(Request& r) {
  Part& part = r.parts[0];
  if (!closed_) {
    switch (part.send) {
      case SendState::kAwaitingClearance:
        send_ahead_waiting();  // a send ahead the provider pushed back
        // Still waiting: its buffer may be one the receiver announces only when asked.
        if (part.send == SendState::kAwaitingClearance && part.fragments_sent == 0 &&
            asks_promptly(part) && !seq_before(part.seq, asked_until_)) {
          defer();
        }
        break;
      case SendState::kEagerReady:
        post_eager(r);
        break;
      case SendState::kWriting:
      case SendState::kFailing:
        if (r.ready_to_send == ReadyToSendState::kWanted) queue_ready_to_send(r);
        if (part.send == SendState::kWriting) post_stripes(r);
        break;
      default:
        break;
    }
  }
  settle(r);
}

// Where a written message's counters become its outcome: done once everything it needs left
// and completed (all stripes written, the ready-to-send sent where wanted); failed once it owes
// nothing more, or nothing more can drain (the peer is gone, or the communicator closing).
void SendCommImpl::settle(Request& r) {
  Part& part = r.parts[0];
  switch (part.send) {
    case SendState::kWriting:
      if (r.stripes_done == r.stripes && !r.owes_ready_to_send()) {
        part.delivered = part.size;
        part.to(SendState::kDone);
      }
      break;
    case SendState::kFailing:
      if ((r.ops_outstanding == 0 && !r.owes_ready_to_send()) || closed_ || peer_gone()) {
        part.to(SendState::kFailed);
      }
      break;
    default:
      break;
  }
}

// Nothing more is posted for a failed part: a ready-to-send not batched yet stays unsent, and
// what a written message has in flight drains (kFailing) before settle() decides it. A part
// with nothing that could drain fails at once.
void SendCommImpl::fail_part(Request& r, Part& part, Status status) {
  if (terminal(part.send)) return;
  part.status = status;
  if (r.ready_to_send == ReadyToSendState::kWanted) r.to(ReadyToSendState::kDropped);
  if (part.send == SendState::kFailing) {
    settle(r);
  } else if (legal(part.send, SendState::kFailing) &&
             (r.ops_outstanding != 0 || r.owes_ready_to_send())) {
    part.to(SendState::kFailing);
    settle(r);
  } else {
    part.to(SendState::kFailed);
  }
}

void SendCommImpl::on_op(Request& r, std::size_t index, const ofi::Completion& completion) {
  --r.ops_outstanding;
  Part& part = r.parts[0];
  if (completion.status != Status::kOk) [[unlikely]]
    fail_send(r, completion);
  if (part.send == SendState::kEagerInFlight) {
    if (r.status == Status::kOk) {
      part.delivered = part.size;
      part.to(SendState::kDone);
    } else {
      part.status = r.status;
      part.to(SendState::kFailed);
    }
    return;
  }
  const auto bit = static_cast<std::uint8_t>(1u << index);
  if ((r.bodies & bit) != 0 && (r.written & bit) == 0) {
    // A stripe's body (Profile::peer_paced_above): its rest, with the CQ data, may go now.
    if (r.status == Status::kOk) {
      r.bodies_done |= bit;
      if (part.send == SendState::kWriting) post_stripes(r);
    } else if (part.send == SendState::kWriting) {
      fail_part(r, part, r.status);
    }
    settle(r);
    return;
  }
  ++r.stripes_done;
  if (r.status != Status::kOk && part.send == SendState::kWriting) fail_part(r, part, r.status);
  settle(r);
}

void SendCommImpl::on_control(const mux::ControlHeader& header, std::span<const std::byte> body) {
  if (on_liveness(header, body)) return;
  const auto type = static_cast<MessageType>(header.type);
  if (type == MessageType::kClose) {
    on_peer_close(body);
    return;
  }
  // A clear-to-send that crossed the peer's close notice: its buffers are gone.
  if (peer_gone()) return;
  if (type != MessageType::kClearToSend) [[unlikely]] {
    util::log().warn(
        "comm {} on lane {}: control message dropped: unexpected message type {} "
        "for a sender",
        id_, lane_->id(), header.type);
    return;
  }
  on_clear_to_send(body);
}

void SendCommImpl::on_remote_write(mux::WriteImmediate immediate) {
  util::log().warn("comm {} on lane {}: remote write (seq {}) on a sending communicator dropped",
                   id_, lane_->id(), immediate.seq);
}

}  // namespace loom::p2p
