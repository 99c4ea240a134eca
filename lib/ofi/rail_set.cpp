#include "ofi/rail_set.hpp"

#include <algorithm>

#include "loom/error.hpp"
#include "ofi/nic.hpp"
#include "util/log.hpp"

namespace loom::ofi {

RailDepths clamp_depths(const Nic& nic, RailDepths wanted) {
  const NicAttributes& a = nic.attributes();
  RailDepths clamped{std::min(wanted.tx, a.max_tx_depth ? a.max_tx_depth : wanted.tx),
                     std::min(wanted.rx, a.max_rx_depth ? a.max_rx_depth : wanted.rx)};
  if (clamped.tx != wanted.tx || clamped.rx != wanted.rx) {
    util::log().info(
        "queue depths on {} clamped to the provider's limits: tx {} -> {}, rx {} -> {}", a.domain,
        wanted.tx, clamped.tx, wanted.rx, clamped.rx);
  }
  return clamped;
}

RailSet::RailSet(std::span<Nic* const> nics, const RailSetShape& shape)
    : data_rails_(shape.data_rails) {
  std::string provider = nics.empty() ? "" : nics.front()->attributes().provider;
  if (nics.empty()) throw Error("open rails", "", 0, "no NIC to open rails on");
  if (shape.data_rails == 0 || shape.control_rails == 0) {
    throw Error("open rails", provider, 0,
                "a rail set needs at least one data rail and one control rail (asked for " +
                    std::to_string(shape.data_rails) + " data, " +
                    std::to_string(shape.control_rails) + " control)");
  }
  const std::size_t total = shape.data_rails + shape.control_rails;
  // Data rail i and control rail j go to NIC i % n and j % n.
  auto nic_index = [&](std::size_t i) {
    return (i < shape.data_rails ? i : i - shape.data_rails) % nics.size();
  };
  // One CQ per NIC, sized for every rail it serves.
  std::vector<std::size_t> cq_sizes(nics.size(), 0);
  std::vector<RailDepths> depths(total);
  for (std::size_t i = 0; i < total; ++i) {
    depths[i] = clamp_depths(*nics[nic_index(i)], shape.depths);
    cq_sizes[nic_index(i)] += depths[i].tx + depths[i].rx + Rail::kRxCqDataCredits;
  }
  for (std::size_t n = 0; n < nics.size(); ++n) {
    cqs_.push_back(cq_sizes[n] != 0 ? std::make_unique<CompletionQueue>(*nics[n], cq_sizes[n])
                                    : nullptr);
  }
  rails_.reserve(total);
  for (std::size_t i = 0; i < total; ++i) {
    const bool data = i < shape.data_rails;
    rails_.push_back(std::make_unique<Rail>(*nics[nic_index(i)],
                                            data ? RailRole::kData : RailRole::kControl, i,
                                            depths[i], cqs_[nic_index(i)].get()));
    rail_pointers_.push_back(rails_.back().get());
  }
  std::erase(cqs_, nullptr);
  mr_cache_ = std::make_unique<MrCache>(rail_pointers_, shape.mr_cache_entries);
}

RailSet::~RailSet() = default;

std::size_t RailSet::progress() {
  std::size_t handled = 0;
  for (auto& cq : cqs_) handled += cq->progress();
  return handled;
}

void RailSet::set_remote_write_handler(RemoteWriteHandler* handler) noexcept {
  for (auto& cq : cqs_) cq->set_remote_write_handler(handler);
}

}  // namespace loom::ofi
