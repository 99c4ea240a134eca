#include "p2p/context_core.hpp"

#include <algorithm>
#include <chrono>

#include "ofi/selection.hpp"
#include "topo/nic_rank.hpp"
#include "util/log.hpp"

namespace loom::p2p {
namespace {

constexpr std::size_t kBaseDepth = 256;
constexpr auto kLongestIdlePeriod = std::chrono::milliseconds(100);

std::uint64_t random_seed() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

}  // namespace

ContextCore::ContextCore(const Config& config) : config_(config), rng_(random_seed()) {
  config_.validate();
  util::set_log_level(config_.log_level);
  id_ = rng_() | 1;  // never 0
  comm_serials_ = id_ + 1;
  nics_ = ofi::open_nics(config_);
  for (auto& nic : nics_) nic_pointers_.push_back(nic.get());
  if (nics_.size() > 1 && config_.nics.empty()) order_nics_by_locality();
  // Shared lanes carry several communicators' operations: their queues scale with the
  // multiplier (clamped to the provider's limits when the rails open).
  const std::size_t depth = kBaseDepth * (config_.ngroups > 0 ? config_.qp_depth_multiplier : 1);
  mux::LaneShape shape{.data_rails = config_.data_rails,
                       .control_rails = config_.ctrl_rails,
                       .depths = {depth, depth},
                       .mr_cache_entries = config_.mr_cache_entries,
                       .promise_timeout = std::chrono::milliseconds(config_.peer_timeout_ms)};
  // The background progress answers a peer's pings while the application is busy elsewhere:
  // several times within the peer timeout (pings go every quarter of it), and often enough
  // that a close notice waiting for the provider's first contact leaves soon.
  const std::chrono::milliseconds peer_timeout(config_.peer_timeout_ms);
  const auto idle_period = std::clamp<std::chrono::milliseconds>(
      peer_timeout / 8, std::chrono::milliseconds(1), kLongestIdlePeriod);
  lanes_ = std::make_unique<mux::LaneRegistry>(
      nic_pointers_, shape, config_.ngroups, idle_period, peer_timeout,
      config_.progress_thread ? mux::TurnRunner::kThread : mux::TurnRunner::kCallers);
  bootstrap_ = std::make_unique<Bootstrap>(nic_pointers_,
                                           std::chrono::milliseconds(config_.connect_timeout_ms));
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

MemoryRegion ContextCore::register_region(const void* data, std::size_t size, MemoryType type,
                                          int device) {
  if (data == nullptr || size == 0) {
    throw Error("register memory", provider(), 0,
                "an empty range (" + std::to_string(size) + " bytes at " +
                    (data == nullptr ? "null" : "an address") + ")");
  }
  if (type != MemoryType::kHost) {
    const bool taken = std::any_of(nic_pointers_.begin(), nic_pointers_.end(),
                                   [](ofi::Nic* nic) { return nic->attributes().device_memory; });
    if (!taken) {
      throw Error("register memory", provider(), 0,
                  "no NIC of this context takes device memory: " +
                      nic_pointers_.front()->attributes().device_memory_note);
    }
  }
  const ContextRegions::Name name = regions_.add(
      {.base = static_cast<const std::byte*>(data), .size = size, .type = type, .device = device});
  MemoryRegion region;
  region.owner_ = id_;
  region.slot_ = name.slot;
  region.generation_ = name.generation;
  return region;
}

void ContextCore::deregister_region(const MemoryRegion& region) noexcept {
  if (region.owner_ != id_) return;
  if (!regions_.remove({region.slot_, region.generation_})) return;
  lanes_->drop_shared_region(region.slot_, region.generation_,
                             std::chrono::milliseconds(config_.peer_timeout_ms));
}

const std::string& ContextCore::provider() const noexcept {
  return nics_.front()->attributes().provider;
}

}  // namespace loom::p2p
