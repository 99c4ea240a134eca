// The regions a context registered for all its communicators (loom::Context::register_memory):
// what each one covers, by slot and generation. The provider registrations are the lanes'
// (mux/shared_regions.hpp), made when a communicator of the lane first uses the region.
// Thread-safe: communicators of any lane look regions up while the application registers and
// deregisters others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "loom/memory.hpp"

namespace loom::p2p {

class ContextRegions {
 public:
  struct Region {
    const std::byte* base = nullptr;
    std::size_t size = 0;
    MemoryType type = MemoryType::kHost;
    int device = 0;
  };
  struct Name {
    std::uint32_t slot = 0;
    std::uint32_t generation = 0;
  };

  Name add(const Region& region) {
    std::lock_guard lock(mutex_);
    std::uint32_t slot;
    if (free_.empty()) {
      slot = static_cast<std::uint32_t>(entries_.size());
      entries_.emplace_back();
    } else {
      slot = free_.back();
      free_.pop_back();
    }
    Entry& entry = entries_[slot];
    entry.region = region;
    entry.live = true;
    // Generations start at 1 and never repeat for a slot: a stale name finds nothing.
    ++entry.generation;
    return {slot, entry.generation};
  }
  // The live region `name` names, or none.
  [[nodiscard]] std::optional<Region> find(Name name) const {
    std::lock_guard lock(mutex_);
    if (name.slot >= entries_.size()) return std::nullopt;
    const Entry& entry = entries_[name.slot];
    if (!entry.live || entry.generation != name.generation) return std::nullopt;
    return entry.region;
  }
  // False when `name` names no live region (deregistered already, or never made).
  bool remove(Name name) {
    std::lock_guard lock(mutex_);
    if (name.slot >= entries_.size()) return false;
    Entry& entry = entries_[name.slot];
    if (!entry.live || entry.generation != name.generation) return false;
    entry.live = false;
    free_.push_back(name.slot);
    return true;
  }

 private:
  struct Entry {
    Region region;
    std::uint32_t generation = 0;
    bool live = false;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::vector<std::uint32_t> free_;
};

}  // namespace loom::p2p
