// Regions registered once for every communicator of a context (loom::Context::register_memory),
// as one lane holds them. A lane registers such a region on its rails the first time one of its
// communicators uses it (under FI_MR_ENDPOINT bound to this lane's endpoints), so a region costs
// provider registrations only on the lanes that use it, lanes opened after it included. The
// registration stays while the region lives; once the context deregistered the region it goes
// with the last request part on the lane that still uses it (the provider may read or write
// through it until then). Entries are keyed by the context's {slot, generation}: a slot the
// context reuses names a new entry while the old one drains. Everything runs under the lane lock.
//
// Each region has registrations of its own, not an entry of the lane's registration table shared
// with other users of the same pages: a peer may hold its keys (one-sided descriptors), and
// deregistering the region must revoke them whatever else registered those pages. Keys the
// provider lets loom choose are never reused (Nic::next_requested_key), so a stale key never
// reaches a later region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "loom/memory.hpp"
#include "ofi/memory_registration.hpp"

namespace loom::mux {

class SharedRegions {
 public:
  // `targets`: the lane's rails (ofi::registration_targets), which outlive this object.
  explicit SharedRegions(std::vector<ofi::RegistrationTarget> targets)
      : targets_(std::move(targets)) {}

  static constexpr std::uint32_t kNone = UINT32_MAX;

  // The live entry of region {slot, generation}, or kNone: the lane has not used the region
  // yet, or the context deregistered it.
  [[nodiscard]] std::uint32_t find(std::uint32_t slot, std::uint32_t generation) const noexcept {
    for (std::uint32_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.registration != nullptr && !e.dropped && e.slot == slot && e.generation == generation)
        return i;
    }
    return kNone;
  }
  // Registers region {slot, generation} over [base, base + size) on the lane's rails (find()
  // found none). Throws loom::Error (the provider refused the registration).
  std::uint32_t add(std::uint32_t slot, std::uint32_t generation, const std::byte* base,
                    std::size_t size, MemoryType type, int device) {
    auto registration =
        std::make_unique<ofi::MemoryRegistration>(targets_, base, size, type, device);
    std::uint32_t i = 0;
    while (i < entries_.size() && entries_[i].registration != nullptr) ++i;
    if (i == entries_.size()) entries_.emplace_back();
    entries_[i] = Entry{.registration = std::move(registration),
                        .base = base,
                        .size = size,
                        .slot = slot,
                        .generation = generation};
    return i;
  }
  [[nodiscard]] const ofi::MemoryRegistration& registration(std::uint32_t entry) const noexcept {
    return *entries_[entry].registration;
  }
  // Whether [data, data + length) lies within the region of `entry`.
  [[nodiscard]] bool covers(std::uint32_t entry, const void* data,
                            std::size_t length) const noexcept {
    const Entry& e = entries_[entry];
    auto p = static_cast<const std::byte*>(data);
    return p >= e.base && length <= e.size &&
           static_cast<std::size_t>(p - e.base) <= e.size - length;
  }
  [[nodiscard]] std::size_t size(std::uint32_t entry) const noexcept {
    return entries_[entry].size;
  }
  [[nodiscard]] const std::byte* base(std::uint32_t entry) const noexcept {
    return entries_[entry].base;
  }
  // A request part uses the entry until it is retired (let_go).
  void hold(std::uint32_t entry) noexcept { ++entries_[entry].users; }
  void let_go(std::uint32_t entry) noexcept {
    Entry& e = entries_[entry];
    if (--e.users == 0 && e.dropped) release(e);
  }
  // The context deregistered region {slot, generation}: released now, or by the last let_go.
  void drop(std::uint32_t slot, std::uint32_t generation) noexcept {
    for (Entry& e : entries_) {
      if (e.registration == nullptr || e.slot != slot || e.generation != generation) continue;
      e.dropped = true;
      if (e.users == 0) release(e);
    }
  }
  // Regions this lane holds registered for the context.
  [[nodiscard]] std::size_t held() const noexcept {
    std::size_t n = 0;
    for (const Entry& e : entries_) n += e.registration != nullptr ? 1 : 0;
    return n;
  }
  // The fid_mr objects and bytes behind them.
  [[nodiscard]] std::size_t registrations() const noexcept {
    std::size_t n = 0;
    for (const Entry& e : entries_)
      n += e.registration != nullptr ? e.registration->registrations() : 0;
    return n;
  }
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const Entry& e : entries_) n += e.registration != nullptr ? e.size : 0;
    return n;
  }

 private:
  struct Entry {
    std::unique_ptr<ofi::MemoryRegistration> registration;  // nullptr: a free entry
    const std::byte* base = nullptr;                        // what the context registered
    std::size_t size = 0;
    std::uint32_t slot = 0;
    std::uint32_t generation = 0;
    std::uint32_t users = 0;
    bool dropped = false;
  };
  // Closes the registration's fid_mr objects: from here on the provider refuses its keys.
  static void release(Entry& e) noexcept { e = Entry{}; }

  std::vector<ofi::RegistrationTarget> targets_;
  std::vector<Entry> entries_;  // indices are stable: parts name their entry by index
};

}  // namespace loom::mux
