// What fi_p2p_alltoall's patterns share: the bytes each message or token carries (so that -v
// can tell a misplaced one from a right one), latency percentiles, and the wait loops' pacing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom::bench {

using Clock = std::chrono::steady_clock;

inline double micros_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

// The contents of one message or token: 8 bytes at a time from a hash of its key and the word's
// offset, so that no two messages of a run are alike anywhere.
std::uint64_t pattern_key(std::uint64_t kind, std::uint64_t from, std::uint64_t to,
                          std::uint64_t index);
void fill_pattern(std::byte* data, std::size_t size, std::uint64_t key);
// The first byte that differs, or `size`.
[[nodiscard]] std::size_t pattern_mismatch(const std::byte* data, std::size_t size,
                                           std::uint64_t key);

// p-th percentile (0-100) by nearest rank; 0 for no samples. Sorts `samples`.
[[nodiscard]] double percentile(std::vector<double>& samples, double p);

// Bounds a wait loop and paces it. pass(true) after a pass that completed something, pass(false)
// after one that found nothing: that yields the CPU where the ranks outnumber the cores (a
// spinning rank would take the time slice its peer needs to answer), and after `timeout` with
// nothing done throws std::runtime_error saying what was awaited.
class Pacer {
 public:
  Pacer(bool yield, std::chrono::seconds timeout, const char* what)
      : yield_(yield), timeout_(timeout), what_(what), deadline_(Clock::now() + timeout) {}

  void pass(bool progressed) {
    progressed_ |= progressed;
    if (!progressed && yield_) idle();
    if ((++passes_ & 1023) == 0) check();
  }
  // Adds context to the timeout's message: what is still missing.
  void missing(std::size_t count) { missing_ = count; }

 private:
  static void idle();
  void check();

  bool yield_;
  std::chrono::seconds timeout_;
  const char* what_;
  Clock::time_point deadline_;
  bool progressed_ = false;
  std::uint64_t passes_ = 0;
  std::size_t missing_ = 0;
};

}  // namespace loom::bench
