#include "ncclnet_ranks.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NCCLNET_LEAK_CHECK 1
#include <sanitizer/lsan_interface.h>
#endif
#endif

#include "ncclnet_cuda.hpp"

namespace ncclnet {
namespace {

// A rank that ends without closing its endpoints (killed, or failed and left through _exit)
// leaves the shm provider's regions in /dev/shm ("<pid>:..."): 16 MB each, and a later
// process that gets the same pid fails to open its endpoints (fi_enable: EBUSY). loom's own
// loom::remove_process_leftovers does this, but ncclnet_check links nothing of loom: it drives
// any plugin, and cleans up after its ranks whatever the plugin.
void remove_shm_regions(pid_t pid) {
  const std::string prefix = std::to_string(pid) + ":";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    if (std::string_view(entry->d_name).starts_with(prefix)) {
      ::unlink((std::string("/dev/shm/") + entry->d_name).c_str());
    }
  }
  ::closedir(dir);
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

void wait_fd(int fd, short events, Clock::time_point deadline, int peer, const char* what) {
  pollfd p{.fd = fd, .events = events, .revents = 0};
  while (true) {
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return;
    if (n == 0)
      throw CheckError(std::string(what) + " rank " + std::to_string(peer) +
                       ": nothing before the case's deadline (peer stuck or dead)");
    if (errno != EINTR) throw CheckError(std::string("poll: ") + std::strerror(errno));
  }
}

}  // namespace

Rank::Rank(int rank, int size, std::vector<int> links, std::chrono::seconds timeout)
    : rank_(rank), size_(size), links_(std::move(links)), deadline_(Clock::now() + timeout) {}

Rank::~Rank() {
  for (const int fd : links_)
    if (fd >= 0) ::close(fd);
}

void Rank::send(int peer, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    wait_fd(links_[static_cast<std::size_t>(peer)], POLLOUT, deadline_, peer, "sending to");
    const ssize_t n = ::send(links_[static_cast<std::size_t>(peer)], bytes, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw CheckError("rank " + std::to_string(peer) + " is gone (send failed)");
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}

void Rank::recv(int peer, void* data, std::size_t size) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    wait_fd(links_[static_cast<std::size_t>(peer)], POLLIN, deadline_, peer, "waiting for");
    const ssize_t n = ::recv(links_[static_cast<std::size_t>(peer)], bytes, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw CheckError("rank " + std::to_string(peer) + " died or left the case");
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}

void Rank::barrier() {
  const char token = 'b';
  for (int peer = 0; peer < size_; ++peer)
    if (peer != rank_) send(peer, &token, 1);
  for (int peer = 0; peer < size_; ++peer) {
    char got = 0;
    if (peer != rank_) recv(peer, &got, 1);
  }
}

void Rank::check_peers(const std::string& waiting_for) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    pollfd p{.fd = links_[static_cast<std::size_t>(peer)], .events = POLLRDHUP, .revents = 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0)
      throw CheckError("rank " + std::to_string(peer) +
                       " died or left the case while this rank waited for " + waiting_for);
  }
  if (Clock::now() > deadline_)
    throw CheckError(waiting_for + ": not done before the case's deadline");
}

std::string run_ranks(const std::string& name, int ranks, std::chrono::seconds timeout,
                      const std::function<void(Rank&)>& body, bool leak_check, bool* skipped) {
  constexpr int kSkipped = 77;
  bool all_skipped = true;
  // links[a][b]: rank a's end of the socket to rank b.
  std::vector<std::vector<int>> links(static_cast<std::size_t>(ranks),
                                      std::vector<int>(static_cast<std::size_t>(ranks), -1));
  for (int a = 0; a < ranks; ++a) {
    for (int b = a + 1; b < ranks; ++b) {
      int pair[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return name + ": socketpair: " + std::strerror(errno);
      links[a][b] = pair[0];
      links[b][a] = pair[1];
    }
  }
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (int a = 0; a < ranks; ++a)
        for (int b = 0; b < ranks; ++b)
          if (a != r && links[a][b] >= 0) ::close(links[a][b]);
      int status = 0;
      try {
        Rank rank(r, ranks, links[static_cast<std::size_t>(r)], timeout);
        body(rank);
      } catch (const SkipError& e) {
        std::printf("ncclnet_check: SKIPPED (case %s, rank %d): %s\n", name.c_str(), r, e.what());
        status = kSkipped;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ncclnet_check: case %s, rank %d: %s\n", name.c_str(), r, e.what());
        status = 1;
      }
#ifdef NCCLNET_LEAK_CHECK
      // _exit skips LeakSanitizer's exit check; a rank checks its own leaks here.
      if (leak_check && status == 0 && __lsan_do_recoverable_leak_check() != 0) {
        std::fprintf(stderr, "ncclnet_check: case %s, rank %d: LeakSanitizer found leaks\n",
                     name.c_str(), r);
        status = 1;
      }
#else
      (void)leak_check;
#endif
      std::fflush(nullptr);
      ::_exit(status);
    }
    pids.push_back(pid);
  }
  for (auto& row : links)
    for (const int fd : row)
      if (fd >= 0) ::close(fd);

  // Wait for every rank; once one failed the others get a grace period, then SIGKILL.
  const auto hard_deadline = Clock::now() + timeout + std::chrono::seconds(5);
  auto deadline = hard_deadline;
  std::string error;
  std::size_t alive = pids.size();
  while (alive > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const auto it = std::find(pids.begin(), pids.end(), pid);
      if (it == pids.end()) continue;
      const int r = static_cast<int>(it - pids.begin());
      *it = -1;
      --alive;
      std::string why;
      if (WIFSIGNALED(status))
        why = "killed by signal " + std::to_string(WTERMSIG(status));
      else if (WIFEXITED(status) && WEXITSTATUS(status) == kSkipped)
        why = "skipped (exit 77)";
      else if (WEXITSTATUS(status) != 0)
        why = "failed (exit " + std::to_string(WEXITSTATUS(status)) + ")";
      if (!why.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == kSkipped))
        all_skipped = false;
      if (!why.empty()) {
        remove_shm_regions(pid);
        error += (error.empty() ? "case " + name + ": " : "; ") +
                 ("rank " + std::to_string(r) + " " + why + " [pid " + std::to_string(pid) + "]");
        deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
      }
      continue;
    }
    if (Clock::now() >= deadline) {
      for (std::size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] <= 0) continue;
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        remove_shm_regions(pids[r]);
        error += (error.empty() ? "case " + name + ": " : "; ") +
                 ("rank " + std::to_string(r) + " did not finish in time (killed) [pid " +
                  std::to_string(pids[r]) + "]");
        pids[r] = -1;
        --alive;
      }
      all_skipped = false;
      break;
    }
    ::usleep(2000);
  }
  if (skipped != nullptr) *skipped = !error.empty() && all_skipped;
  return error;
}

ProgressThread::ProgressThread() : thread_([this] { loop(); }) {}

ProgressThread::~ProgressThread() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressThread::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || (busy_ && task_); });
    if (stop_) return;
    std::function<void()> task = std::move(task_);
    task_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      // As NCCL's proxy threads have their GPU set.
      if (memory().cuda) cuda::make_current(memory().gpu);
      task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

void ProgressThread::start(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return !busy_; });
  task_ = std::move(task);
  busy_ = true;
  error_ = nullptr;
  cv_.notify_all();
}

void ProgressThread::join() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return !busy_; });
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void ProgressThread::run(const std::function<void()>& task) {
  start(task);
  join();
}

}  // namespace ncclnet
