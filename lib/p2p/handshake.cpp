#include "p2p/handshake.hpp"

#include <algorithm>
#include <exception>

#include "ofi/subnet.hpp"
#include "p2p/bootstrap.hpp"
#include "p2p/context_core.hpp"
#include "p2p/recv_comm.hpp"
#include "p2p/rma_comm.hpp"
#include "p2p/send_comm.hpp"
#include "util/log.hpp"

namespace loom::p2p {
namespace {

constexpr std::size_t kHandshakeBytes = mux::kMaxControlBody;

// Makes a communicator of type T on `lane`, which it joined in `direction`, leaving the lane
// again if that fails.
template <typename T>
std::unique_ptr<Comm> make_comm(ContextCore& core, mux::Lane& lane, std::uint64_t peer,
                                mux::Direction direction) {
  try {
    return std::make_unique<T>(core, lane, peer);
  } catch (...) {
    core.lanes().leave(lane, peer, direction);
    throw;
  }
}

// Why a connect is refused, or nullopt when `listener` may take it. The magic and version are
// the connector's echo of the handle it decoded; the nonce proves it saw this listener's handle.
std::optional<RejectReason> judge_connect(const ConnectMessage& message,
                                          const ListenerState* listener) noexcept {
  if (message.magic != kHandleMagic) return RejectReason::kBadMagic;
  if (message.version != kProtocolVersion) return RejectReason::kBadVersion;
  if (listener == nullptr) return RejectReason::kUnknownListener;
  if (message.nonce != listener->nonce()) return RejectReason::kBadNonce;
  return std::nullopt;
}

}  // namespace

void send_reject(Bootstrap& bootstrap, std::span<const std::byte> reply_to,
                 std::uint32_t connect_id, RejectReason reason) noexcept {
  std::byte reply[8];
  const std::size_t length = encode_reject({connect_id, reason}, reply);
  try {
    bootstrap.send(reply_to, MessageType::kReject, {reply, length});
  } catch (const std::exception& e) {
    util::log().warn("handshake: cannot answer connect {} ({}): {}; it times out instead",
                     connect_id, to_string(reason), e.what());
  }
}

void admit_connect(Bootstrap& bootstrap, ConnectMessage message, ListenerState* listener) {
  const std::optional<RejectReason> reason = judge_connect(message, listener);
  if (!reason) {
    listener->on_connect(std::move(message));
    return;
  }
  // Refusals count against the listener the message names, when there is one.
  std::string why = std::string("connect ") + std::to_string(message.connect_id) +
                    " refused: " + to_string(*reason);
  if (listener != nullptr) {
    listener->on_refused(std::move(why));
  } else {
    util::log().warn("handshake: {}", why);
  }
  send_reject(bootstrap, message.reply_to, message.connect_id, *reason);
}

// ---- listener ----

ListenerState::ListenerState(std::shared_ptr<ContextCore> core) : core_(std::move(core)) {
  Bootstrap& bootstrap = core_->bootstrap();
  std::lock_guard lock(bootstrap.mutex());
  nonce_ = core_->random();
  id_ = bootstrap.add_listener(*this);
  HandleData data{.listener = id_, .nonce = nonce_, .context = core_->id(), .addresses = {}};
  // Every local subnet's bootstrap address that fits: four IPv4 or three IPv6 addresses; the
  // first always goes in (a peer on another subnet can still reach it routed).
  for (std::size_t rail = 0; rail < bootstrap.rails(); ++rail) {
    auto address = bootstrap.address(rail);
    data.addresses.emplace_back(address.begin(), address.end());
    handle_.size = encode_handle(data, handle_.bytes);
    if (handle_.size != 0) continue;
    data.addresses.pop_back();
    if (data.addresses.empty()) {
      bootstrap.remove_listener(id_);
      throw Error("listen", core_->provider(), 0,
                  "the endpoint address (" + std::to_string(address.size()) +
                      " bytes) does not fit a " + std::to_string(kMaxHandleBytes) + "-byte handle");
    }
    util::log().warn(
        "listener {}: bootstrap address {} does not fit the handle; peers on its "
        "subnet connect routed",
        id_, ofi::address_text(address));
    handle_.size = encode_handle(data, handle_.bytes);
  }
}

ListenerState::~ListenerState() {
  close();
}

void ListenerState::close() {
  Bootstrap& bootstrap = core_->bootstrap();
  std::lock_guard lock(bootstrap.mutex());
  if (closed_) return;
  closed_ = true;
  bootstrap.remove_listener(id_);
  // Connects that were never accepted are told so instead of waiting for their timeout.
  for (const ConnectMessage& message : pending_) {
    send_reject(bootstrap, message.reply_to, message.connect_id, RejectReason::kUnknownListener);
  }
  pending_.clear();
}

ListenerStats ListenerState::stats() const {
  std::lock_guard lock(core_->bootstrap().mutex());
  return stats_;
}

void ListenerState::on_connect(ConnectMessage message) {
  pending_.push_back(std::move(message));
}

void ListenerState::on_refused(std::string why) {
  ++stats_.refused;
  util::log().warn("listener {}: {}", id_, why);
  stats_.last_refusal = std::move(why);
}

std::unique_ptr<RecvComm> ListenerState::accept() {
  std::unique_ptr<Comm> comm = accept_kind(ConnectionKind::kTwoSided);
  return comm ? std::make_unique<RecvComm>(CommKey(), core_, std::move(comm)) : nullptr;
}

std::unique_ptr<RmaTarget> ListenerState::accept_rma() {
  std::unique_ptr<Comm> comm = accept_kind(ConnectionKind::kOneSided);
  return comm ? std::make_unique<RmaTarget>(CommKey(), core_, std::move(comm)) : nullptr;
}

std::unique_ptr<Comm> ListenerState::accept_kind(ConnectionKind kind) {
  Bootstrap& bootstrap = core_->bootstrap();
  std::lock_guard lock(bootstrap.mutex());
  if (closed_) throw Error("accept", core_->provider(), 0, "the listener is closed");
  bootstrap.progress();
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [kind](const ConnectMessage& m) { return m.kind == kind; });
  if (it == pending_.end()) return nullptr;
  ConnectMessage message = std::move(*it);
  pending_.erase(it);
  std::unique_ptr<Comm> comm;
  try {
    mux::Lane& lane =
        core_->lanes().join(message.context, mux::Direction::kRecv,
                            placement_facing(core_->nics(), core_->lanes(), message.lane));
    comm = kind == ConnectionKind::kTwoSided
               ? make_comm<RecvCommImpl>(*core_, lane, message.context, mux::Direction::kRecv)
               : make_comm<RmaTargetImpl>(*core_, lane, message.context, mux::Direction::kRecv);
    comm->connect_peer(message.lane);
    comm->set_label(message.label);
    AcceptMessage accept{
        .connect_id = message.connect_id, .context = core_->id(), .lane = comm->local_addresses()};
    std::byte body[kHandshakeBytes];
    const std::size_t length = encode_accept(accept, body);
    if (length == 0) throw Error("accept", core_->provider(), 0, "lane addresses do not fit");
    bootstrap.send(message.reply_to, MessageType::kAccept, {body, length});
  } catch (const Error&) {
    if (comm) Comm::close(std::move(comm));
    send_reject(bootstrap, message.reply_to, message.connect_id, RejectReason::kSetupFailed);
    throw;
  }
  ++stats_.accepted;
  return comm;
}

// ---- connector ----

ConnectorState::ConnectorState(std::shared_ptr<ContextCore> core, const Handle& handle,
                               ConnectionKind kind, std::uint64_t label)
    : core_(std::move(core)),
      kind_(kind),
      label_(label),
      deadline_(std::chrono::steady_clock::now() +
                std::chrono::milliseconds(core_->config().connect_timeout_ms)) {
  if (const char* why = decode_handle(handle.view(), target_)) {
    throw Error("connect", core_->provider(), 0, std::string("bad handle: ") + why);
  }
  route_ = route_to(core_->nics(), core_->lanes(), target_.addresses);
  util::log().info("{} connect to listener {} of context {:x}: {}", to_string(kind_),
                   target_.listener, target_.context, route_.description);
  std::lock_guard lock(core_->bootstrap().mutex());
  id_ = core_->bootstrap().add_connector(*this);
}

ConnectorState::~ConnectorState() {
  std::unique_lock lock(core_->bootstrap().mutex());
  core_->bootstrap().remove_connector(id_);
  lock.unlock();
  if (comm_) Comm::close(std::move(comm_));
}

std::unique_ptr<SendComm> ConnectorState::poll() {
  std::unique_ptr<Comm> comm = poll_comm();
  return comm ? std::make_unique<SendComm>(CommKey(), core_, std::move(comm)) : nullptr;
}

std::unique_ptr<RmaInitiator> ConnectorState::poll_rma() {
  std::unique_ptr<Comm> comm = poll_comm();
  return comm ? std::make_unique<RmaInitiator>(CommKey(), core_, std::move(comm)) : nullptr;
}

std::unique_ptr<Comm> ConnectorState::poll_comm() {
  if (stage_ == Stage::kFailed) throw *failure_;
  if (stage_ == Stage::kConnected) return nullptr;
  Bootstrap& bootstrap = core_->bootstrap();
  std::unique_lock lock(bootstrap.mutex());
  // A failure after the communicator joined its lane takes it off again: a later poll() must
  // not leave it attached behind a new one.
  auto give_up = [&](const Error& error) {
    lock.unlock();
    stage_ = Stage::kFailed;
    failure_ = error;
    if (comm_) Comm::close(std::move(comm_));
  };
  if (stage_ == Stage::kNotSent) {
    try {
      mux::Lane& lane =
          core_->lanes().join(target_.context, mux::Direction::kSend, route_.placement);
      comm_ =
          kind_ == ConnectionKind::kTwoSided
              ? make_comm<SendCommImpl>(*core_, lane, target_.context, mux::Direction::kSend)
              : make_comm<RmaInitiatorImpl>(*core_, lane, target_.context, mux::Direction::kSend);
      comm_->set_label(label_);
      const std::span<const std::byte> listener = target_.addresses[route_.address];
      // The answer comes back to the bootstrap rail the connect leaves from.
      auto reply_to = bootstrap.address(bootstrap.rail_for(listener));
      ConnectMessage message{.listener = target_.listener,
                             .nonce = target_.nonce,
                             .context = core_->id(),
                             .connect_id = id_,
                             .kind = kind_,
                             .label = label_,
                             .reply_to = {reply_to.begin(), reply_to.end()},
                             .lane = comm_->local_addresses()};
      std::byte body[kHandshakeBytes];
      const std::size_t length = encode_connect(message, body);
      if (length == 0) throw Error("connect", core_->provider(), 0, "lane addresses do not fit");
      bootstrap.send(listener, MessageType::kConnect, {body, length}, id_);
      stage_ = Stage::kAwaitingAnswer;
    } catch (const Error& error) {
      give_up(error);
      throw;
    }
  }
  bootstrap.progress();
  auto fail = [&](int code, const std::string& why) {
    give_up(Error("connect", core_->provider(), code, why));
    throw *failure_;
  };
  if (const auto* reject = std::get_if<RejectMessage>(&answer_)) {
    fail(ECONNREFUSED, std::string("refused by the listener: ") + to_string(reject->reason));
  }
  if (const auto* unsent = std::get_if<SendFailed>(&answer_)) {
    fail(EHOSTUNREACH,
         "the connect could not be sent (" + unsent->why + "), " + route_.description);
  }
  if (const auto* accept = std::get_if<AcceptMessage>(&answer_)) {
    comm_->connect_peer(accept->lane);
    stage_ = Stage::kConnected;
    return std::move(comm_);
  }
  if (std::chrono::steady_clock::now() > deadline_) {
    fail(ETIMEDOUT, "no answer from the listener within LOOM_CONNECT_TIMEOUT_MS (" +
                        std::to_string(core_->config().connect_timeout_ms) + " ms), " +
                        route_.description);
  }
  return nullptr;
}

}  // namespace loom::p2p
