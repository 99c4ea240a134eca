// Liveness: while requests wait on the peer, test() pings it every LOOM_PEER_TIMEOUT_MS / 4 and
// the peer's progress answers; silence for LOOM_PEER_TIMEOUT_MS, half of it after a ping, or a
// ping the provider refuses, makes the peer lost and fails everything pending. Both directions
// run the same code. A sender's ping also names the oldest message still waiting for its
// clearance, which the receiver then announces again (Ping in messages.hpp).
#include <chrono>

#include "p2p/comm.hpp"
#include "util/log.hpp"

namespace loom::p2p {

// The peer may only have been stopped (SIGSTOP, a debugger) and run again: it learns that this
// side gave up, and how far this side got, from a close notice sent now and in answer to its
// pings, as if this side had closed. What was handed over whole before still finishes there.
void Comm::peer_lost(std::string why, bool warn) {
  if (peer_ == PeerState::kLost) return;
  const bool tell = !closed_ && !peer_control_.empty() && peer_ != PeerState::kClosed &&
                    peer_ != PeerState::kBroken;
  if (tell) {
    lost_notice_ = std::make_unique<CloseNotice>(close_notice(CloseReason::kLost));
  }
  peer_ = PeerState::kLost;
  peer_gone_ = std::move(why);
  if (warn) util::log().warn("comm {} on lane {}: {}", id_, lane_->id(), peer_gone_);
  fail_all(Status::kPeerError, peer_gone_);
  tell_lost();
}

void Comm::tell_lost() {
  if (lost_notice_ && !closed_) send_close_notice(*lost_notice_);
}

bool Comm::on_liveness(const mux::ControlHeader& header, std::span<const std::byte> body) {
  if (since_check_ == SinceCheck::kNothing) since_check_ = SinceCheck::kHeard;
  const auto type = static_cast<MessageType>(header.type);
  if (type == MessageType::kPing && peer_ == PeerState::kLost) {
    tell_lost();
    return true;
  }
  if (type == MessageType::kPing) {
    // Lost to back-pressure, the next ping asks again.
    if (!closed_ && !peer_control_.empty()) send_control(MessageType::kPong, 0, {});
    Ping ping;
    if (const char* why = decode_ping(body, ping)) [[unlikely]] {
      util::log().warn("comm {} on lane {}: {}", id_, lane_->id(), why);
    } else if (ping.awaiting && !closed_ && !peer_gone()) {
      repeat_clearances(ping.oldest_awaiting);
    }
    return true;
  }
  return type == MessageType::kPong;
}

// Also while closing: close() waits on the peer for what is still on its way.
void Comm::check_peer() {
  if (peer_ == PeerState::kLost || peer_control_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  const auto timeout = settings_.peer_timeout;
  // Heard of (or waiting) since the last check: as if at this one, at most a check late.
  switch (since_check_) {
    case SinceCheck::kWaitBegan:
      next_ping_ = now + timeout / 4;
      [[fallthrough]];
    case SinceCheck::kHeard:
      last_heard_ = now;
      first_unanswered_ping_ = {};
      break;
    case SinceCheck::kNothing:
      break;
  }
  since_check_ = SinceCheck::kNothing;
  if (peer_ == PeerState::kClosed) {
    // What the notice left pending had that long to finish.
    if (now > close_deadline_) settle_after_close();
    return;
  }
  // Silence proves death only where the peer had half a timeout to answer a ping: after a
  // spell without checks (the application busy elsewhere, this process without CPU) nothing
  // asked it. A side that kept checking sent its first ping a quarter after it last heard.
  const bool asked = first_unanswered_ping_ != std::chrono::steady_clock::time_point{} &&
                     now - first_unanswered_ping_ >= timeout / 2;
  if (now - last_heard_ > timeout && asked) {
    peer_lost("no sign of life from the peer for LOOM_PEER_TIMEOUT_MS (" +
              std::to_string(timeout.count()) + " ms): taken as dead");
    return;
  }
  if (now < next_ping_) return;
  next_ping_ = now + timeout / 4;
  // As of when tried: a ping the provider pushes back (a dead peer's full queue) asked too.
  if (first_unanswered_ping_ == std::chrono::steady_clock::time_point{}) {
    first_unanswered_ping_ = now;
  }
  Ping ping;
  ping.awaiting = awaiting_clearance(ping.oldest_awaiting);
  std::byte bytes[kPingAwaitingBytes];
  const Status status = send_control(MessageType::kPing, 0, {bytes, encode_ping(ping, bytes)});
  if (status != Status::kOk && status != Status::kRetry) {
    peer_lost("the peer is unreachable (" + last_error_ + ")");
  }
}

}  // namespace loom::p2p
