#include "p2p/context_core.hpp"

#include <algorithm>

#include "ofi/rail_set.hpp"
#include "ofi/selection.hpp"
#include "topo/nic_rank.hpp"
#include "util/log.hpp"

namespace loom::p2p {
namespace {

constexpr std::size_t kBaseDepth = 256;
constexpr std::size_t kBootstrapDepth = 64;

std::uint64_t random_seed() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

}  // namespace

ContextCore::ContextCore(const Config& config) : config_(config), rng_(random_seed()) {
  config_.validate();
  util::set_log_level(config_.log_level);
  id_ = rng_() | 1;  // never 0
  nics_ = ofi::open_nics(config_);
  for (auto& nic : nics_) nic_pointers_.push_back(nic.get());
  if (nics_.size() > 1 && config_.nics.empty()) order_nics_by_locality();
  // Shared lanes carry several communicators' operations: their queues scale with the
  // multiplier (clamped to the provider's limits when the rails open).
  const std::size_t depth = kBaseDepth * (config_.ngroups > 0 ? config_.qp_depth_multiplier : 1);
  mux::LaneShape shape{.data_rails = config_.data_rails,
                       .control_rails = config_.ctrl_rails,
                       .depths = {depth, depth},
                       .mr_cache_entries = config_.mr_cache_entries};
  lanes_ = std::make_unique<mux::LaneRegistry>(nic_pointers_, shape, config_.ngroups);
  open_bootstrap_rails();
}

// One bootstrap endpoint per local subnet, so that a peer on any of them can reach a listener
// directly (a handle carries up to kMaxHandleAddresses); NICs without subnets share the first.
// A loopback address means something else on every host: it goes in a handle only when the
// context has nothing else (single-host runs).
void ContextCore::open_bootstrap_rails() {
  const bool only_loopback = std::all_of(nic_pointers_.begin(), nic_pointers_.end(), [](auto* n) {
    return n->subnet() == nullptr || n->subnet()->loopback();
  });
  std::vector<std::string> subnets;
  for (ofi::Nic* nic : nic_pointers_) {
    const ofi::Subnet* subnet = nic->subnet();
    if (!bootstrap_rails_.empty() && subnet == nullptr) continue;
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
    // Clamped like the lanes' rails: a depth beyond the provider's limit made fi_endpoint fail
    // with a bare "No data available".
    bootstrap_rails_.push_back(std::make_unique<ofi::Rail>(
        *nic, ofi::RailRole::kControl, bootstrap_rails_.size(),
        ofi::clamp_depths(*nic, ofi::RailDepths{kBootstrapDepth, kBootstrapDepth})));
  }
  std::vector<ofi::Rail*> rails;
  for (auto& rail : bootstrap_rails_) rails.push_back(rail.get());
  bootstrap_ = std::make_unique<mux::ControlChannel>(rails, *this);
}

Route ContextCore::route_to(const std::vector<Address>& listener) const {
  Route route;
  std::vector<ofi::Nic*> matching;
  std::string via;
  bool any_subnet = false;
  for (std::size_t a = 0; a < listener.size(); ++a) {
    for (ofi::Nic* nic : nic_pointers_) {
      const ofi::Subnet* subnet = nic->subnet();
      any_subnet = any_subnet || subnet != nullptr;
      if (subnet == nullptr || !subnet->contains(listener[a])) continue;
      if (std::find(matching.begin(), matching.end(), nic) != matching.end()) continue;
      if (matching.empty()) route.address = a;
      matching.push_back(nic);
      via += (via.empty() ? "" : ", ") + nic->attributes().domain + " (" + subnet->text() +
             " holds " + ofi::address_text(listener[a]) + ")";
    }
  }
  const auto& shape = lanes_->shape();
  if (!matching.empty()) {
    route.bootstrap_rail = bootstrap_rail_for(listener[route.address]);
    route.placement =
        ofi::RailPlacement::round_robin(matching, shape.data_rails, shape.control_rails);
    route.description = "direct over " + via;
    return route;
  }
  route.placement = lanes_->default_placement();
  if (!any_subnet) {
    route.description = "over " + nic_pointers_.front()->attributes().domain;
    return route;
  }
  std::string theirs, ours;
  for (const Address& a : listener) theirs += (theirs.empty() ? "" : ", ") + ofi::address_text(a);
  for (const ofi::Nic* nic : nic_pointers_) {
    ours += (ours.empty() ? "" : ", ") + nic->attributes().domain + " " +
            (nic->subnet() != nullptr ? nic->subnet()->text() : std::string("(no subnet)"));
  }
  route.description = "routed: no local subnet (" + ours + ") holds a listener address (" + theirs +
                      "); trying " + ofi::address_text(listener.front()) + " from " +
                      nic_pointers_.front()->attributes().domain;
  return route;
}

ofi::Nic* ContextCore::nic_on_subnet_of(std::span<const std::byte> peer) const {
  for (ofi::Nic* nic : nic_pointers_) {
    if (nic->subnet() != nullptr && nic->subnet()->contains(peer)) return nic;
  }
  return nullptr;
}

std::size_t ContextCore::bootstrap_rail_for(std::span<const std::byte> peer) const {
  for (std::size_t r = 0; r < bootstrap_rails_.size(); ++r) {
    const ofi::Subnet* subnet = bootstrap_rails_[r]->nic().subnet();
    if (subnet != nullptr && subnet->contains(peer)) return r;
  }
  return 0;  // routed, or no subnets at all
}

ofi::RailPlacement ContextCore::placement_facing(const LaneAddresses& peer) const {
  ofi::RailPlacement placement = lanes_->default_placement();
  auto face = [&](std::vector<ofi::Nic*>& rails, const std::vector<Address>& theirs) {
    for (std::size_t i = 0; i < rails.size() && i < theirs.size(); ++i) {
      if (ofi::Nic* nic = nic_on_subnet_of(theirs[i])) rails[i] = nic;
    }
  };
  face(placement.data, peer.data);
  face(placement.control, peer.control);
  return placement;
}

ContextCore::~ContextCore() = default;

// Rails are taken from the first NICs: put the ones closest to the GPU (LOOM_GPU) or else to the
// calling thread's CPUs first (an order given by LOOM_NICS is kept as the user's choice).
void ContextCore::order_nics_by_locality() {
  const topo::Topology topology(config_.topology_xml);
  std::vector<topo::NicCandidate> candidates;
  for (const ofi::Nic* nic : nic_pointers_) {
    candidates.push_back({nic->attributes().domain, nic->attributes().pci_bus_id});
  }
  const topo::NicRanking ranking = config_.gpu.empty()
                                       ? topo::rank_nics(topology, candidates)
                                       : topo::rank_nics_for_gpu(topology, candidates, config_.gpu);
  std::vector<ofi::Nic*> ordered;
  for (const topo::NicLocality& nic : ranking.nics) {
    ordered.push_back(nic_pointers_[nic.index]);
    localities_.emplace_back(topo::to_string(nic.locality));
  }
  nic_pointers_ = std::move(ordered);
  util::log().info("{}", topo::describe(ranking));
}

const std::string& ContextCore::provider() const noexcept {
  return nics_.front()->attributes().provider;
}

std::span<const std::byte> ContextCore::bootstrap_address(std::size_t rail) const noexcept {
  return bootstrap_rails_[rail]->address();
}

void ContextCore::progress_bootstrap() {
  for (auto& rail : bootstrap_rails_) rail->progress();
  bootstrap_->retry_reposts();
  flush_outbox();
}

void ContextCore::send_bootstrap(std::span<const std::byte> peer, MessageType type,
                                 std::span<const std::byte> body, std::uint32_t connector) {
  std::vector<std::byte> key(peer.begin(), peer.end());
  auto it = bootstrap_peers_.find(key);
  if (it == bootstrap_peers_.end()) {
    const std::size_t rail = bootstrap_rail_for(peer);
    it = bootstrap_peers_
             .emplace(key, BootstrapPeer{rail, bootstrap_rails_[rail]->insert_peer(peer)})
             .first;
  }
  const auto expires =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.connect_timeout_ms);
  outbox_.push_back(Outgoing{
      it->second.rail, it->second.address, type, {body.begin(), body.end()}, connector, expires});
  flush_outbox();
}

// A peer that cannot take a message (dead, or not yet connected) holds back only its own
// messages; they are dropped once older than the connect timeout, for nobody waits on them.
void ContextCore::flush_outbox() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<std::size_t, ofi::Address>> blocked;
  for (auto it = outbox_.begin(); it != outbox_.end();) {
    const auto peer = std::pair{it->rail, it->peer};
    if (std::find(blocked.begin(), blocked.end(), peer) != blocked.end()) {
      ++it;
      continue;
    }
    const Status status =
        bootstrap_->send(it->rail, it->peer, static_cast<std::uint8_t>(it->type), 0, it->body);
    if (status == Status::kRetry && now < it->expires) {
      blocked.push_back(peer);
      ++it;
      continue;
    }
    if (status != Status::kOk) {
      const std::string why = status == Status::kRetry
                                  ? std::string("the peer took nothing within the connect timeout")
                                  : bootstrap_rails_[it->rail]->last_error();
      util::log().error("handshake message (type {}) could not be sent: {}",
                        static_cast<int>(it->type), why);
      if (auto c = connectors_.find(it->connector); c != connectors_.end()) {
        c->second->on_send_failed(why);
      }
    }
    it = outbox_.erase(it);
  }
}

std::uint32_t ContextCore::add_listener(ListenerState& listener) {
  const std::uint32_t id = next_listener_++;
  listeners_[id] = &listener;
  return id;
}

void ContextCore::remove_listener(std::uint32_t id) noexcept {
  listeners_.erase(id);
}

std::uint32_t ContextCore::add_connector(ConnectorState& connector) {
  const std::uint32_t id = next_connector_++;
  connectors_[id] = &connector;
  return id;
}

void ContextCore::remove_connector(std::uint32_t id) noexcept {
  connectors_.erase(id);
  // Its connect, if still queued, is moot.
  std::erase_if(outbox_, [id](const Outgoing& o) { return o.connector == id; });
}

void ContextCore::on_control(const mux::ControlHeader& header, std::span<const std::byte> body) {
  switch (static_cast<MessageType>(header.type)) {
    case MessageType::kConnect:
      on_connect(body);
      return;
    case MessageType::kAccept: {
      AcceptMessage message;
      if (const char* why = decode_accept(body, message)) {
        util::log().warn("handshake: accept message dropped: {}", why);
      } else if (auto it = connectors_.find(message.connect_id); it != connectors_.end()) {
        it->second->on_accept(std::move(message));
      } else {
        util::log().warn("handshake: accept for unknown connect {} dropped", message.connect_id);
      }
      return;
    }
    case MessageType::kReject: {
      RejectMessage message;
      if (const char* why = decode_reject(body, message)) {
        util::log().warn("handshake: reject message dropped: {}", why);
      } else if (auto it = connectors_.find(message.connect_id); it != connectors_.end()) {
        it->second->on_reject(message);
      }
      return;
    }
    default:
      util::log().warn("handshake: message of unknown type {} dropped", header.type);
  }
}

void ContextCore::on_connect(std::span<const std::byte> body) {
  ConnectMessage message;
  if (const char* why = decode_connect(body, message)) {
    util::log().warn("handshake: malformed connect dropped: {}", why);
    return;
  }
  auto refuse = [&](RejectReason reason, ListenerState* listener) {
    std::string why = std::string("connect ") + std::to_string(message.connect_id) +
                      " refused: " + to_string(reason);
    if (listener != nullptr) {
      listener->on_refused(why);
    } else {
      util::log().warn("handshake: {}", why);
    }
    std::byte reply[8];
    const std::size_t length = encode_reject({message.connect_id, reason}, reply);
    try {
      send_bootstrap(message.reply_to, MessageType::kReject, {reply, length});
    } catch (const Error& e) {
      util::log().warn("handshake: cannot answer a refused connect: {}", e.what());
    }
  };
  // Refusals count against the listener the message names, when there is one.
  auto it = listeners_.find(message.listener);
  ListenerState* named = it == listeners_.end() ? nullptr : it->second;
  if (message.magic != kHandleMagic) return refuse(RejectReason::kBadMagic, named);
  if (message.version != kProtocolVersion) return refuse(RejectReason::kBadVersion, named);
  if (named == nullptr) return refuse(RejectReason::kUnknownListener, nullptr);
  if (message.nonce != named->nonce()) return refuse(RejectReason::kBadNonce, named);
  named->on_connect(std::move(message));
}

}  // namespace loom::p2p
