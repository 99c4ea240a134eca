// The lock a lane's communicators take for every call. The hot path takes it twice per message
// (post and test); an uncontended std::mutex costs a locked instruction to lock and another to
// unlock, this one only the first (unlock is a release store). Holders do not block except in
// memory registration and teardown, and waiters yield after a short spin, so a holder that was
// preempted or is registering memory does not cost the waiters whole time slices.
#pragma once

#include <atomic>
#include <thread>

namespace loom::util {

class SpinLock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      // Wait on a plain load: spinning on the exchange would pull the line from the holder.
      for (unsigned spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins < kSpinsBeforeYield) {
          relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  [[nodiscard]] bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static constexpr unsigned kSpinsBeforeYield = 128;

  static void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  std::atomic<bool> locked_{false};
};

}  // namespace loom::util
