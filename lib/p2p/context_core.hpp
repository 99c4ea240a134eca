// What a loom::Context is: its configuration, its NICs in locality order, the lane registry
// that communicators share, and the bootstrap endpoint that carries connection handshakes
// (p2p/bootstrap.hpp). Listeners, connectors and communicators hold it shared, so it outlives
// everything made from it. Routing (p2p/route.hpp) and the handshake (p2p/handshake.hpp) are
// functions of what it holds.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "loom/config.hpp"
#include "loom/p2p.hpp"
#include "mux/lane_registry.hpp"
#include "ofi/nic.hpp"
#include "p2p/bootstrap.hpp"
#include "p2p/context_regions.hpp"

namespace loom::p2p {

class ContextCore final {
 public:
  explicit ContextCore(const Config& config);
  ~ContextCore();
  ContextCore(const ContextCore&) = delete;
  ContextCore& operator=(const ContextCore&) = delete;

  [[nodiscard]] const Config& config() const noexcept { return config_; }
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  [[nodiscard]] mux::LaneRegistry& lanes() noexcept { return *lanes_; }
  [[nodiscard]] std::span<ofi::Nic* const> nics() const noexcept { return nic_pointers_; }
  // Why each NIC (same order as nics()) is where it is; empty with a single NIC.
  [[nodiscard]] const std::vector<std::string>& localities() const noexcept { return localities_; }
  [[nodiscard]] const std::string& provider() const noexcept;
  [[nodiscard]] Bootstrap& bootstrap() noexcept { return *bootstrap_; }
  [[nodiscard]] ContextRegions& regions() noexcept { return regions_; }
  // loom::Context::register_memory and deregister.
  MemoryRegion register_region(const void* data, std::size_t size, MemoryType type, int device);
  void deregister_region(const MemoryRegion& region) noexcept;
  // Listeners draw their nonces here, with the bootstrap mutex held (which guards the
  // generator).
  std::uint64_t random() { return rng_(); }
  // A number no other communicator of this process gets: serials count up from the context's
  // random id (which names the context's own regions), so those of two contexts collide only
  // if their ids fall within a count apart.
  std::uint64_t next_comm_serial() noexcept {
    return comm_serials_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  void order_nics_by_locality();

  Config config_;
  std::uint64_t id_;
  std::atomic<std::uint64_t> comm_serials_;
  ContextRegions regions_;
  std::mt19937_64 rng_;
  // Declaration order is teardown order, reversed: the bootstrap endpoint, lanes, then the
  // NICs they all live on.
  std::vector<std::unique_ptr<ofi::Nic>> nics_;
  std::vector<ofi::Nic*> nic_pointers_;
  std::vector<std::string> localities_;
  std::unique_ptr<mux::LaneRegistry> lanes_;
  std::unique_ptr<Bootstrap> bootstrap_;
};

}  // namespace loom::p2p
