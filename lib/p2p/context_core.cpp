#include "p2p/context_core.hpp"

#include <algorithm>

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
  bootstrap_rail_ = std::make_unique<ofi::Rail>(*nic_pointers_.front(), ofi::RailRole::kControl, 0,
                                                ofi::RailDepths{kBootstrapDepth, kBootstrapDepth});
  ofi::Rail* rails[] = {bootstrap_rail_.get()};
  bootstrap_ = std::make_unique<mux::ControlChannel>(rails, *this);
}

ContextCore::~ContextCore() = default;

// Rails are taken from the first NICs: put the ones closest to the calling thread's CPUs first
// (an order given by LOOM_NICS is kept as the user's choice).
void ContextCore::order_nics_by_locality() {
  const topo::Topology topology(config_.topology_xml);
  std::vector<topo::NicCandidate> candidates;
  for (const ofi::Nic* nic : nic_pointers_) {
    candidates.push_back({nic->attributes().domain, nic->attributes().pci_bus_id});
  }
  const topo::NicRanking ranking = topo::rank_nics(topology, candidates);
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

std::span<const std::byte> ContextCore::bootstrap_address() const noexcept {
  return bootstrap_rail_->address();
}

void ContextCore::progress_bootstrap() {
  bootstrap_rail_->progress();
  bootstrap_->retry_reposts();
  flush_outbox();
}

void ContextCore::send_bootstrap(std::span<const std::byte> peer, MessageType type,
                                 std::span<const std::byte> body) {
  std::vector<std::byte> key(peer.begin(), peer.end());
  auto it = bootstrap_peers_.find(key);
  if (it == bootstrap_peers_.end()) {
    it = bootstrap_peers_.emplace(key, bootstrap_rail_->insert_peer(peer)).first;
  }
  outbox_.push_back(Outgoing{it->second, type, {body.begin(), body.end()}});
  flush_outbox();
}

void ContextCore::flush_outbox() {
  while (!outbox_.empty()) {
    Outgoing& next = outbox_.front();
    const Status status =
        bootstrap_->send(0, next.peer, static_cast<std::uint8_t>(next.type), 0, next.body);
    if (status == Status::kRetry) return;
    if (status != Status::kOk) {
      util::log().error("handshake message (type {}) could not be sent: {}",
                        static_cast<int>(next.type), bootstrap_rail_->last_error());
    }
    outbox_.pop_front();
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
