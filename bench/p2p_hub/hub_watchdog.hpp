// fi_p2p_hub's deadline for the whole run (--timeout) and the peer processes it ends then.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

namespace loom::bench {

// A thread that waits for the deadline. At expiry it says what was pending (the last
// pending() and progress()), kills the peers that are still running, waits for them and ends
// the process with status 1. Otherwise the destructor stops it.
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  Watchdog(std::chrono::seconds limit, Clock::time_point start, std::vector<pid_t> children);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void pending(std::string what);
  void progress(std::size_t done, std::size_t total) {
    done_.store(done, std::memory_order_relaxed);
    total_.store(total, std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t children() const { return children_.size(); }
  // Once true, the watchdog is killing the peers: what the run sees then is their end.
  [[nodiscard]] bool expired() const { return expired_.load(); }
  // The wait status of child `i` once it ended (under the lock, so that the watchdog never
  // kills a pid that was reaped and given to another process).
  std::optional<int> try_reap(std::size_t i);

 private:
  void watch();

  const std::chrono::seconds limit_;
  const Clock::time_point deadline_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopped_ = false;
  std::string what_ = "starting";
  std::atomic<std::size_t> done_{0};
  std::atomic<std::size_t> total_{0};
  std::atomic<bool> expired_{false};
  std::vector<pid_t> children_;  // 0 once reaped
  std::thread thread_;           // last: it starts once the rest is there
};

}  // namespace loom::bench
