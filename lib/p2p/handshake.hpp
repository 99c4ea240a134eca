// The non-blocking connection handshake, over the contexts' bootstrap endpoints
// (p2p/bootstrap.hpp). connect() sends the connector's lane addresses with the handle's nonce;
// the listener judges the connect (magic, version, listener, nonce) and either refuses it with
// a reason or queues it for accept(), which answers with the acceptor's lane addresses.
// Nothing waits for the peer: each call progresses the bootstrap endpoint and returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>

#include "loom/p2p.hpp"
#include "loom/rma.hpp"
#include "p2p/messages.hpp"
#include "p2p/route.hpp"

namespace loom::p2p {

class Bootstrap;
class Comm;
class ContextCore;

class ListenerState {
 public:
  explicit ListenerState(std::shared_ptr<ContextCore> core);
  ~ListenerState();

  [[nodiscard]] const Handle& handle() const noexcept { return handle_; }
  // The next connect of each kind (ConnectionKind), or nullptr.
  std::unique_ptr<RecvComm> accept();
  std::unique_ptr<RmaTarget> accept_rma();
  void close();
  [[nodiscard]] ListenerStats stats() const;

  // From the bootstrap endpoint (its mutex held).
  void on_connect(ConnectMessage message);
  void on_refused(std::string why);
  [[nodiscard]] std::uint64_t nonce() const noexcept { return nonce_; }

 private:
  // Joins the lane for the oldest pending connect of `kind`, answers it, and gives the
  // communicator (nullptr when none is pending). The bootstrap mutex is held.
  std::unique_ptr<Comm> accept_kind(ConnectionKind kind);

  std::shared_ptr<ContextCore> core_;
  std::uint32_t id_ = 0;
  std::uint64_t nonce_ = 0;
  Handle handle_;
  bool closed_ = false;
  std::deque<ConnectMessage> pending_;
  ListenerStats stats_;
};

class ConnectorState {
 public:
  ConnectorState(std::shared_ptr<ContextCore> core, const Handle& handle, ConnectionKind kind,
                 std::uint64_t label);
  ~ConnectorState();

  // The connection once accepted: poll() for a two-sided connector, poll_rma() for a one-sided.
  std::unique_ptr<SendComm> poll();
  std::unique_ptr<RmaInitiator> poll_rma();

  // From the bootstrap endpoint (its mutex held): the listener's answer, or the provider's
  // word that the connect could not be sent. The first one counts.
  void on_accept(AcceptMessage message) { answer(std::move(message)); }
  void on_reject(RejectMessage message) { answer(message); }
  void on_send_failed(std::string why) { answer(SendFailed{std::move(why)}); }

 private:
  // kNotSent --poll: connect sent--> kAwaitingAnswer --accepted--> kConnected
  // Either one --refused, unsent, timed out, or setup failed--> kFailed
  enum class Stage : std::uint8_t { kNotSent, kAwaitingAnswer, kConnected, kFailed };
  struct SendFailed {
    std::string why;
  };
  using Answer = std::variant<std::monostate, AcceptMessage, RejectMessage, SendFailed>;
  template <typename T>
  void answer(T&& what) {
    if (std::holds_alternative<std::monostate>(answer_)) answer_ = std::forward<T>(what);
  }

  // The communicator once the listener accepted, nullptr before.
  std::unique_ptr<Comm> poll_comm();

  std::shared_ptr<ContextCore> core_;
  ConnectionKind kind_;
  std::uint64_t label_;
  HandleData target_;
  Route route_;
  std::uint32_t id_ = 0;
  std::unique_ptr<Comm> comm_;
  Stage stage_ = Stage::kNotSent;
  std::optional<Error> failure_;  // kFailed: why; every later poll() says it again
  std::chrono::steady_clock::time_point deadline_;
  Answer answer_;  // under the bootstrap mutex
};

// A connect that arrived for `listener` (nullptr: it names none that is open). Refused with a
// reason, counted against the listener where there is one, or queued for its accept(). The
// bootstrap mutex is held.
void admit_connect(Bootstrap& bootstrap, ConnectMessage message, ListenerState* listener);

// Tells the connector at `reply_to` that its connect `connect_id` is refused. Best effort:
// when the reply cannot even be queued the connector times out instead. The bootstrap mutex
// is held.
void send_reject(Bootstrap& bootstrap, std::span<const std::byte> reply_to,
                 std::uint32_t connect_id, RejectReason reason) noexcept;

}  // namespace loom::p2p
