#include "p2p_hub/hub_watchdog.hpp"

#include <cstdio>
#include <cstdlib>

#include <signal.h>
#include <sys/wait.h>

namespace loom::bench {

Watchdog::Watchdog(std::chrono::seconds limit, Clock::time_point start, std::vector<pid_t> children)
    : limit_(limit),
      deadline_(start + limit),
      children_(std::move(children)),
      thread_([this] { watch(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::pending(std::string what) {
  std::lock_guard lock(mutex_);
  what_ = std::move(what);
  done_.store(0, std::memory_order_relaxed);
  total_.store(0, std::memory_order_relaxed);
}

std::optional<int> Watchdog::try_reap(std::size_t i) {
  std::lock_guard lock(mutex_);
  if (children_[i] == 0) return std::nullopt;
  int status = 0;
  if (::waitpid(children_[i], &status, WNOHANG) != children_[i]) return std::nullopt;
  children_[i] = 0;
  return status;
}

void Watchdog::watch() {
  std::unique_lock lock(mutex_);
  if (wake_.wait_until(lock, deadline_, [this] { return stopped_; })) return;
  expired_.store(true);
  std::string what = what_;
  if (const std::size_t total = total_.load(std::memory_order_relaxed); total > 0) {
    what += " (" + std::to_string(done_.load(std::memory_order_relaxed)) + " of " +
            std::to_string(total) + " done)";
  }
  std::size_t running = 0;
  for (const pid_t pid : children_) running += pid != 0 ? 1 : 0;
  std::fflush(stdout);
  std::fprintf(stderr,
               "fi_p2p_hub: --timeout %lld s expired; pending: %s; killing %zu peer process(es)\n",
               static_cast<long long>(limit_.count()), what.c_str(), running);
  for (const pid_t pid : children_) {
    if (pid != 0) ::kill(pid, SIGKILL);
  }
  for (const pid_t pid : children_) {
    if (pid != 0) ::waitpid(pid, nullptr, 0);
  }
  std::fflush(nullptr);
  std::_Exit(1);
}

}  // namespace loom::bench
