// A NIC is one libfabric domain (with its fabric): the unit that owns registrations in ordinary
// MR mode and hosts any number of rails (endpoints).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "ofi/fid.hpp"
#include "ofi/subnet.hpp"

namespace loom::providers {
struct Profile;
}

namespace loom::ofi {

// What the upper layers and tools may know about a NIC, without libfabric types.
struct NicAttributes {
  std::string provider;  // "tcp;ofi_rxm", "efa", ...
  std::string fabric;
  std::string domain;      // the NIC's name: "lo", "rdmap16s27", "cxi0", "mlx5_0", "shm"
  std::string address;     // the NIC's source address as text, empty if the provider gives none
  std::string pci_bus_id;  // "0000:10:1b.0" where the provider reports it
  bool string_addresses = false;  // FI_ADDR_STR: endpoint names are NUL-terminated strings
  // MR handling, from the returned domain_attr->mr_mode and mode bits.
  bool endpoint_mr = false;  // FI_MR_ENDPOINT: bind + enable per endpoint
  bool virt_addr = false;    // FI_MR_VIRT_ADDR: RMA addresses are virtual, else offsets
  bool prov_key = false;     // FI_MR_PROV_KEY: keys come from the provider
  bool local_mr = false;     // FI_MR_LOCAL: local buffers need descriptors
  bool rx_cq_data = false;   // FI_RX_CQ_DATA: remote CQ data consumes a posted receive
  std::size_t cq_data_bytes = 0;
  std::size_t tag_bits = 0;  // usable tag bits (from mem_tag_format, at most 64)
  std::size_t inject_size = 0;
  std::size_t max_msg_size = 0;
  // Writes up to this size land in the target's memory in the order they were posted
  // (FI_ORDER_WAW in msg_order with max_order_waw_size; SIZE_MAX: any size); 0: no such order.
  std::size_t ordered_write_bytes = 0;
  bool carry_control = true;         // the provider profile's (providers/profile.hpp)
  bool inject_writes = true;         // the provider profile's
  unsigned eager_credits = 16;       // the provider profile's (LOOM_EAGER_CREDITS=auto)
  unsigned eager_fragments = 1;      // the provider profile's (LOOM_EAGER_FRAGMENTS=auto)
  std::size_t peer_paced_above = 0;  // the provider profile's
  bool lanes_per_direction = false;  // the provider profile's
  std::uint64_t link_speed_bps = 0;  // nic->link_attr->speed where the provider reports it; 0: not
  std::size_t max_tx_depth = 0;
  std::size_t max_rx_depth = 0;
  std::size_t max_endpoints = 0;
  std::size_t max_cq_entries = 0;  // from the device where its profile reads it; 0: unknown
  // Device memory: FI_HMEM granted (the provider takes FI_HMEM_CUDA registrations where
  // libfabric was built with CUDA), and FI_MR_HMEM (device buffers need descriptors).
  bool device_memory = false;
  bool hmem_mr = false;
  std::string device_memory_note;  // why there is no device memory; empty when there is
  bool cuda_dmabuf = true;         // LOOM_CUDA_DMABUF: try dmabuf registrations where possible
  bool cuda_ipc = false;           // LOOM_CUDA_IPC: device-only CUDA memory says so
  std::uint32_t api_version = 0;   // the libfabric API version the fabric was opened with
};

// What open_nics decided about a NIC beyond its fi_info.
struct NicOptions {
  std::string device_memory_note;  // why its fi_info has no FI_HMEM (empty when it has)
  bool cuda_dmabuf = true;         // LOOM_CUDA_DMABUF
  bool cuda_ipc = false;           // LOOM_CUDA_IPC
};

class Nic {
 public:
  // Opens the fabric and domain described by `info` (one entry of fi_getinfo's list).
  explicit Nic(InfoPtr info, NicOptions options = {});
  ~Nic();
  Nic(const Nic&) = delete;
  Nic& operator=(const Nic&) = delete;

  [[nodiscard]] const NicAttributes& attributes() const noexcept { return attributes_; }
  [[nodiscard]] const providers::Profile& profile() const noexcept { return *profile_; }
  [[nodiscard]] const fi_info& info() const noexcept { return *info_; }
  [[nodiscard]] fid_domain* domain() const noexcept { return domain_.get(); }
  // The IP subnet the NIC sits on (from the fabric name), or nullptr where the provider's
  // addresses are not IP and any NIC reaches any peer.
  [[nodiscard]] const Subnet* subnet() const noexcept { return subnet_ ? &*subnet_ : nullptr; }
  // Whether an endpoint address of a peer is on this NIC's subnet (always, without subnets).
  [[nodiscard]] bool reaches(std::span<const std::byte> peer) const noexcept {
    return !subnet_ || subnet_->contains(peer);
  }

  // Held while an endpoint on this NIC opens. Threads open lanes concurrently, and shm
  // (libfabric 1.17) then fails fi_enable with -FI_EBUSY now and then although the domain is
  // FI_THREAD_SAFE (its endpoints' shared-memory names collide); setup is rare, so serialize it.
  [[nodiscard]] std::mutex& endpoint_setup_mutex() noexcept { return endpoint_setup_mutex_; }

  // A key unique in this domain, for providers that take the requested key (no FI_MR_PROV_KEY).
  std::uint64_t next_requested_key() noexcept { return next_key_.fetch_add(1); }

  // Set once the provider refused a dmabuf registration: CUDA memory goes by address on this
  // NIC from then on.
  [[nodiscard]] bool dmabuf_refused() const noexcept { return dmabuf_refused_.load(); }
  void refuse_dmabuf() noexcept { dmabuf_refused_.store(true); }
  // Why CUDA memory cannot be registered through a dmabuf file descriptor on this NIC (no
  // device memory, libfabric older than 1.20 at build or run time, LOOM_CUDA_DMABUF=0, or a
  // refusal already); empty when it can. Whether a GPU's driver exports one is not the NIC's
  // business: that is checked where memory is exported.
  [[nodiscard]] std::string dmabuf_note() const;

 private:
  // Declaration order is destruction order, reversed: domain closes before fabric, then info.
  InfoPtr info_;
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  NicAttributes attributes_;
  const providers::Profile* profile_;
  std::optional<Subnet> subnet_;
  std::atomic<std::uint64_t> next_key_{1};
  std::atomic<bool> dmabuf_refused_{false};
  std::mutex endpoint_setup_mutex_;
};

}  // namespace loom::ofi
