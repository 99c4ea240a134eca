// The context's bootstrap endpoint: where connection handshakes travel before a communicator
// has a lane. One control rail per local subnet (so that a peer on any of them reaches a
// listener directly), one control channel over them, the peers it has addressed, and an
// outbox that holds messages back-pressure refused. Received handshake messages are decoded
// here and handed to the listener or connector they name; judging a connect is the
// handshake's business (p2p/handshake.hpp).
//
// Every call except the constructor is made with mutex() held: listeners, connectors and
// their accept()/poll() share the endpoint across threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "mux/control_channel.hpp"
#include "ofi/nic.hpp"
#include "ofi/rail.hpp"
#include "p2p/messages.hpp"

namespace loom::p2p {

class ListenerState;
class ConnectorState;

class Bootstrap final : public mux::ControlSink {
 public:
  // Opens the rails on `nics` (in the context's order). A message nobody could take is dropped
  // once `expiry` old: the connect timeout, for nobody waits on it longer.
  Bootstrap(std::span<ofi::Nic* const> nics, std::chrono::milliseconds expiry);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  [[nodiscard]] std::mutex& mutex() noexcept { return mutex_; }
  // Reads the rails' completions (dispatching what arrived) and sends what the outbox holds.
  void progress();

  // The rails' addresses: one per local subnet (one in all without subnets).
  [[nodiscard]] std::size_t rails() const noexcept { return rails_.size(); }
  [[nodiscard]] std::span<const std::byte> address(std::size_t rail = 0) const noexcept;
  // The rail on `peer`'s subnet, else the first.
  [[nodiscard]] std::size_t rail_for(std::span<const std::byte> peer) const;

  // Queues a handshake message to `peer`'s bootstrap endpoint; sent as back-pressure allows.
  // A connect names its connector, which hears of a send the provider refused. Throws
  // loom::Error when `peer` is not an address the provider takes.
  void send(std::span<const std::byte> peer, MessageType type, std::span<const std::byte> body,
            std::uint32_t connector = 0);

  std::uint32_t add_listener(ListenerState& listener);
  void remove_listener(std::uint32_t id) noexcept;
  std::uint32_t add_connector(ConnectorState& connector);
  void remove_connector(std::uint32_t id) noexcept;

 private:
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_connect(std::span<const std::byte> body);
  void on_accept(std::span<const std::byte> body);
  void on_reject(std::span<const std::byte> body);
  void send_outbox();

  struct Outgoing {
    std::size_t rail;
    ofi::Address peer;
    MessageType type;
    std::vector<std::byte> body;
    std::uint32_t connector;
    std::chrono::steady_clock::time_point expires;
  };
  struct Peer {
    std::size_t rail;
    ofi::Address address;
  };

  std::chrono::milliseconds expiry_;
  // Declaration order is teardown order, reversed: the channel goes before its rails.
  std::vector<std::unique_ptr<ofi::Rail>> rails_;
  std::unique_ptr<mux::ControlChannel> channel_;
  std::mutex mutex_;
  std::map<std::vector<std::byte>, Peer> peers_;  // by endpoint name
  std::deque<Outgoing> outbox_;
  std::map<std::uint32_t, ListenerState*> listeners_;
  std::map<std::uint32_t, ConnectorState*> connectors_;
  std::uint32_t next_listener_ = 1;
  std::uint32_t next_connector_ = 1;
};

}  // namespace loom::p2p
