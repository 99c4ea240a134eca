// A rail set: R data rails and C control rails (C >= 1) over one or more NICs, plus the MR
// cache for buffers used on them. Declared after the rails, the cache is destroyed first, so an
// endpoint can never be closed while registrations bound to it are open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ofi/rail.hpp"
#include "ofi/registration_table.hpp"

namespace loom::ofi {

class Nic;

struct RailSetShape {
  std::size_t data_rails = 1;
  std::size_t control_rails = 1;
  RailDepths depths;  // wanted; each rail's are clamped to its NIC's limits
  std::size_t mr_cache_entries = 1024;
};

// The NIC of every rail. Rail i of one side talks to rail i of the other, so on a direct-connect
// mesh each must sit on the subnet of its counterpart.
struct RailPlacement {
  std::vector<Nic*> data;
  std::vector<Nic*> control;
  // Data rail i on nics[i % n], control rail j on nics[j % n]: more rails than NICs means
  // several endpoints per NIC.
  static RailPlacement round_robin(std::span<Nic* const> nics, std::size_t data_rails,
                                   std::size_t control_rails);
};

class RailSet {
 public:
  // Rails placed round robin over `nics` (shape gives the counts). Throws loom::Error.
  RailSet(std::span<Nic* const> nics, const RailSetShape& shape);
  // Rails where `placement` puts them (shape's counts unused). Throws loom::Error.
  RailSet(const RailPlacement& placement, const RailSetShape& shape);
  ~RailSet();
  RailSet(const RailSet&) = delete;
  RailSet& operator=(const RailSet&) = delete;

  [[nodiscard]] std::size_t data_rails() const noexcept { return data_rails_; }
  [[nodiscard]] std::size_t control_rails() const noexcept { return rails_.size() - data_rails_; }
  [[nodiscard]] Rail& data(std::size_t i) noexcept { return *rails_[i]; }
  [[nodiscard]] Rail& control(std::size_t i) noexcept { return *rails_[data_rails_ + i]; }
  // All rails, data first; Rail::index() is the position here.
  [[nodiscard]] std::span<Rail* const> rails() const noexcept { return rail_pointers_; }
  [[nodiscard]] RegistrationTable& registration_table() noexcept { return *registration_table_; }
  // The longest single transfer every data rail's provider takes (ep_attr->max_msg_size).
  [[nodiscard]] std::size_t max_msg_size() const noexcept { return max_msg_size_; }

  // What a caller of progress() waits for. kData: only the data rails can finish it (a test()
  // of an eager message's arrival, of a send's or a write's completion).
  enum class Awaiting : std::uint8_t { kAnything, kData };
  // Posts again the data rails' refused FI_RX_CQ_DATA receives, then reads the data CQs (one per
  // NIC) once, and the control CQs unless they were empty on a recent read; returns completions
  // handled. On rxm every endpoint has a CQ of its own below ours, and reading an idle one is a
  // poll() and a clock read; on shm a lock pair. A receiver of bulk data need not pay them on
  // every call (docs/performance.md), nor a test() waiting for an eager message: it delays the
  // message by half a turn of the waiting loop, which reading both CQs made twice as long.
  // A call that found data returns it to its caller first (a reply waits on it) and leaves
  // the control CQs to the next call, which reads them; kBusyControlSkips calls since the last
  // read, and the next reads them itself. A call that found nothing reads them, unless it awaits
  // kData, which skips while no call since the last read found data, kQuietControlSkips calls at
  // most. A read that finds something makes the next call read again. A control message
  // therefore waits at most kBusyControlSkips calls, whatever the mix.
  std::size_t progress(Awaiting awaiting = Awaiting::kAnything);
  static constexpr unsigned kBusyControlSkips = 8;
  static constexpr unsigned kQuietControlSkips = 3;
  static_assert(kQuietControlSkips <= kBusyControlSkips, "the bound is kBusyControlSkips");
  // How many progress() calls read the control CQs.
  [[nodiscard]] std::uint64_t control_reads() const noexcept { return control_reads_; }
  // The next progress() reads the control CQs whatever came on the data rails.
  void read_control_next() noexcept { control_owed_ = true; }
  // Remote writes arriving on any of the set's rails go to `handler`.
  void set_remote_write_handler(RemoteWriteHandler* handler) noexcept;

 private:
  std::size_t data_rails_;
  std::size_t max_msg_size_ = SIZE_MAX;
  std::size_t data_cqs_ = 0;  // cqs_[0, data_cqs_) serve data rails, the rest control rails
  // progress()'s control reads: whether the next call must read (the last read found
  // something, or the caller asked), the calls that skipped it since the last read, and
  // whether one of them found data.
  [[nodiscard]] bool control_due(bool found_data, Awaiting awaiting) noexcept;
  bool control_owed_ = true;
  unsigned skipped_calls_ = 0;
  bool data_since_read_ = false;
  std::uint64_t control_reads_ = 0;
  // Declaration order is teardown order, reversed: MR cache, rails (endpoints), CQs; without
  // FI_MR_ENDPOINT the destructor closes the rails before the MR cache.
  std::vector<std::unique_ptr<CompletionQueue>> cqs_;
  std::vector<std::unique_ptr<Rail>> rails_;
  std::vector<Rail*> rail_pointers_;
  std::unique_ptr<RegistrationTable> registration_table_;  // last: destroyed first
};

// Depths clamped to what `nic` allows; logs at info level when a value was lowered.
[[nodiscard]] RailDepths clamp_depths(const Nic& nic, RailDepths wanted);

}  // namespace loom::ofi
