// Why nothing is kept once its last user lets go: a registration names pages, not addresses.
// On verbs, EFA and CXI it pins the physical pages behind the range when it is made; if the
// application frees the buffer and a later allocation lands on the same virtual range, an entry
// kept for that range would hand out the old registration, and the NIC would read or write the
// old (still pinned) pages: silent corruption that tcp and shm, which go by virtual address,
// never show. Keeping unreferenced registrations safely needs a memory monitor that invalidates
// them on munmap/free (what libfabric's FI_MR_CACHE_MONITOR does). The providers where
// registration is costly (efa, verbs, cxi) already keep such a monitored cache per domain
// below us, so a second, unmonitored one here would buy little and risk everything. What stays
// is sharing: concurrent users of the same pages (comms on one lane, neighbouring buffers) hold
// one registration, which also bounds the fid_mr count under FI_MR_ENDPOINT.
#include "ofi/registration_table.hpp"

#include <unistd.h>

#include "util/log.hpp"

namespace loom::ofi {

RegistrationTable::RegistrationTable(std::span<const RegistrationTarget> targets,
                                     std::size_t soft_bound)
    : targets_(targets.begin(), targets.end()),
      soft_bound_(soft_bound),
      page_size_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {}

// Entries (and their fid_mr objects) go before the rails they are bound to: the rail set
// declares its cache after its rails.
RegistrationTable::~RegistrationTable() = default;

RegistrationTable::Key RegistrationTable::key_of(const MemoryRegistration& registration) {
  auto start = reinterpret_cast<std::uintptr_t>(registration.base());
  return {registration.type(), registration.device(), start, start + registration.length()};
}

MemoryRegistration& RegistrationTable::acquire(const void* pointer, std::size_t length,
                                               MemoryType type, int device, const Dmabuf* dmabuf) {
  auto start = reinterpret_cast<std::uintptr_t>(pointer);
  auto end = start + length;
  // Device allocations may not extend to a page boundary; only host ranges are widened.
  if (type == MemoryType::kHost && pointer != nullptr && length != 0) {
    start &= ~(page_size_ - 1);
    end = (end + page_size_ - 1) & ~(page_size_ - 1);
  }
  Key key{type, device, start, end};
  if (auto it = entries_.find(key); it != entries_.end()) {
    // In use by someone else right now, so the memory is still allocated: safe to share.
    ++it->second.references;
    ++stats_.hits;
    return *it->second.registration;
  }
  ++stats_.misses;
  // Registers the caller's exact range when it is invalid, so the error names it.
  // (A dmabuf's range is never widened: only host ranges are.)
  auto registration =
      pointer == nullptr || length == 0
          ? std::make_unique<MemoryRegistration>(targets_, pointer, length, type, device, dmabuf)
          : std::make_unique<MemoryRegistration>(targets_, reinterpret_cast<const void*>(start),
                                                 end - start, type, device, dmabuf);
  MemoryRegistration& result = *registration;
  stats_.registrations += result.registrations();
  stats_.bytes += result.length();
  ++stats_.entries;
  ++stats_.in_use;
  entries_.emplace(key, Entry{.registration = std::move(registration), .references = 1});
  if (entries_.size() > soft_bound_) {
    util::log().debug("MR cache holds {} registrations in use (LOOM_MR_CACHE_ENTRIES {})",
                      entries_.size(), soft_bound_);
  }
  return result;
}

void RegistrationTable::release(MemoryRegistration& registration) {
  auto it = entries_.find(key_of(registration));
  if (it == entries_.end() || it->second.registration.get() != &registration ||
      it->second.references == 0) {
    util::log().error("MR cache: release of a registration it does not hold ({} bytes at {})",
                      registration.length(), registration.base());
    return;
  }
  if (--it->second.references != 0) return;
  stats_.registrations -= registration.registrations();
  stats_.bytes -= registration.length();
  --stats_.entries;
  --stats_.in_use;
  entries_.erase(it);
}

}  // namespace loom::ofi
