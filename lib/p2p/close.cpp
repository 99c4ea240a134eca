// Close: each side tells its peer how far it got (a CloseNotice), so that what was handed over
// before the close still finishes on the other side and only the rest fails. A receiver that
// closes with buffers the sender may still be writing into waits for those writes (the sender
// answers with WritesPosted). Both ends of each step are in this file; the outcomes are in
// README's Failures section.
#include <chrono>
#include <thread>

#include "p2p/comm.hpp"
#include "p2p/recv_comm.hpp"
#include "p2p/send_comm.hpp"
#include "util/log.hpp"

namespace loom::p2p {
namespace {

// How long close() waits for the provider to hand back operations of the communicator before
// leaving them to the lane (freed once they complete, at the latest when its endpoints close).
constexpr auto kCloseDrain = std::chrono::milliseconds(200);

}  // namespace

void Comm::on_peer_close(std::span<const std::byte> body) {
  if (peer_gone()) return;
  CloseNotice notice;
  if (const char* why = decode_close(body, notice)) [[unlikely]] {
    peer_lost(std::string("the peer closed the communicator with a bad close notice: ") + why);
    return;
  }
  peer_ = PeerState::kClosed;
  peer_gone_ = "the peer closed the communicator";
  close_deadline_ = std::chrono::steady_clock::now() + settings_.peer_timeout;
  util::log().debug("comm {} on lane {}: the peer closed; it finished messages below {}", id_,
                    lane_->id(), notice.complete_below);
  fail_unfinished(notice, peer_gone_);
}

CloseNotice Comm::notice_for(std::uint32_t next, const std::vector<std::uint32_t>& unfinished) {
  std::uint32_t below = next;
  for (std::uint32_t seq : unfinished)
    if (seq_before(seq, below)) below = seq;
  CloseNotice notice{.complete_below = below};
  // In-flight sequence numbers lie within kSeqWindow; one beyond the span counts unfinished.
  notice.span = static_cast<std::uint16_t>(std::min<std::uint32_t>(next - below, kCloseWindow));
  for (std::uint32_t offset = 0; offset < notice.span; ++offset) notice.set_finished(offset);
  for (std::uint32_t seq : unfinished) {
    const std::uint32_t offset = seq - below;
    if (offset < notice.span) {
      notice.finished_bits[offset / 8] &= static_cast<std::uint8_t>(~(1u << (offset % 8)));
    }
  }
  return notice;
}

void Comm::close(std::unique_ptr<Comm> self) {
  if (!self || self->closed_) return;
  mux::Lane& lane = *self->lane_;
  bool drained = false;
  {
    std::unique_lock lock(lane.mutex());
    // A close notice from the peer may be waiting: then the peer's endpoints may be gone, and
    // some providers (shm) cannot take a message for a closed endpoint.
    self->closed_ = true;
    lane.progress();
    util::log().debug("closing comm {} on lane {} (peer comm {}{})", self->id_, lane.id(),
                      self->peer_id_, self->peer_gone() ? ", the peer is gone" : "");
    const auto deadline = std::chrono::steady_clock::now() + kCloseDrain;
    if (!self->peer_gone() && !self->peer_control_.empty()) {
      // Tells the peer how far we got, so that what arrived stays delivered over there.
      std::byte body[close_notice_bytes(kCloseWindow)];
      const std::size_t length = encode_close(self->close_notice(), body);
      Status sent = self->send_control(MessageType::kClose, 0, {body, length}, true);
      while (sent == Status::kRetry && std::chrono::steady_clock::now() < deadline) {
        lane.progress();
        sent = self->send_control(MessageType::kClose, 0, {body, length}, true);
      }
    }
    self->fail_all(Status::kCancelled, "communicator closed");
    self->cancel_standing();
    // The close notice, too, must have left before the lane (perhaps) closes its endpoints.
    while ((!self->drained() || lane.control().sends_in_flight()) &&
           std::chrono::steady_clock::now() < deadline) {
      lane.progress();
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    // A receiver whose announced buffers a peer may still be writing into waits for those
    // writes: an endpoint closed under one (rxm over tcp crashes), or a buffer given back to
    // the application under one, is worse than a slower close.
    const auto writes_deadline = std::chrono::steady_clock::now() + self->settings_.peer_timeout;
    while (self->writes_may_arrive() && !self->peer_gone() &&
           std::chrono::steady_clock::now() < writes_deadline) {
      lane.progress();
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    drained = self->drained();
    // Operations still out keep using their registrations until the lane frees them.
    if (drained) {
      self->release_registrations();
      self->release_peer_addresses();
    }
    lane.detach(self->id_);
  }
  // The caller (loom::Communicator, or the handshake) keeps the context alive past leave().
  mux::LaneRegistry& lanes = self->lanes_;
  const std::uint64_t peer = self->peer_context_;
  if (!drained) {
    util::log().info(
        "communicator {} on lane {} closed with operations in flight; the lane "
        "frees it once they complete",
        self->id_, lane.id());
    std::lock_guard lock(lane.mutex());
    lane.retire(std::move(self));
  }
  self.reset();
  lanes.leave(lane, peer);
}

// ---- sender ----

// Handed to the provider whole: the payload (and a ready-to-send where one is needed) left, or
// the message failed with a verdict the receiver reaches too.
CloseNotice SendCommImpl::close_notice() {
  std::vector<std::uint32_t> unfinished;
  for (const Request& r : requests_.built()) {
    if (!r.in_use || r.kind != RequestKind::kSend) continue;
    const Part& part = r.parts[0];
    const bool told = r.ready_to_send == ReadyToSendState::kNotNeeded ||
                      r.ready_to_send == ReadyToSendState::kSent;
    bool left = true;
    switch (part.send) {
      case SendState::kAwaitingClearance:
      case SendState::kEagerReady:
        left = false;
        break;
      case SendState::kWriting:
        left = r.stripes_posted == r.stripes && told;
        break;
      case SendState::kFailing:
        left = told;
        break;
      case SendState::kSentAhead:
      case SendState::kEagerInFlight:
      case SendState::kDone:
      case SendState::kFailed:
        break;
    }
    if (!left) unfinished.push_back(part.seq);
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
    if (!r.in_use || r.kind != RequestKind::kSend || terminal(part.send)) continue;
    // Arrived over there: its own completions finish it, with their outcome.
    if (notice.finished(part.seq) && r.status == Status::kOk) continue;
    r.fail(Status::kPeerError,
           "isend: " + why + " before receiving message " + std::to_string(part.seq));
    part.status = Status::kPeerError;
    part.to(SendState::kFailed);  // finished() still waits for writes in flight
  }
}

// The receiver said it had these messages: they are delivered, whether or not the provider
// ever hands back their sends (shm needs the peer's progress for that).
void SendCommImpl::settle_after_close() {
  for (Request& r : requests_.built()) {
    Part& part = r.parts[0];
    if (!r.in_use || r.kind != RequestKind::kSend || terminal(part.send)) continue;
    const bool sent = part.send == SendState::kSentAhead ||
                      part.send == SendState::kEagerInFlight || part.send == SendState::kWriting;
    if (sent && r.status == Status::kOk) {
      part.delivered = part.size;
      part.to(SendState::kDone);
    } else {
      r.fail(Status::kPeerError, "isend: the peer closed the communicator");
      part.to(SendState::kFailed);
    }
  }
}

// ---- receiver ----

// Also readies the wait for writes still coming into unfinished buffers the sender was told of
// (see writes_may_arrive): called once, by close().
CloseNotice RecvCommImpl::close_notice() {
  std::vector<std::uint32_t> unfinished;
  for (const Request& r : requests_.built()) {
    if (!r.in_use || r.kind != RequestKind::kRecv) continue;
    for (std::size_t i = 0; i < r.part_count; ++i) {
      const Part& part = r.parts[i];
      // Arrived: its announcement, with the verdict, goes before this notice.
      if (terminal(part.recv) || part.recv == RecvState::kArrived) continue;
      unfinished.push_back(part.seq);
      const bool told = part.recv == RecvState::kCleared || part.recv == RecvState::kWritesAhead ||
                        part.recv == RecvState::kWriting;
      awaiting_writes_ = awaiting_writes_ || told;
      writes_seen_ += part.writes_seen;
    }
  }
  CloseNotice notice = notice_for(next_seq_, unfinished);
  notice.awaits_writes = awaiting_writes_;
  return notice;
}

bool RecvCommImpl::writes_may_arrive() const noexcept {
  return awaiting_writes_ && (!writes_posted_ || writes_seen_ < *writes_posted_);
}

void RecvCommImpl::on_writes_posted(std::span<const std::byte> body) {
  WritesPosted answer;
  if (const char* why = decode_writes_posted(body, answer)) {
    util::log().warn("comm {} on lane {}: {}", id_, lane_->id(), why);
    awaiting_writes_ = false;  // nothing to count on: the close waits no longer
  } else {
    writes_posted_ = answer.writes;
  }
}

void RecvCommImpl::fail_unfinished(const CloseNotice& notice, const std::string& why) {
  for (Request& r : requests_.built()) {
    if (!r.in_use || r.kind != RequestKind::kRecv) continue;
    for (std::size_t i = 0; i < r.part_count; ++i) {
      Part& part = r.parts[i];
      // The sender handed the message over whole: it is on its way.
      if (terminal(part.recv) || notice.finished(part.seq)) continue;
      r.fail(Status::kPeerError,
             "irecv: " + why + " before sending message " + std::to_string(part.seq));
      fail_part(r, part, Status::kPeerError);
    }
  }
}

void RecvCommImpl::settle_after_close() {
  fail_all(Status::kPeerError,
           "the peer closed the communicator and what it had sent did not arrive within "
           "LOOM_PEER_TIMEOUT_MS (" +
               std::to_string(settings_.peer_timeout.count()) + " ms)");
}

}  // namespace loom::p2p
