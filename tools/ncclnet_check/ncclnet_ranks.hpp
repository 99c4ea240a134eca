// ncclnet_check's processes: a case runs in 1 to 4 forked ranks on this host, connected by
// socketpairs that carry plugin handles and small messages. Each rank calls the plugin as
// NCCL's proxy does: setup (listen/connect/accept/regMr/close) on its main thread, the
// service thread, and isend/irecv/test on a progress thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ncclnet_plugin.hpp"

namespace ncclnet {

using Clock = std::chrono::steady_clock;

class Rank {
 public:
  Rank(int rank, int size, std::vector<int> links, std::chrono::seconds timeout);
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  ~Rank();

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] Clock::time_point deadline() const noexcept { return deadline_; }

  // Bytes to/from another rank. Throw CheckError when the peer is gone (EOF) or nothing
  // arrives before the case's deadline.
  void send(int peer, const void* data, std::size_t size);
  void recv(int peer, void* data, std::size_t size);
  void barrier();
  // Throws CheckError once another rank's socket closed (it died or left the case): waiting
  // loops call it so that a dead peer ends the case at once, naming it.
  void check_peers(const std::string& waiting_for);
  // check_peers() now and then, and the deadline: for loops that poll the plugin.
  void keep_waiting(const std::string& waiting_for) {
    if ((spins_.fetch_add(1, std::memory_order_relaxed) & 1023) != 1023) return;
    check_peers(waiting_for);
  }

 private:
  int rank_;
  int size_;
  std::vector<int> links_;  // socket to each rank (-1 for this one)
  Clock::time_point deadline_;
  std::atomic<std::uint64_t> spins_{0};  // progress threads share the rank
};

// Runs `body` in `ranks` forked processes. Returns an empty string when every rank passed,
// else the error naming the case and the rank(s). Bounded: after `timeout` (or a few
// seconds after the first rank failed) the rest are killed.
// `leak_check`: in an ASan build each rank runs LeakSanitizer before it exits (ranks end with
// _exit, which skips the exit-time check).
// A rank whose body throws SkipError prints why and exits 77; `skipped` (when given) says
// whether every rank that did not pass ended so.
std::string run_ranks(const std::string& name, int ranks, std::chrono::seconds timeout,
                      const std::function<void(Rank&)>& body, bool leak_check = false,
                      bool* skipped = nullptr);

// The proxy's progress thread: run() executes a task there and waits for it (rethrowing).
class ProgressThread {
 public:
  ProgressThread();
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  void run(const std::function<void()>& task);
  // Starts a task and returns at once; join() waits for it and rethrows.
  void start(std::function<void()> task);
  void join();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  std::exception_ptr error_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ncclnet
