// Rail setup and teardown. The data path is in rail_datapath.cpp.
#include "ofi/rail.hpp"

#include <algorithm>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include "loom/error.hpp"
#include "ofi/error.hpp"
#include "ofi/memory_registration.hpp"
#include "ofi/nic.hpp"
#include "util/log.hpp"

namespace loom::ofi {

static_assert(sizeof(fi_context2) == kProviderContextBytes);
static_assert(alignof(fi_context2) <= alignof(OpContext));

namespace {

// A rail's AV holds its own address and few peers; libfabric grows it when needed.
constexpr std::size_t kAvCount = 16;

}  // namespace

Rail::Rail(Nic& nic, RailRole role, std::size_t index, RailDepths depths, CompletionQueue* shared)
    : nic_(&nic),
      role_(role),
      index_(index),
      depths_(depths),
      description_(describe()),
      receives_(*this),
      cq_(shared) {
  const std::string& provider = nic.attributes().provider;
  const std::string operation = "open " + describe(false);  // Error adds the provider
  std::lock_guard setup(nic.endpoint_setup_mutex());

  InfoPtr info = duplicate(nic.info());
  info->tx_attr->size = depths_.tx;
  info->rx_attr->size = depths_.rx;

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = kAvCount;
  fid_av* av = nullptr;
  if (int rc = fi_av_open(nic.domain(), &av_attr, &av, nullptr); rc != 0) {
    throw_fi_error(operation, "fi_av_open", provider, rc);
  }
  av_.reset(av);

  if (cq_ == nullptr) {
    own_cq_ = std::make_unique<CompletionQueue>(nic, depths_.tx + depths_.rx + kRxCqDataReceives);
    cq_ = own_cq_.get();
  }

  fid_ep* endpoint = nullptr;
  if (int rc = fi_endpoint(nic.domain(), info.get(), &endpoint, nullptr); rc != 0) {
    throw_fi_error(operation, "fi_endpoint", provider, rc);
  }
  endpoint_.reset(endpoint);
  if (int rc = fi_ep_bind(endpoint_.get(), &av_->fid, 0); rc != 0) {
    throw_fi_error(operation, "fi_ep_bind(av)", provider, rc);
  }
  if (int rc = fi_ep_bind(endpoint_.get(), &cq_->get()->fid, FI_TRANSMIT | FI_RECV); rc != 0) {
    throw_fi_error(operation, "fi_ep_bind(cq)", provider, rc);
  }
  if (int rc = fi_enable(endpoint_.get()); rc != 0) {
    throw_fi_error(operation, "fi_enable", provider, rc);
  }

  std::size_t name_length = 0;
  fi_getname(&endpoint_->fid, nullptr, &name_length);
  name_.resize(name_length);
  if (int rc = fi_getname(&endpoint_->fid, name_.data(), &name_length); rc != 0) {
    throw_fi_error(operation, "fi_getname", provider, rc);
  }
  name_.resize(name_length);
  self_ = insert_peer(name_);

  flush_ = std::make_unique<FlushBuffer>(registration_target());
  if (role_ == RailRole::kData && nic.attributes().rx_cq_data) receives_.post_all();
  util::log().debug("opened {} (tx {}, rx {})", describe(), depths_.tx, depths_.rx);
}

// Posted receives hold contexts owned by this rail; cancel them before the endpoint closes.
Rail::~Rail() {
  receives_.cancel_posted();
}

std::string Rail::describe(bool with_provider) const {
  std::string text = std::string(role_ == RailRole::kData ? "data" : "control") + " rail " +
                     std::to_string(index_) + " on " + nic_->attributes().domain;
  return with_provider ? text + " [" + nic_->attributes().provider + "]" : text;
}

std::vector<RegistrationTarget> registration_targets(std::span<Rail* const> rails) {
  std::vector<RegistrationTarget> targets;
  targets.reserve(rails.size());
  for (const Rail* rail : rails) targets.push_back(rail->registration_target());
  return targets;
}

Address Rail::insert_peer(std::span<const std::byte> address) {
  // fi_av_insert reads as many bytes as the provider's address format holds (a string format:
  // up to its NUL). A name from the wire that is shorter would make it read past the name.
  const bool fits = nic_->attributes().string_addresses
                        ? std::find(address.begin(), address.end(), std::byte{0}) != address.end()
                        : address.size() >= name_.size();
  if (!fits) {
    throw Error("insert peer address on " + describe(false), nic_->attributes().provider, 0,
                "a " + std::to_string(address.size()) + "-byte address is not a " +
                    nic_->attributes().provider + " endpoint name (" +
                    (nic_->attributes().string_addresses
                         ? std::string("no terminating NUL")
                         : std::to_string(name_.size()) + " bytes expected") +
                    ")");
  }
  fi_addr_t peer = FI_ADDR_NOTAVAIL;
  int inserted = fi_av_insert(av_.get(), address.data(), 1, &peer, 0, nullptr);
  if (inserted != 1 || peer == FI_ADDR_NOTAVAIL) {
    throw_fi_error("insert peer address on " + describe(false), "fi_av_insert",
                   nic_->attributes().provider, inserted < 0 ? inserted : -FI_EADDRNOTAVAIL,
                   std::to_string(address.size()) + "-byte address");
  }
  return peer;
}

void Rail::remove_peer(Address peer) noexcept {
  fi_addr_t address = peer;
  if (int rc = fi_av_remove(av_.get(), &address, 1, 0); rc != 0) {
    util::log().warn("fi_av_remove on {}: {}", describe(true), fi_error_text(rc));
  }
}

void RxCqDataReceives::post_all() {
  receives_.resize(kCount);
  waiting_.reserve(kCount);  // repost() never allocates
  for (auto& receive : receives_) {
    receive.handler = this;
    const Status s = rail_->recv(nullptr, 0, nullptr, &receive);
    if (s == Status::kRetry) {
      waiting_.push_back(&receive);
    } else if (s != Status::kOk) {
      throw Error("open " + rail_->describe(false), rail_->nic().attributes().provider, 0,
                  "cannot post receives for FI_RX_CQ_DATA: " + rail_->last_error());
    }
  }
}

// cancel() logs a failure; one the provider no longer holds has completed already. Credits
// waiting to be posted again are not posted: nothing to cancel.
void RxCqDataReceives::cancel_posted() noexcept {
  for (auto& receive : receives_) {
    if (std::find(waiting_.begin(), waiting_.end(), &receive) == waiting_.end()) {
      static_cast<void>(rail_->cancel(&receive));
    }
  }
}

}  // namespace loom::ofi
