// What a loom::Context is: its configuration, NICs, lane registry, and the bootstrap endpoint
// that carries connection handshakes. Listeners, connectors and communicators hold it shared,
// so it outlives everything made from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "loom/p2p.hpp"
#include "mux/control_channel.hpp"
#include "mux/lane_registry.hpp"
#include "ofi/nic.hpp"
#include "ofi/rail.hpp"
#include "p2p/messages.hpp"

namespace loom::p2p {

class ListenerState;
class ConnectorState;

// How a connector reaches a listener: which of the handle's addresses it sends to, from which
// bootstrap rail, and where its lane's rails go.
struct Route {
  std::size_t address = 0;         // index into the handle's addresses
  std::size_t bootstrap_rail = 0;  // index into the context's bootstrap rails
  ofi::RailPlacement placement;
  std::string description;  // for logs and errors
};

class ContextCore final : public mux::ControlSink {
 public:
  explicit ContextCore(const Config& config);
  ~ContextCore();

  [[nodiscard]] const Config& config() const noexcept { return config_; }
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  [[nodiscard]] mux::LaneRegistry& lanes() noexcept { return *lanes_; }
  [[nodiscard]] std::span<ofi::Nic* const> nics() const noexcept { return nic_pointers_; }
  // Why each NIC (same order as nics()) is where it is; empty with a single NIC.
  [[nodiscard]] const std::vector<std::string>& localities() const noexcept { return localities_; }
  [[nodiscard]] const std::string& provider() const noexcept;

  // ---- routing on direct-connect meshes ----
  // Picks the local NICs that share a subnet with the listener's addresses.
  [[nodiscard]] Route route_to(const std::vector<Address>& listener) const;
  // Rail i on the local NIC whose subnet holds the peer's rail i (where one does).
  [[nodiscard]] ofi::RailPlacement placement_facing(const LaneAddresses& peer) const;

  // ---- bootstrap (callers hold bootstrap_mutex()) ----
  [[nodiscard]] std::mutex& bootstrap_mutex() noexcept { return bootstrap_mutex_; }
  void progress_bootstrap();
  // The bootstrap rails' addresses: one per local subnet (one in all without subnets).
  [[nodiscard]] std::size_t bootstrap_rails() const noexcept { return bootstrap_rails_.size(); }
  [[nodiscard]] std::span<const std::byte> bootstrap_address(std::size_t rail = 0) const noexcept;
  // Queues a handshake message to `peer`'s bootstrap endpoint; sent as back-pressure allows.
  // A connect names its connector, which hears of a send the provider refused.
  void send_bootstrap(std::span<const std::byte> peer, MessageType type,
                      std::span<const std::byte> body, std::uint32_t connector = 0);
  std::uint32_t add_listener(ListenerState& listener);
  void remove_listener(std::uint32_t id) noexcept;
  std::uint32_t add_connector(ConnectorState& connector);
  void remove_connector(std::uint32_t id) noexcept;
  std::uint64_t random() { return rng_(); }

 private:
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_connect(std::span<const std::byte> body);
  void flush_outbox();
  void order_nics_by_locality();
  void open_bootstrap_rails();
  // The first local NIC whose subnet holds `peer`'s address, or nullptr.
  [[nodiscard]] ofi::Nic* nic_on_subnet_of(std::span<const std::byte> peer) const;
  // The bootstrap rail on `peer`'s subnet, else the first.
  [[nodiscard]] std::size_t bootstrap_rail_for(std::span<const std::byte> peer) const;

  struct Outgoing {
    std::size_t rail;
    ofi::Address peer;
    MessageType type;
    std::vector<std::byte> body;
    std::uint32_t connector;
    std::chrono::steady_clock::time_point expires;
  };

  Config config_;
  std::uint64_t id_;
  std::mt19937_64 rng_;
  // Declaration order is teardown order, reversed: bootstrap channel, bootstrap rail, lanes,
  // then the NICs they all live on.
  std::vector<std::unique_ptr<ofi::Nic>> nics_;
  std::vector<ofi::Nic*> nic_pointers_;
  std::vector<std::string> localities_;
  std::unique_ptr<mux::LaneRegistry> lanes_;
  std::vector<std::unique_ptr<ofi::Rail>> bootstrap_rails_;
  std::unique_ptr<mux::ControlChannel> bootstrap_;
  std::mutex bootstrap_mutex_;
  struct BootstrapPeer {
    std::size_t rail;
    ofi::Address address;
  };
  std::map<std::vector<std::byte>, BootstrapPeer> bootstrap_peers_;
  std::deque<Outgoing> outbox_;
  std::map<std::uint32_t, ListenerState*> listeners_;
  std::map<std::uint32_t, ConnectorState*> connectors_;
  std::uint32_t next_listener_ = 1;
  std::uint32_t next_connector_ = 1;
};

class ListenerState {
 public:
  explicit ListenerState(std::shared_ptr<ContextCore> core);
  ~ListenerState();

  [[nodiscard]] const Handle& handle() const noexcept { return handle_; }
  std::unique_ptr<RecvComm> accept();
  void close();
  [[nodiscard]] ListenerStats stats() const;

  // From the bootstrap endpoint (bootstrap mutex held).
  void on_connect(ConnectMessage message);
  void on_refused(std::string why);
  [[nodiscard]] std::uint64_t nonce() const noexcept { return nonce_; }

 private:
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
  ConnectorState(std::shared_ptr<ContextCore> core, const Handle& handle);
  ~ConnectorState();

  std::unique_ptr<SendComm> poll();

  // From the bootstrap endpoint (bootstrap mutex held).
  void on_accept(AcceptMessage message) { accept_ = std::move(message); }
  void on_reject(RejectMessage message) { reject_ = message; }
  void on_send_failed(std::string why) { send_error_ = std::move(why); }

 private:
  std::shared_ptr<ContextCore> core_;
  HandleData target_;
  Route route_;
  std::uint32_t id_ = 0;
  std::unique_ptr<Comm> comm_;
  bool sent_ = false;
  bool done_ = false;
  std::optional<Error> failure_;  // why the connect failed; every later poll() says it again
  std::chrono::steady_clock::time_point deadline_;
  std::optional<AcceptMessage> accept_;
  std::optional<RejectMessage> reject_;
  std::optional<std::string> send_error_;
};

}  // namespace loom::p2p
