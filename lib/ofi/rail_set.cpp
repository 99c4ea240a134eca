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

RailPlacement RailPlacement::round_robin(std::span<Nic* const> nics, std::size_t data_rails,
                                         std::size_t control_rails) {
  RailPlacement placement;
  if (nics.empty()) return placement;
  for (std::size_t i = 0; i < data_rails; ++i) placement.data.push_back(nics[i % nics.size()]);
  for (std::size_t j = 0; j < control_rails; ++j) {
    placement.control.push_back(nics[j % nics.size()]);
  }
  return placement;
}

namespace {
std::span<Nic* const> require_nics(std::span<Nic* const> nics) {
  if (nics.empty()) throw Error("open rails", "", 0, "no NIC to open rails on");
  return nics;
}
}  // namespace

RailSet::RailSet(std::span<Nic* const> nics, const RailSetShape& shape)
    : RailSet(RailPlacement::round_robin(require_nics(nics), shape.data_rails, shape.control_rails),
              shape) {}

RailSet::RailSet(const RailPlacement& placement, const RailSetShape& shape)
    : data_rails_(placement.data.size()) {
  const std::size_t total = placement.data.size() + placement.control.size();
  if (placement.data.empty() || placement.control.empty()) {
    const std::string provider = total == 0
                                     ? ""
                                     : (placement.data.empty() ? placement.control : placement.data)
                                           .front()
                                           ->attributes()
                                           .provider;
    throw Error("open rails", provider, 0,
                "a rail set needs at least one data rail and one control rail (asked for " +
                    std::to_string(placement.data.size()) + " data, " +
                    std::to_string(placement.control.size()) + " control)");
  }
  auto nic_of = [&](std::size_t i) {
    return i < data_rails_ ? placement.data[i] : placement.control[i - data_rails_];
  };
  // One CQ per NIC and role, sized for every rail it serves; data CQs first (see progress()).
  std::vector<Nic*> cq_nics;
  std::vector<std::size_t> cq_of(total);
  std::vector<std::size_t> cq_sizes;
  std::vector<RailDepths> depths(total);
  for (std::size_t i = 0; i < total; ++i) {
    Nic* nic = nic_of(i);
    const bool data = i < data_rails_;
    std::size_t cq = data ? 0 : data_cqs_;
    while (cq < cq_nics.size() && cq_nics[cq] != nic) ++cq;
    cq_of[i] = cq;
    if (cq == cq_nics.size()) {
      cq_nics.push_back(nic);
      cq_sizes.push_back(0);
      if (data) ++data_cqs_;
    }
    depths[i] = clamp_depths(*nic, shape.depths);
    // 0 is "not reported": no limit of the provider's to honour.
    if (const std::size_t limit = nic->attributes().max_msg_size; data && limit != 0) {
      max_msg_size_ = std::min(max_msg_size_, limit);
    }
    cq_sizes[cq_of[i]] += depths[i].tx + depths[i].rx + Rail::kRxCqDataReceives;
  }
  for (std::size_t n = 0; n < cq_nics.size(); ++n) {
    cqs_.push_back(std::make_unique<CompletionQueue>(*cq_nics[n], cq_sizes[n]));
  }
  rails_.reserve(total);
  for (std::size_t i = 0; i < total; ++i) {
    const bool data = i < data_rails_;
    rails_.push_back(std::make_unique<Rail>(*nic_of(i), data ? RailRole::kData : RailRole::kControl,
                                            i, depths[i], cqs_[cq_of[i]].get()));
    rail_pointers_.push_back(rails_.back().get());
  }
  registration_table_ = std::make_unique<RegistrationTable>(registration_targets(rail_pointers_),
                                                            shape.mr_cache_entries);
}

// Registrations bound to the endpoints (FI_MR_ENDPOINT) close before them. Others close after
// them: an operation still in flight on an endpoint (a peer's RMA write landing in a buffer
// whose communicator closed) must not refer to a closed registration when the endpoint closes;
// rxm over tcp crashes in fi_close there.
RailSet::~RailSet() {
  const bool endpoint_mr = !rails_.empty() && rails_.front()->nic().attributes().endpoint_mr;
  if (!endpoint_mr) rails_.clear();
}

std::size_t RailSet::progress(Awaiting awaiting) {
  // Credits the provider refused (FI_RX_CQ_DATA back-pressure) are posted again first: remote
  // writes stall while none is posted. Only data rails hold receives.
  for (std::size_t i = 0; i < data_rails_; ++i) rails_[i]->retry_receives();
  std::size_t handled = 0;
  for (std::size_t i = 0; i < data_cqs_; ++i) handled += cqs_[i]->progress();
  if (!control_due(handled != 0, awaiting)) return handled;
  ++control_reads_;
  std::size_t control = 0;
  for (std::size_t i = data_cqs_; i < cqs_.size(); ++i) control += cqs_[i]->progress();
  control_owed_ = control != 0;
  skipped_calls_ = 0;
  data_since_read_ = false;
  return handled + control;
}

bool RailSet::control_due(bool found_data, Awaiting awaiting) noexcept {
  if (control_owed_) return true;
  // The caller's data first: on rxm a control read is a poll(), on the way of the reply the
  // data may let the caller send. The next call reads for it.
  if (found_data) {
    data_since_read_ = true;
    return ++skipped_calls_ > kBusyControlSkips;
  }
  if (data_since_read_ || awaiting == Awaiting::kAnything) return true;
  return ++skipped_calls_ > kQuietControlSkips;
}

void RailSet::set_remote_write_handler(RemoteWriteHandler* handler) noexcept {
  for (auto& cq : cqs_) cq->set_remote_write_handler(handler);
}

}  // namespace loom::ofi
