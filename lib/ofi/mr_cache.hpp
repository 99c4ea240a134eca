// Registrations are expensive, and under FI_MR_ENDPOINT multiplied by the endpoint count, so a
// rail set caches them: keyed by (memory type, device, page-aligned range), reference counted,
// and bounded by evicting the least recently released unreferenced entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "loom/memory.hpp"
#include "ofi/memory_registration.hpp"

namespace loom::ofi {

class Rail;

struct MrCacheStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;
  std::size_t entries = 0;        // registrations held (in use or cached)
  std::size_t in_use = 0;         // entries with references
  std::size_t registrations = 0;  // fid_mr objects behind the entries
  std::size_t bytes = 0;          // registered bytes behind the entries
};

// Not thread-safe: the owner of the rail set serializes access (lib/mux's lane lock).
class MrCache {
 public:
  MrCache(std::span<Rail* const> rails, std::size_t max_entries);
  ~MrCache();
  MrCache(const MrCache&) = delete;
  MrCache& operator=(const MrCache&) = delete;

  // A registration covering [pointer, pointer + length), with a reference taken. Host memory
  // is widened to whole pages so neighbouring buffers share entries. Throws loom::Error.
  MemoryRegistration& acquire(const void* pointer, std::size_t length,
                              MemoryType type = MemoryType::kHost, int device = 0);
  // Drops a reference; the registration stays cached until evicted.
  void release(MemoryRegistration& registration);

  [[nodiscard]] const MrCacheStats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::size_t max_entries() const noexcept { return max_entries_; }

 private:
  using Key = std::tuple<MemoryType, int, std::uintptr_t, std::uintptr_t>;
  struct Entry {
    std::unique_ptr<MemoryRegistration> registration;
    std::size_t references = 0;
    std::list<Entry*>::iterator unused_position;  // valid while references == 0
  };

  static Key key_of(const MemoryRegistration& registration);
  void evict_over_bound();

  std::vector<Rail*> rails_;
  std::size_t max_entries_;
  std::size_t page_size_;
  std::map<Key, std::unique_ptr<Entry>> entries_;
  std::list<Entry*> unused_;  // unreferenced entries, most recently released first
  MrCacheStats stats_;
};

}  // namespace loom::ofi
