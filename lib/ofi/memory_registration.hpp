// One user buffer registered for a set of rails. In ordinary mode that is one fid_mr per
// domain; when the provider requires FI_MR_ENDPOINT it is one fid_mr per endpoint, each bound to
// its endpoint and enabled, for data and control rails alike. One kind of registration serves
// both modes: callers ask desc(rail) and key(rail) and never see the difference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/memory.hpp"
#include "ofi/fid.hpp"

namespace loom::ofi {

class Nic;

// What a registration needs of one rail: its NIC (the domain), its endpoint (bound and enabled
// under FI_MR_ENDPOINT), its index (desc(index), key(index)) and a name for errors. Rail makes
// one (Rail::registration_target, registration_targets in rail.hpp); this header needs no Rail.
// The NIC, the endpoint and the name's storage must outlive the registration.
struct RegistrationTarget {
  Nic* nic = nullptr;
  fid_ep* endpoint = nullptr;
  std::size_t index = 0;
  std::string_view name;
};

class MemoryRegistration {
 public:
  // Registers [base, base + length) on every target in `targets` (indexed by their index). The
  // rails behind them must outlive the registration; RailSet's declaration order guarantees it.
  // `dmabuf`: CUDA memory the caller exported (loom::Dmabuf), registered through it where the NIC
  // takes a dmabuf and by address elsewhere; read during the call only. Throws loom::Error
  // naming the rail, provider and fi_strerror text.
  MemoryRegistration(std::span<const RegistrationTarget> targets, const void* base,
                     std::size_t length, MemoryType type = MemoryType::kHost, int device = 0,
                     const Dmabuf* dmabuf = nullptr);
  ~MemoryRegistration();
  MemoryRegistration(const MemoryRegistration&) = delete;
  MemoryRegistration& operator=(const MemoryRegistration&) = delete;

  // Local descriptor for operations posted on rail `rail` (may be null: no FI_MR_LOCAL).
  [[nodiscard]] void* desc(std::size_t rail) const noexcept { return slots_[rail].desc; }
  // Key a peer uses to reach this buffer through rail `rail`.
  [[nodiscard]] std::uint64_t key(std::size_t rail) const noexcept { return slots_[rail].key; }
  // The address a peer names for `pointer`: virtual (FI_MR_VIRT_ADDR) or an offset.
  [[nodiscard]] std::uint64_t remote_address(const void* pointer) const noexcept {
    auto p = reinterpret_cast<std::uintptr_t>(pointer);
    return virt_addr_ ? p : p - reinterpret_cast<std::uintptr_t>(base_);
  }

  [[nodiscard]] const void* base() const noexcept { return base_; }
  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  [[nodiscard]] MemoryType type() const noexcept { return type_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] bool contains(const void* pointer, std::size_t length) const noexcept {
    auto p = reinterpret_cast<std::uintptr_t>(pointer);
    auto b = reinterpret_cast<std::uintptr_t>(base_);
    return p >= b && length <= length_ && p - b <= length_ - length;
  }
  [[nodiscard]] bool covers_rail(std::size_t rail) const noexcept {
    return rail < slots_.size() && slots_[rail].registered;
  }
  // fid_mr objects held: domains in ordinary mode, endpoints under FI_MR_ENDPOINT.
  [[nodiscard]] std::size_t registrations() const noexcept { return mrs_.size(); }
  // Whether CUDA memory was registered through a dmabuf (FI_MR_DMABUF) on some NIC.
  [[nodiscard]] bool through_dmabuf() const noexcept { return through_dmabuf_; }

 private:
  struct Source;
  static void check_memory(std::span<const RegistrationTarget> targets, Source& source,
                           const std::string& provider);
  FidPtr<fid_mr> register_on(Nic& nic, Source& source, const std::string& where);

  struct Slot {
    void* desc = nullptr;
    std::uint64_t key = 0;
    bool registered = false;
  };

  const void* base_;
  std::size_t length_;
  MemoryType type_;
  int device_;
  bool virt_addr_ = false;
  bool through_dmabuf_ = false;
  std::vector<FidPtr<fid_mr>> mrs_;
  std::vector<Slot> slots_;
};

}  // namespace loom::ofi
