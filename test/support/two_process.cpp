#include "two_process.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <thread>
#include <utility>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "providers/profile.hpp"

namespace loom::test {
namespace {

void write_all(int fd, const void* data, std::size_t length) {
  auto* p = static_cast<const char*>(data);
  while (length > 0) {
    ssize_t n = ::write(fd, p, length);
    if (n < 0 && errno == EINTR) continue;
    require(n > 0, std::string("channel write failed: ") + std::strerror(errno));
    p += n;
    length -= static_cast<std::size_t>(n);
  }
}

std::string duration_text(std::chrono::milliseconds duration) {
  return duration.count() % 1000 == 0 ? std::to_string(duration.count() / 1000) + " s"
                                      : std::to_string(duration.count()) + " ms";
}

void read_all(int fd, void* data, std::size_t length, std::chrono::milliseconds timeout) {
  auto* p = static_cast<char*>(data);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (length > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, 100);
    require(std::chrono::steady_clock::now() < deadline,
            "channel: peer silent for " + duration_text(timeout));
    if (ready <= 0) continue;
    ssize_t n = ::read(fd, p, length);
    if (n < 0 && errno == EINTR) continue;
    require(n > 0, "channel: peer closed the channel (it failed or exited)");
    p += n;
    length -= static_cast<std::size_t>(n);
  }
}

}  // namespace

void Channel::send_bytes(std::span<const std::byte> bytes) {
  std::uint64_t length = bytes.size();
  write_all(fd_, &length, sizeof length);
  write_all(fd_, bytes.data(), bytes.size());
}

std::vector<std::byte> Channel::recv_bytes() {
  std::uint64_t length = 0;
  read_all(fd_, &length, sizeof length, timeout_);
  require(length < (1u << 30), "channel: implausible length");
  std::vector<std::byte> bytes(length);
  read_all(fd_, bytes.data(), bytes.size(), timeout_);
  return bytes;
}

std::string Channel::recv_text() {
  const auto bytes = recv_bytes();
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

bool Channel::readable() const {
  pollfd pfd{fd_, POLLIN, 0};
  return ::poll(&pfd, 1, 0) > 0;
}

bool Channel::peer_closed() const {
  char byte = 0;
  return ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

void Channel::barrier() {
  send_value<std::uint32_t>(0xB4B4B4B4);
  require(recv_value<std::uint32_t>() == 0xB4B4B4B4, "channel: barrier out of step");
}

namespace {

// Forks a child that runs `role` on its end of a new socketpair and exits (1 if it threw);
// returns its pid and the parent's end, or pid -1.
std::pair<pid_t, int> fork_role(const std::function<void(Channel&)>& role) {
  // A process whose peer died writes to a channel nobody reads: that must fail its role with
  // a message (EPIPE), not kill it silently with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return {-1, -1};
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {-1, -1};
  }
  if (child == 0) {
    ::close(fds[0]);
    Channel channel(fds[1]);
    int code = 0;
    try {
      role(channel);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child failed: %s\n", e.what());
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);  // no atexit handlers or Catch2 reporting in the child
  }
  ::close(fds[1]);
  return {child, fds[0]};
}

// Waits for `child` until `deadline` (then kills it); "" when it exited 0, else what happened.
std::string reap(pid_t child, std::chrono::steady_clock::time_point deadline) {
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      providers::remove_leftovers_of(child);
      return "child timed out and was killed";
    }
    std::this_thread::sleep_for(5ms);
  }
  if (WIFSIGNALED(status)) providers::remove_leftovers_of(child);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return WIFSIGNALED(status) ? "child killed by signal " + std::to_string(WTERMSIG(status))
                             : "child exited with " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

std::string run_pair(const std::function<void(Channel&)>& parent_role,
                     const std::function<void(Channel&)>& child_role,
                     std::chrono::seconds timeout) {
  const auto [child, fd] = fork_role(child_role);
  if (child < 0) return "socketpair or fork failed";
  Channel channel(fd);
  std::string failure;
  try {
    parent_role(channel);
  } catch (const std::exception& e) {
    failure = std::string("parent failed: ") + e.what();
  } catch (...) {
    ::close(fd);
    reap(child, std::chrono::steady_clock::now());  // past its deadline: killed if still there
    throw;
  }
  ::close(fd);  // a child blocked on the channel now sees it closed
  const std::string child_outcome = reap(child, std::chrono::steady_clock::now() + timeout);
  if (child_outcome.empty()) return failure;
  return failure + (failure.empty() ? "" : "; ") + child_outcome;
}

StarOutcome run_star(const std::function<void(std::span<Channel>)>& hub_role,
                     const std::function<void(Channel&, std::size_t)>& peer_role, std::size_t peers,
                     std::chrono::seconds timeout) {
  StarOutcome outcome;
  std::vector<pid_t> children;
  std::vector<Channel> channels;
  std::vector<int> fds;
  for (std::size_t i = 0; i < peers; ++i) {
    const auto [child, fd] = fork_role([&, i](Channel& channel) { peer_role(channel, i); });
    if (child < 0) {
      outcome.hub = "socketpair or fork failed for peer " + std::to_string(i);
      break;
    }
    children.push_back(child);
    fds.push_back(fd);
    channels.emplace_back(fd);
  }
  if (outcome.hub.empty()) {
    try {
      hub_role(channels);
    } catch (const std::exception& e) {
      outcome.hub = std::string("hub failed: ") + e.what();
    }
  }
  for (int fd : fds) ::close(fd);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (pid_t child : children) outcome.peers.push_back(reap(child, deadline));
  return outcome;
}

void poll_until(const std::function<bool()>& done, const std::function<void()>& step,
                const std::string& what, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    require(std::chrono::steady_clock::now() < deadline, "timed out waiting for " + what);
    step();
  }
}

namespace {

// An order's bytes: told apart from the test's own messages by its size and magic.
struct SignalOrder {
  std::uint64_t magic = 0;
  std::int32_t signal = 0;
  std::int32_t reserved = 0;
};
constexpr std::uint64_t kSignalOrderMagic = 0x4c4f4f4d5349474eULL;  // "LOOMSIGN"

// The state letter of /proc/<pid>/stat ('T' stopped), or 0 when it cannot be read.
char process_state(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  // The command name may hold spaces and parentheses: the state follows the last ')'.
  const std::size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? 0 : line[close + 2];
}

}  // namespace

void order_signal(Channel& victim, int signal) {
  victim.send_value(SignalOrder{.magic = kSignalOrderMagic, .signal = signal});
}

bool obey_signal(Channel& channel) {
  if (!channel.readable()) return false;
  const auto order = channel.recv_value<SignalOrder>();
  require(order.magic == kSignalOrderMagic, "expected a signal order on the channel");
  ::raise(order.signal);
  return true;
}

void wait_until_stopped(int pid, std::chrono::milliseconds timeout) {
  poll_until([&] { return process_state(pid) == 'T'; },
             [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); },
             "process " + std::to_string(pid) + " to stop", timeout);
}

}  // namespace loom::test
