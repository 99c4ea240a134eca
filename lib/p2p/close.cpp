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

void Comm::on_peer_close(std::span<const std::byte> body) {
  if (peer_gone()) return;
  CloseNotice notice;
  if (const char* why = decode_close(body, notice)) [[unlikely]] {
    peer_lost(std::string("the peer closed the communicator with a bad close notice: ") + why);
    return;
  }
  peer_ = PeerState::kClosed;
  switch (notice.reason) {
    case CloseReason::kClosed:
      peer_gone_ = "the peer closed the communicator";
      break;
    case CloseReason::kFailed:
      peer_gone_ = "the peer ended the communicator after a provider error on its side";
      break;
    case CloseReason::kLost:
      peer_gone_ =
          "the peer took this side for dead (it heard nothing from it for its "
          "LOOM_PEER_TIMEOUT_MS) and gave up on the communicator";
      break;
  }
  close_deadline_ = std::chrono::steady_clock::now() + settings_.peer_timeout;
  util::log().debug("comm {} on lane {}: the peer closed; it finished messages below {}", id_,
                    lane_->id(), notice.complete_below);
  if (notice.awaits_writes) {
    // The notice can come before our handshake gave us the peer's addresses (the listener
    // accepted and closed at once): the answer waits for them (connect_peer).
    if (peer_control_.empty()) {
      writes_posted_owed_ = true;
    } else {
      send_writes_posted();
    }
  }
  fail_unfinished(notice, Status::kPeerError, peer_gone_);
}

void Comm::break_off(const std::string& why) {
  if (peer_gone() || closed_) return;
  util::log().warn("comm {} on lane {}: ended after a provider error: {}", id_, lane_->id(), why);
  const CloseNotice notice = close_notice(CloseReason::kFailed);
  if (!peer_control_.empty()) send_close_notice(notice);
  peer_ = PeerState::kBroken;
  peer_gone_ = "the communicator ended after a provider error: " + why;
  fail_unfinished(notice, Status::kError, peer_gone_);
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
    std::unique_lock lock(lane.lock());
    // A close notice from the peer may be waiting: then the peer's endpoints may be gone, and
    // some providers (shm) cannot take a message for a closed endpoint.
    self->closed_ = true;
    lane.progress();
    util::log().debug("closing comm {} on lane {} (peer comm {}{})", self->id_, lane.id(),
                      self->peer_id_, self->peer_gone() ? ", the peer is gone" : "");
    if (!self->peer_gone() && !self->peer_control_.empty()) {
      const CloseNotice notice = self->close_notice(CloseReason::kClosed);
      self->await_writes(notice);
      self->send_close_notice(notice);
    }
    self->fail_all(Status::kCancelled, "communicator closed");
    self->cancel_standing();
    // Until the provider handed back our operations (a send still reads its buffer) and the
    // writes the peer posted into our announced buffers arrived (a receive buffer handed back
    // while one streams in would be written after the application freed it, and rxm over tcp
    // crashes closing an endpoint under one), unless the peer is lost: dead, or silent for
    // LOOM_PEER_TIMEOUT_MS. A live peer answers and drains even while its application is busy
    // elsewhere (LaneRegistry's background progress).
    self->since_check_ = SinceCheck::kWaitBegan;
    while ((!self->drained() || self->writes_may_arrive()) && !self->gave_up_on_peer()) {
      lane.progress();
      self->check_peer();
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
  const mux::Direction direction = self->direction_;
  if (!drained) {
    util::log().info(
        "communicator {} on lane {} closed with operations towards a lost peer in flight; the "
        "lane frees it once they complete or its endpoints close",
        self->id_, lane.id());
    std::lock_guard lock(lane.lock());
    lane.retire(std::move(self));
  }
  self.reset();
  lanes.leave(lane, peer, direction);
}

// Tells the peer how far we got, so that what arrived stays delivered over there. The first
// message to the peer's lane may have to wait until the provider reached it (the peer's
// progress does that): it waits in the control channel's outbox, which the lane keeps open
// for it, until the peer timeout.
void Comm::send_close_notice(const CloseNotice& notice) {
  std::byte body[close_notice_bytes(kCloseWindow)];
  const std::size_t length = encode_close(notice, body);
  constexpr std::size_t rail = 0;
  const Status status = lane_->control().send_or_queue(
      rail, peer_control_[rail], static_cast<std::uint8_t>(MessageType::kClose), peer_id_,
      {body, length}, std::chrono::steady_clock::now() + settings_.peer_timeout);
  if (status != Status::kOk) {
    util::log().debug("comm {} on lane {}: close notice not sent: {}", id_, lane_->id(),
                      lane_->control().rail(rail).last_error());
  }
}

// Closing: nothing more is waited for from the peer. It is lost, or it closed and what it left
// pending had LOOM_PEER_TIMEOUT_MS to arrive.
bool Comm::gave_up_on_peer() const noexcept {
  return peer_ == PeerState::kLost ||
         (peer_ == PeerState::kClosed && std::chrono::steady_clock::now() > close_deadline_);
}

// ---- sender ----

// Handed to the provider whole: the payload (and a ready-to-send where one is needed) left, or
// the message failed with a verdict the receiver reaches too.
CloseNotice SendCommImpl::close_notice(CloseReason reason) {
  std::vector<std::uint32_t> unfinished;
  for (const Request& r : requests_.in_use(RequestKind::kSend)) {
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
      case SendState::kFailed:
        // A verdict the receiver reaches only from the ready-to-send: failed here (a close
        // that matched it settles it at once) yet unfinished over there until that left.
        left = told;
        break;
      case SendState::kEagerInFlight:
      case SendState::kDone:
        break;
    }
    if (reason == CloseReason::kLost) left = terminal(part.send);
    if (!left) unfinished.push_back(part.peer_seq);
  }
  // The notice speaks of the receiver's buffers: a grouped receive's buffer that no message took
  // yet is unfinished, and a message placed beyond our next sequence number counts.
  std::uint32_t next = next_seq_;
  for (const auto& slot : outgoing_.slots()) {
    const Clearance& clearance = slot.entry.clearance;
    const std::uint32_t ahead = clearance.announcement.seq - next_seq_;  // a group's later buffers
    if (clearance.taken && ahead < kMaxParts && !seq_before(clearance.announcement.seq, next)) {
      next = clearance.announcement.seq + 1;
    }
  }
  for (const auto& slot : outgoing_.slots()) {
    const Clearance& clearance = slot.entry.clearance;
    if (clearance.valid && !clearance.taken && seq_before(clearance.announcement.seq, next) &&
        next - clearance.announcement.seq <= kSeqWindow) {
      unfinished.push_back(clearance.announcement.seq);
    }
  }
  CloseNotice notice = notice_for(next, unfinished);
  notice.writes_posted = writes_posted_;
  notice.reason = reason;
  return notice;
}

// The receiver waits until every write posted so far arrived. Closing too, this side still
// answers while its close waits for its own operations.
void SendCommImpl::send_writes_posted() {
  const WritesPosted answer{.writes = writes_posted_};
  std::byte bytes[kWritesPostedBytes];
  const std::size_t length = encode_writes_posted(answer, bytes);
  (void)send_control(MessageType::kWritesPosted, 0, {bytes, length}, true);
}

void SendCommImpl::fail_unfinished(const CloseNotice& notice, Status status,
                                   const std::string& why) {
  for (Request& r : requests_.in_use(RequestKind::kSend)) {
    Part& part = r.parts[0];
    if (terminal(part.send)) continue;
    // Arrived over there: its own completions finish it, with their outcome. The notice names
    // buffers: a message not placed in one never left; one sent ahead and not placed yet names
    // its own number, as the receiver's notice does for a grouped receive's buffer it took.
    const bool left = part.send != SendState::kAwaitingClearance;
    if (left && notice.finished(part.peer_seq) && r.status == Status::kOk) continue;
    r.fail(status, "isend: " + why + " (message " + std::to_string(part.seq) + ")");
    part.status = r.status;
    part.to(SendState::kFailed);  // finished() still waits for writes in flight
  }
}

// The receiver said it had these messages: they are delivered, whether or not the provider
// ever hands back their sends (shm needs the peer's progress for that).
void SendCommImpl::settle_after_close() {
  for (Request& r : requests_.in_use(RequestKind::kSend)) {
    Part& part = r.parts[0];
    if (terminal(part.send)) continue;
    const bool sent = part.send == SendState::kEagerInFlight || part.send == SendState::kWriting;
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

// awaits_writes: writes may still be coming into unfinished buffers the sender was told of.
CloseNotice RecvCommImpl::close_notice(CloseReason reason) {
  bool told_of_unfinished = false;
  std::vector<std::uint32_t> unfinished;
  for (const Request& r : requests_.in_use(RequestKind::kRecv)) {
    for (std::size_t i = 0; i < r.part_count; ++i) {
      const Part& part = r.parts[i];
      // Arrived: its announcement, with the verdict, goes before this notice.
      if (terminal(part.recv) || part.recv == RecvState::kArrived) continue;
      unfinished.push_back(part.seq);
      const bool told = part.recv == RecvState::kCleared || part.recv == RecvState::kWritesAhead ||
                        part.recv == RecvState::kWriting;
      told_of_unfinished = told_of_unfinished || told;
    }
  }
  unfinished.insert(unfinished.end(), unsettled_ahead_.begin(), unsettled_ahead_.end());
  CloseNotice notice = notice_for(next_seq_, unfinished);
  notice.awaits_writes = told_of_unfinished;
  notice.reason = reason;
  return notice;
}

// Closing waits for them (writes_may_arrive).
void RecvCommImpl::await_writes(const CloseNotice& notice) {
  if (close_wait_ != CloseWait::kCounting) {
    close_wait_ = notice.awaits_writes ? CloseWait::kAwaitingCount : CloseWait::kNone;
  }
}

bool RecvCommImpl::writes_may_arrive() const noexcept {
  switch (close_wait_) {
    case CloseWait::kNone:
      return false;
    case CloseWait::kAwaitingCount:
      return true;
    case CloseWait::kCounting:
      return static_cast<std::int32_t>(writes_posted_ - writes_arrived_) > 0;
  }
  return false;
}

void RecvCommImpl::on_writes_posted(std::span<const std::byte> body) {
  WritesPosted answer;
  if (const char* why = decode_writes_posted(body, answer)) {
    util::log().warn("comm {} on lane {}: {}", id_, lane_->id(), why);
    // Nothing to count on: the close waits no longer.
    if (close_wait_ == CloseWait::kAwaitingCount) close_wait_ = CloseWait::kNone;
  } else {
    writes_posted_ = answer.writes;
    close_wait_ = CloseWait::kCounting;
  }
}

void RecvCommImpl::fail_unfinished(const CloseNotice& notice, Status status,
                                   const std::string& why) {
  if (peer_ == PeerState::kClosed) {  // the sender's notice counts its writes
    writes_posted_ = notice.writes_posted;
    close_wait_ = CloseWait::kCounting;
  }
  for (Request& r : requests_.in_use(RequestKind::kRecv)) {
    for (std::size_t i = 0; i < r.part_count; ++i) {
      Part& part = r.parts[i];
      // The sender handed the message over whole: it is on its way. One that came ahead into a
      // grouped receive goes by its own number until the sender placed it (p2p/group.hpp).
      if (terminal(part.recv) || notice.finished(part.seq) ||
          (part.peer_seq != part.seq && notice.finished(part.peer_seq))) {
        continue;
      }
      r.fail(status, "irecv: " + why + " (message " + std::to_string(part.seq) + ")");
      fail_part(r, part, status);
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
