// Listener and connector: the non-blocking connection handshake over the contexts' bootstrap
// endpoints. connect() sends the connector's lane addresses with the handle's nonce; accept()
// answers with the acceptor's lane addresses. Nothing waits for the peer: each call progresses
// the bootstrap endpoint and returns.
#include <chrono>

#include "ofi/nic.hpp"
#include "p2p/context_core.hpp"
#include "p2p/recv_comm.hpp"
#include "p2p/send_comm.hpp"
#include "util/log.hpp"

namespace loom::p2p {
namespace {

constexpr std::size_t kHandshakeBytes = mux::kMaxControlBody;

// Makes a communicator of type T on `lane`, leaving the lane again if that fails.
template <typename T>
std::unique_ptr<Comm> make_comm(const std::shared_ptr<ContextCore>& core, mux::Lane& lane) {
  try {
    return std::make_unique<T>(core, lane);
  } catch (...) {
    core->lanes().leave(lane);
    throw;
  }
}

}  // namespace

// ---- listener ----

ListenerState::ListenerState(std::shared_ptr<ContextCore> core) : core_(std::move(core)) {
  std::lock_guard lock(core_->bootstrap_mutex());
  nonce_ = core_->random();
  id_ = core_->add_listener(*this);
  HandleData data{.listener = id_, .nonce = nonce_, .context = core_->id(), .addresses = {}};
  // Every local subnet's bootstrap address that fits: four IPv4 or three IPv6 addresses; the
  // first always goes in (a peer on another subnet can still reach it routed).
  for (std::size_t rail = 0; rail < core_->bootstrap_rails(); ++rail) {
    auto address = core_->bootstrap_address(rail);
    data.addresses.emplace_back(address.begin(), address.end());
    handle_.size = encode_handle(data, handle_.bytes);
    if (handle_.size != 0) continue;
    data.addresses.pop_back();
    if (data.addresses.empty()) {
      core_->remove_listener(id_);
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
  std::lock_guard lock(core_->bootstrap_mutex());
  if (closed_) return;
  closed_ = true;
  core_->remove_listener(id_);
  // Connects that were never accepted are told so instead of waiting for their timeout.
  for (const ConnectMessage& message : pending_) {
    std::byte reply[8];
    const std::size_t length =
        encode_reject({message.connect_id, RejectReason::kUnknownListener}, reply);
    try {
      core_->send_bootstrap(message.reply_to, MessageType::kReject, {reply, length});
    } catch (const Error&) {
      // The connector times out instead.
    }
  }
  pending_.clear();
}

ListenerStats ListenerState::stats() const {
  std::lock_guard lock(core_->bootstrap_mutex());
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
  std::lock_guard lock(core_->bootstrap_mutex());
  if (closed_) throw Error("accept", core_->provider(), 0, "the listener is closed");
  core_->progress_bootstrap();
  if (pending_.empty()) return nullptr;
  ConnectMessage message = std::move(pending_.front());
  pending_.pop_front();
  std::unique_ptr<Comm> comm;
  try {
    mux::Lane& lane = core_->lanes().join_recv(message.context, message.lane.lane,
                                               core_->placement_facing(message.lane));
    comm = make_comm<RecvCommImpl>(core_, lane);
    comm->connect_peer(message.lane);
    AcceptMessage accept{
        .connect_id = message.connect_id, .context = core_->id(), .lane = comm->local_addresses()};
    std::byte body[kHandshakeBytes];
    const std::size_t length = encode_accept(accept, body);
    if (length == 0) throw Error("accept", core_->provider(), 0, "lane addresses do not fit");
    core_->send_bootstrap(message.reply_to, MessageType::kAccept, {body, length});
  } catch (const Error&) {
    if (comm) Comm::close(std::move(comm));
    std::byte reply[8];
    const std::size_t length =
        encode_reject({message.connect_id, RejectReason::kSetupFailed}, reply);
    try {
      core_->send_bootstrap(message.reply_to, MessageType::kReject, {reply, length});
    } catch (const Error&) {
      // The connector times out instead.
    }
    throw;
  }
  ++stats_.accepted;
  return std::make_unique<RecvComm>(std::move(comm));
}

// ---- connector ----

ConnectorState::ConnectorState(std::shared_ptr<ContextCore> core, const Handle& handle)
    : core_(std::move(core)),
      deadline_(std::chrono::steady_clock::now() +
                std::chrono::milliseconds(core_->config().connect_timeout_ms)) {
  if (const char* why = decode_handle(handle.view(), target_)) {
    throw Error("connect", core_->provider(), 0, std::string("bad handle: ") + why);
  }
  route_ = core_->route_to(target_.addresses);
  util::log().info("connect to listener {} of context {:x}: {}", target_.listener, target_.context,
                   route_.description);
  std::lock_guard lock(core_->bootstrap_mutex());
  id_ = core_->add_connector(*this);
}

ConnectorState::~ConnectorState() {
  std::unique_lock lock(core_->bootstrap_mutex());
  core_->remove_connector(id_);
  lock.unlock();
  if (comm_) Comm::close(std::move(comm_));
}

std::unique_ptr<SendComm> ConnectorState::poll() {
  if (failure_) throw *failure_;
  if (done_) return nullptr;
  std::unique_lock lock(core_->bootstrap_mutex());
  // A failure after the communicator joined its lane takes it off again: a later poll() must
  // not leave it attached behind a new one.
  auto give_up = [&](const Error& error) {
    lock.unlock();
    done_ = true;
    failure_ = error;
    if (comm_) Comm::close(std::move(comm_));
  };
  if (!sent_) {
    try {
      mux::Lane& lane = core_->lanes().join_send(target_.context, route_.placement);
      comm_ = make_comm<SendCommImpl>(core_, lane);
      auto reply_to = core_->bootstrap_address(route_.bootstrap_rail);
      ConnectMessage message{.listener = target_.listener,
                             .nonce = target_.nonce,
                             .context = core_->id(),
                             .connect_id = id_,
                             .reply_to = {reply_to.begin(), reply_to.end()},
                             .lane = comm_->local_addresses()};
      std::byte body[kHandshakeBytes];
      const std::size_t length = encode_connect(message, body);
      if (length == 0) throw Error("connect", core_->provider(), 0, "lane addresses do not fit");
      core_->send_bootstrap(target_.addresses[route_.address], MessageType::kConnect,
                            {body, length}, id_);
      sent_ = true;
    } catch (const Error& error) {
      give_up(error);
      throw;
    }
  }
  core_->progress_bootstrap();
  auto fail = [&](int code, const std::string& why) {
    give_up(Error("connect", core_->provider(), code, why));
    throw *failure_;
  };
  if (reject_)
    fail(ECONNREFUSED, std::string("refused by the listener: ") + to_string(reject_->reason));
  if (send_error_) {
    fail(EHOSTUNREACH,
         "the connect could not be sent (" + *send_error_ + "), " + route_.description);
  }
  if (accept_) {
    comm_->connect_peer(accept_->lane);
    done_ = true;
    return std::make_unique<SendComm>(std::move(comm_));
  }
  if (std::chrono::steady_clock::now() > deadline_) {
    fail(ETIMEDOUT, "no answer from the listener within LOOM_CONNECT_TIMEOUT_MS (" +
                        std::to_string(core_->config().connect_timeout_ms) + " ms), " +
                        route_.description);
  }
  return nullptr;
}

}  // namespace loom::p2p
