// Eager: a message up to the eager limit goes as one tagged send (tag = kind | peer comm id |
// seq, CQ data = the user's tag) straight into the eager receive posted in its buffer, once the
// clear-to-send said that receive is there. The receiver keeps a quarter of each data rail's
// receive queue free of posted receives, and holds no more than its fair share of the rest
// (mux::Lane::may_post_receive).
#include "ofi/memory_registration.hpp"
#include "p2p/recv_comm.hpp"
#include "p2p/send_comm.hpp"

namespace loom::p2p {

// ---- sender ----

void SendCommImpl::post_eager(Request& r) {
  Part& part = r.parts[0];
  // No division for the common single rail: it would cost more than the rest of the choice.
  const std::size_t rail = data_rails_ <= 1 ? 0 : part.seq % data_rails_;
  ofi::Rail& data_rail = lane_->rails().data(rail);
  const std::uint64_t wire_tag = mux::encode_tag({mux::TagKind::kEager, peer_id_, part.seq});
  // An inject leaves no completion to generate and read: on shm that is a CQ write less under
  // the receiver's queue lock, which both processes take for every message.
  const bool inject = part.size <= inject_max_ && (part.registration == nullptr ||
                                                   part.registration->type() == MemoryType::kHost);
  const Status status =
      inject ? data_rail.tagged_inject(peer_data_[rail], part.data, part.size, wire_tag, part.tag)
             : data_rail.tagged_send(peer_data_[rail], part.data, part.size,
                                     part.registration ? part.registration->desc(rail) : nullptr,
                                     wire_tag, part.tag, &r.ops[0]);
  if (status == Status::kOk) {
    if (inject) {
      part.delivered = part.size;
      part.to(SendState::kDone);
    } else {
      ++r.ops_outstanding;
      part.to(SendState::kEagerInFlight);
    }
  } else if (status == Status::kRetry) {
    retry_later(r);
  } else {
    r.fail(Status::kError, "isend: " + data_rail.last_error());
    part.status = Status::kError;
    part.to(SendState::kFailed);
  }
}

// ---- receiver ----

// A buffer above the eager limit gets no eager receive: it would be posted, then cancelled for
// every large message (an error completion to read). Its sender writes instead, whatever the
// message's size (see SendCommImpl::match).
bool RecvCommImpl::post_receive(Request& r, std::size_t i) {
  Part& part = r.parts[i];
  if (part.recv != RecvState::kAwaitingPost) return true;
  if (part.size > eager_max_) {
    part.by_write = true;
    part.to(RecvState::kToAnnounce);
    return true;
  }
  const std::size_t rail = part.seq % data_rails_;
  ofi::Rail& data_rail = lane_->rails().data(rail);
  // Leaves part of the provider's queue free of posted receives (Lane::may_post_receive).
  const Status status =
      !lane_->may_post_receive(rail, receives_held_)
          ? Status::kRetry
          : data_rail.tagged_recv(
                part.data, part.size, part.registration ? part.registration->desc(rail) : nullptr,
                mux::encode_tag({mux::TagKind::kEager, id_, part.seq}), 0, &r.ops[i]);
  if (status == Status::kOk) {
    part.recv_outstanding = true;
    ++r.ops_outstanding;
    lane_->receive_posted(rail);
    ++receives_held_;
  } else if (status == Status::kRetry) {
    retry_later(r);
    return false;
  } else {
    // Announced as refused: the sender learns that nothing may go into the buffer.
    part.status = Status::kError;
    r.fail(Status::kError, "irecv: " + data_rail.last_error());
  }
  part.to(RecvState::kToAnnounce);
  return true;
}

// The eager receive's completion: the message, or the end of a receive being taken back.
void RecvCommImpl::on_eager(Request& r, Part& part, const ofi::Completion& completion) {
  // The message every eager receive waits for: it fits (the provider truncates what does
  // not) and carries the buffer's tag.
  if (completion.status == Status::kOk && part.recv == RecvState::kCleared && completion.has_data &&
      completion.data == part.tag) [[likely]] {
    part.delivered = completion.length;
    ++stats_.eager;
    part.to(RecvState::kDone);
    return;
  }
  if (completion.status == Status::kCancelled) {
    if (part.recv == RecvState::kWriting) {
      finish_rendezvous(part);  // its message comes by write
    } else if (part.recv == RecvState::kCancelling) {
      part.to(RecvState::kFailed);
    } else {
      part.status = Status::kCancelled;
      r.fail(Status::kCancelled, "irecv: cancelled");
      part.to(RecvState::kFailed);
    }
    return;
  }
  if (part.recv == RecvState::kCancelling) {
    part.to(RecvState::kFailed);  // failed already; whatever came is not delivered
    return;
  }
  const BufferFacts buffer{part.size, part.tag, false};
  Verdict verdict = Verdict::kFits;
  switch (completion.status) {
    case Status::kOk:
      if (part.recv != RecvState::kCleared) [[unlikely]] {
        part.status = Status::kError;
        r.fail(Status::kError, "irecv: an eager message " + std::to_string(part.seq) +
                                   " arrived for a buffer being written");
        part.to(RecvState::kFailed);
        return;
      }
      verdict = judge(buffer, completion.length, completion.has_data ? completion.data : ~part.tag);
      part.delivered = completion.length;
      if (verdict == Verdict::kFits) {
        ++stats_.eager;
        part.to(RecvState::kDone);
        return;
      }
      part.status = status_of(verdict);
      r.fail(part.status, explain(verdict, Side::kReceiver, part.seq, buffer, completion.length,
                                  completion.data));
      break;
    case Status::kTruncated:
      part.status = Status::kTruncated;
      r.fail(Status::kTruncated, explain(Verdict::kTooLarge, Side::kReceiver, part.seq, buffer,
                                         completion.length + completion.overflow, part.tag));
      break;
    default:
      // kPeerError: the connection to the peer is gone; kError: anything else.
      part.status = completion.status == Status::kPeerError ? Status::kPeerError : Status::kError;
      r.fail(part.status, "irecv: " + std::string(completion.error_text));
  }
  part.to(RecvState::kFailed);
}

}  // namespace loom::p2p
