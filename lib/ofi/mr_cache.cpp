#include "ofi/mr_cache.hpp"

#include <unistd.h>

#include "util/log.hpp"

namespace loom::ofi {

MrCache::MrCache(std::span<Rail* const> rails, std::size_t max_entries)
    : rails_(rails.begin(), rails.end()),
      max_entries_(max_entries),
      page_size_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {}

// Entries (and their fid_mr objects) go before the rails they are bound to: the rail set
// declares its cache after its rails.
MrCache::~MrCache() = default;

MrCache::Key MrCache::key_of(const MemoryRegistration& registration) {
  auto start = reinterpret_cast<std::uintptr_t>(registration.base());
  return {registration.type(), registration.device(), start, start + registration.length()};
}

MemoryRegistration& MrCache::acquire(const void* pointer, std::size_t length, MemoryType type,
                                     int device) {
  auto start = reinterpret_cast<std::uintptr_t>(pointer);
  auto end = start + length;
  // Device allocations may not extend to a page boundary; only host ranges are widened.
  if (type == MemoryType::kHost && pointer != nullptr && length != 0) {
    start &= ~(page_size_ - 1);
    end = (end + page_size_ - 1) & ~(page_size_ - 1);
  }
  Key key{type, device, start, end};
  if (auto it = entries_.find(key); it != entries_.end()) {
    Entry& entry = *it->second;
    if (entry.references++ == 0) {
      unused_.erase(entry.unused_position);
      ++stats_.in_use;
    }
    ++stats_.hits;
    return *entry.registration;
  }
  ++stats_.misses;
  // Registers the caller's exact range when it is invalid, so the error names it.
  auto registration =
      pointer == nullptr || length == 0
          ? std::make_unique<MemoryRegistration>(rails_, pointer, length, type, device)
          : std::make_unique<MemoryRegistration>(rails_, reinterpret_cast<const void*>(start),
                                                 end - start, type, device);
  auto entry = std::make_unique<Entry>();
  entry->registration = std::move(registration);
  entry->references = 1;
  MemoryRegistration& result = *entry->registration;
  stats_.registrations += result.registrations();
  stats_.bytes += result.length();
  ++stats_.entries;
  ++stats_.in_use;
  entries_.emplace(key, std::move(entry));
  evict_over_bound();
  return result;
}

void MrCache::release(MemoryRegistration& registration) {
  auto it = entries_.find(key_of(registration));
  if (it == entries_.end() || it->second->registration.get() != &registration ||
      it->second->references == 0) {
    util::log().error("MR cache: release of a registration it does not hold ({} bytes at {})",
                      registration.length(), registration.base());
    return;
  }
  Entry& entry = *it->second;
  if (--entry.references == 0) {
    --stats_.in_use;
    unused_.push_front(&entry);
    entry.unused_position = unused_.begin();
    evict_over_bound();
  }
}

void MrCache::evict_over_bound() {
  while (entries_.size() > max_entries_ && !unused_.empty()) {
    Entry* victim = unused_.back();
    unused_.pop_back();
    stats_.registrations -= victim->registration->registrations();
    stats_.bytes -= victim->registration->length();
    --stats_.entries;
    ++stats_.evictions;
    entries_.erase(key_of(*victim->registration));
  }
  if (entries_.size() > max_entries_) {
    util::log().debug("MR cache over its bound ({} > {}): every entry is in use", entries_.size(),
                      max_entries_);
  }
}

}  // namespace loom::ofi
