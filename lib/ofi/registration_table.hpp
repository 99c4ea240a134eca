// Registrations are expensive, and under FI_MR_ENDPOINT multiplied by the endpoint count, so a
// rail set shares them between the concurrent users of the same pages: keyed by (memory type,
// device, page-aligned range) and reference counted. An entry whose last user releases it is
// deregistered at once; nothing is kept for a later user (see registration_table.cpp for why).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "loom/memory.hpp"
#include "ofi/memory_registration.hpp"

namespace loom::ofi {

struct RegistrationTableStats {
  std::uint64_t hits = 0;         // acquires that shared a registration already in use
  std::uint64_t misses = 0;       // acquires that registered
  std::size_t entries = 0;        // registrations held, every one in use
  std::size_t in_use = 0;         // entries with references (== entries)
  std::size_t registrations = 0;  // fid_mr objects behind the entries
  std::size_t bytes = 0;          // registered bytes behind the entries
};

// Not thread-safe: the owner of the rail set serializes access (lib/mux's lane lock).
class RegistrationTable {
 public:
  // `soft_bound`: above this many entries (all in use) a debug line says so; nothing is refused.
  RegistrationTable(std::span<const RegistrationTarget> targets, std::size_t soft_bound);
  ~RegistrationTable();
  RegistrationTable(const RegistrationTable&) = delete;
  RegistrationTable& operator=(const RegistrationTable&) = delete;

  // A registration covering [pointer, pointer + length), with a reference taken. Host memory
  // is widened to whole pages so neighbouring buffers in use at once share entries. `dmabuf`
  // (CUDA memory the caller exported) is used where a new registration is made; a registration
  // of the same range in use already is shared whichever way it was made (the same memory).
  // Throws loom::Error.
  MemoryRegistration& acquire(const void* pointer, std::size_t length,
                              MemoryType type = MemoryType::kHost, int device = 0,
                              const Dmabuf* dmabuf = nullptr);
  // Drops a reference; the last one deregisters (closes the fid_mr objects) at once.
  void release(MemoryRegistration& registration);

  [[nodiscard]] const RegistrationTableStats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::size_t max_entries() const noexcept { return soft_bound_; }

 private:
  using Key = std::tuple<MemoryType, int, std::uintptr_t, std::uintptr_t>;
  struct Entry {
    std::unique_ptr<MemoryRegistration> registration;
    std::size_t references = 0;
  };

  static Key key_of(const MemoryRegistration& registration);

  std::vector<RegistrationTarget> targets_;
  std::size_t soft_bound_;
  std::size_t page_size_;
  std::map<Key, Entry> entries_;
  RegistrationTableStats stats_;
};

}  // namespace loom::ofi
