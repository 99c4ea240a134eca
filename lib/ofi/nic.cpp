#include "ofi/nic.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "ofi/error.hpp"
#include "ofi/mr_attributes.hpp"
#include "providers/profile.hpp"
#include "util/log.hpp"

namespace loom::ofi {
namespace {

std::string address_text(const fi_info& info) {
  if (info.src_addr == nullptr) return {};
  char text[INET6_ADDRSTRLEN] = {};
  if (info.addr_format == FI_SOCKADDR_IN && info.src_addrlen >= sizeof(sockaddr_in)) {
    auto* sin = static_cast<const sockaddr_in*>(info.src_addr);
    inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text);
  } else if (info.addr_format == FI_SOCKADDR_IN6 && info.src_addrlen >= sizeof(sockaddr_in6)) {
    auto* sin6 = static_cast<const sockaddr_in6*>(info.src_addr);
    inet_ntop(AF_INET6, &sin6->sin6_addr, text, sizeof text);
  }
  return text;
}

std::string pci_text(const fi_info& info) {
  if (info.nic == nullptr || info.nic->bus_attr == nullptr ||
      info.nic->bus_attr->bus_type != FI_BUS_PCI) {
    return {};
  }
  const auto& pci = info.nic->bus_attr->attr.pci;
  char text[32];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.%x", pci.domain_id, pci.bus_id, pci.device_id,
                pci.function_id);
  return text;
}

// mem_tag_format marks usable tag bits with ones in its low, provider-defined fields; loom only
// needs the count. 0 means the provider did not say: assume all 64.
std::size_t usable_tag_bits(std::uint64_t mem_tag_format) {
  if (mem_tag_format == 0) return 64;
  return 64 - static_cast<std::size_t>(std::countl_zero(mem_tag_format));
}

// efa, verbs and cxi describe their port in fi_info's nic; tcp and shm leave it out.
std::uint64_t link_speed(const fi_info& info) noexcept {
  if (info.nic == nullptr || info.nic->link_attr == nullptr) return 0;
  return static_cast<std::uint64_t>(info.nic->link_attr->speed);
}

NicAttributes describe(const fi_info& info, NicOptions options) {
  const auto mr_mode = static_cast<unsigned>(info.domain_attr->mr_mode);
  const bool device_memory = (info.caps & FI_HMEM) != 0;
  return NicAttributes{
      .provider = info.fabric_attr->prov_name ? info.fabric_attr->prov_name : "",
      .fabric = info.fabric_attr->name ? info.fabric_attr->name : "",
      .domain = info.domain_attr->name ? info.domain_attr->name : "",
      .address = address_text(info),
      .pci_bus_id = pci_text(info),
      .string_addresses = info.addr_format == FI_ADDR_STR,
      .endpoint_mr = (mr_mode & FI_MR_ENDPOINT) != 0,
      .virt_addr = (mr_mode & FI_MR_VIRT_ADDR) != 0,
      .prov_key = (mr_mode & FI_MR_PROV_KEY) != 0,
      .local_mr = (mr_mode & FI_MR_LOCAL) != 0,
      .rx_cq_data = (info.mode & FI_RX_CQ_DATA) != 0,
      .cq_data_bytes = info.domain_attr->cq_data_size,
      .tag_bits = usable_tag_bits(info.ep_attr->mem_tag_format),
      .inject_size = info.tx_attr->inject_size,
      .max_msg_size = info.ep_attr->max_msg_size,
      .ordered_write_bytes =
          (info.tx_attr->msg_order & FI_ORDER_WAW) != 0 ? info.ep_attr->max_order_waw_size : 0,
      .link_speed_bps = link_speed(info),
      .max_tx_depth = info.tx_attr->size,
      .max_rx_depth = info.rx_attr->size,
      .max_endpoints = info.domain_attr->ep_cnt,
      .device_memory = device_memory,
      .hmem_mr = (mr_mode & FI_MR_HMEM) != 0,
      .device_memory_note = device_memory ? std::string() : std::move(options.device_memory_note),
      .cuda_dmabuf = options.cuda_dmabuf,
      .cuda_ipc = options.cuda_ipc,
      .api_version = info.fabric_attr->api_version,
  };
}

}  // namespace

Nic::Nic(InfoPtr info, NicOptions options)
    : info_(std::move(info)),
      attributes_(describe(*info_, std::move(options))),
      profile_(&providers::profile_for(attributes_.provider)) {
  fid_fabric* fabric = nullptr;
  if (int rc = fi_fabric(info_->fabric_attr, &fabric, nullptr); rc != 0) {
    throw_fi_error("open NIC " + attributes_.domain, "fi_fabric", attributes_.provider, rc);
  }
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  if (int rc = fi_domain(fabric_.get(), info_.get(), &domain, nullptr); rc != 0) {
    throw_fi_error("open NIC " + attributes_.domain, "fi_domain", attributes_.provider, rc);
  }
  domain_.reset(domain);
  if (info_->addr_format == FI_SOCKADDR_IN || info_->addr_format == FI_SOCKADDR_IN6) {
    subnet_ = Subnet::parse(attributes_.fabric);
  }
  // Every inject (data and control messages) then goes as a send with a completion.
  if (!profile_->no_inject.empty()) attributes_.inject_size = 0;
  attributes_.carry_control = profile_->carry_control;
  attributes_.inject_writes = profile_->inject_writes;
  attributes_.eager_credits = profile_->eager_credits;
  attributes_.eager_fragments = profile_->eager_fragments;
  attributes_.peer_paced_above = profile_->peer_paced_above;
  attributes_.lanes_per_direction = profile_->lanes_per_direction;
  if (profile_->device_limits != nullptr) {
    if (auto limits = profile_->device_limits(attributes_.domain)) {
      if (limits->max_endpoints != 0) attributes_.max_endpoints = limits->max_endpoints;
      attributes_.max_cq_entries = limits->max_cq_entries;
      if (limits->max_queue_depth != 0) {
        attributes_.max_tx_depth = std::min(attributes_.max_tx_depth, limits->max_queue_depth);
        attributes_.max_rx_depth = std::min(attributes_.max_rx_depth, limits->max_queue_depth);
      }
    }
  }
  util::log().info("NIC {} [{}] fabric {} address {} mr: {}{}{}{}{}; device memory: {}",
                   attributes_.domain, attributes_.provider, attributes_.fabric,
                   attributes_.address, attributes_.endpoint_mr ? "endpoint " : "domain ",
                   attributes_.virt_addr ? "virt-addr " : "offset ",
                   attributes_.prov_key ? "prov-key " : "user-key ",
                   attributes_.local_mr ? "local " : "", attributes_.hmem_mr ? "hmem" : "",
                   attributes_.device_memory ? "FI_HMEM" : "none");
}

Nic::~Nic() = default;

std::string Nic::dmabuf_note() const {
  if (!attributes_.device_memory) return attributes_.device_memory_note;
  DmabufFacts facts{.linked_version = fi_version(),
                    .enabled = attributes_.cuda_dmabuf,
                    .device = true,
                    .refused = dmabuf_refused()};
  facts.compiled = facts.compiled && attributes_.api_version >= kDmabufApiVersion;
  return dmabuf_refusal(facts);
}

}  // namespace loom::ofi
