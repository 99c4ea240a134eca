#include "p2p/bootstrap.hpp"

#include <algorithm>
#include <string>

#include "ofi/rail_set.hpp"
#include "ofi/subnet.hpp"
#include "p2p/handshake.hpp"
#include "util/log.hpp"

namespace loom::p2p {
namespace {

constexpr std::size_t kBootstrapDepth = 64;

}  // namespace

// A loopback address means something else on every host: it goes in a handle only when the
// context has nothing else (single-host runs). NICs without subnets share the first rail.
Bootstrap::Bootstrap(std::span<ofi::Nic* const> nics, std::chrono::milliseconds expiry)
    : expiry_(expiry) {
  const bool only_loopback = std::all_of(nics.begin(), nics.end(), [](auto* n) {
    return n->subnet() == nullptr || n->subnet()->loopback();
  });
  std::vector<std::string> subnets;
  for (ofi::Nic* nic : nics) {
    const ofi::Subnet* subnet = nic->subnet();
    if (!rails_.empty() && subnet == nullptr) continue;
    if (subnet != nullptr && subnet->loopback() && !only_loopback) continue;
    if (subnet != nullptr) {
      if (std::find(subnets.begin(), subnets.end(), subnet->text()) != subnets.end()) continue;
      if (subnets.size() == kMaxHandleAddresses) {
        util::log().warn("NIC {} ({}): a handle carries {} subnets; peers reach it routed only",
                         nic->attributes().domain, subnet->text(), kMaxHandleAddresses);
        continue;
      }
      subnets.push_back(subnet->text());
    }
    // Clamped like the lanes' rails: fi_endpoint refuses a depth beyond the provider's limit.
    rails_.push_back(std::make_unique<ofi::Rail>(
        *nic, ofi::RailRole::kControl, rails_.size(),
        ofi::clamp_depths(*nic, ofi::RailDepths{kBootstrapDepth, kBootstrapDepth})));
  }
  std::vector<ofi::Rail*> rails;
  for (auto& rail : rails_) rails.push_back(rail.get());
  channel_ = std::make_unique<mux::ControlChannel>(rails, *this);
}

Bootstrap::~Bootstrap() = default;

std::span<const std::byte> Bootstrap::address(std::size_t rail) const noexcept {
  return rails_[rail]->address();
}

std::size_t Bootstrap::rail_for(std::span<const std::byte> peer) const {
  for (std::size_t r = 0; r < rails_.size(); ++r) {
    const ofi::Subnet* subnet = rails_[r]->nic().subnet();
    if (subnet != nullptr && subnet->contains(peer)) return r;
  }
  return 0;  // routed, or no subnets at all
}

void Bootstrap::progress() {
  for (auto& rail : rails_) rail->progress();
  channel_->retry();
  send_outbox();
}

void Bootstrap::send(std::span<const std::byte> peer, MessageType type,
                     std::span<const std::byte> body, std::uint32_t connector) {
  std::vector<std::byte> key(peer.begin(), peer.end());
  auto it = peers_.find(key);
  if (it == peers_.end()) {
    const std::size_t rail = rail_for(peer);
    it = peers_.emplace(key, Peer{rail, rails_[rail]->insert_peer(peer)}).first;
  }
  const auto expires = std::chrono::steady_clock::now() + expiry_;
  outbox_.push_back(Outgoing{
      it->second.rail, it->second.address, type, {body.begin(), body.end()}, connector, expires});
  send_outbox();
}

// A peer that cannot take a message (dead, or not yet connected) holds back only its own
// messages; they are dropped once expired.
void Bootstrap::send_outbox() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<std::size_t, ofi::Address>> blocked;
  for (auto it = outbox_.begin(); it != outbox_.end();) {
    const auto peer = std::pair{it->rail, it->peer};
    if (std::find(blocked.begin(), blocked.end(), peer) != blocked.end()) {
      ++it;
      continue;
    }
    const Status status =
        channel_->send(it->rail, it->peer, static_cast<std::uint8_t>(it->type), 0, it->body);
    if (status == Status::kRetry && now < it->expires) {
      blocked.push_back(peer);
      ++it;
      continue;
    }
    if (status != Status::kOk) {
      const std::string why = status == Status::kRetry
                                  ? std::string("the peer took nothing within the connect timeout")
                                  : rails_[it->rail]->last_error();
      util::log().error("handshake message (type {}) could not be sent: {}",
                        static_cast<int>(it->type), why);
      if (auto c = connectors_.find(it->connector); c != connectors_.end()) {
        c->second->on_send_failed(why);
      }
    }
    it = outbox_.erase(it);
  }
}

std::uint32_t Bootstrap::add_listener(ListenerState& listener) {
  const std::uint32_t id = next_listener_++;
  listeners_[id] = &listener;
  return id;
}

void Bootstrap::remove_listener(std::uint32_t id) noexcept {
  listeners_.erase(id);
}

std::uint32_t Bootstrap::add_connector(ConnectorState& connector) {
  const std::uint32_t id = next_connector_++;
  connectors_[id] = &connector;
  return id;
}

void Bootstrap::remove_connector(std::uint32_t id) noexcept {
  connectors_.erase(id);
  // Its connect, if still queued, is moot.
  std::erase_if(outbox_, [id](const Outgoing& o) { return o.connector == id; });
}

// ---- dispatch of what arrived ----

void Bootstrap::on_control(const mux::ControlHeader& header, std::span<const std::byte> body) {
  switch (static_cast<MessageType>(header.type)) {
    case MessageType::kConnect:
      return on_connect(body);
    case MessageType::kAccept:
      return on_accept(body);
    case MessageType::kReject:
      return on_reject(body);
    default:
      util::log().warn("handshake: message of unknown type {} dropped", header.type);
  }
}

void Bootstrap::on_connect(std::span<const std::byte> body) {
  ConnectMessage message;
  if (const char* why = decode_connect(body, message)) {
    util::log().warn("handshake: malformed connect dropped: {}", why);
    return;
  }
  auto it = listeners_.find(message.listener);
  admit_connect(*this, std::move(message), it == listeners_.end() ? nullptr : it->second);
}

void Bootstrap::on_accept(std::span<const std::byte> body) {
  AcceptMessage message;
  if (const char* why = decode_accept(body, message)) {
    util::log().warn("handshake: accept message dropped: {}", why);
  } else if (auto it = connectors_.find(message.connect_id); it != connectors_.end()) {
    it->second->on_accept(std::move(message));
  } else {
    util::log().warn("handshake: accept for unknown connect {} dropped", message.connect_id);
  }
}

void Bootstrap::on_reject(std::span<const std::byte> body) {
  RejectMessage message;
  if (const char* why = decode_reject(body, message)) {
    util::log().warn("handshake: reject message dropped: {}", why);
  } else if (auto it = connectors_.find(message.connect_id); it != connectors_.end()) {
    it->second->on_reject(message);
  }
}

}  // namespace loom::p2p
