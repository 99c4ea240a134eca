// Multi-process tests: the parent runs one role, a forked child the other; they exchange
// addresses and keys over a socketpair. Every wait is bounded; a child that hangs is killed and
// a child that fails makes the parent's test fail.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace loom::test {

using namespace std::chrono_literals;

// Thrown by require() in either process.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool condition, const std::string& message) {
  if (!condition) throw Failure(message);
}

class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  void send_bytes(std::span<const std::byte> bytes);
  std::vector<std::byte> recv_bytes();  // throws Failure after the channel deadline
  void send_text(std::string_view text) { send_bytes(std::as_bytes(std::span(text))); }
  std::string recv_text();

  template <typename T>
  void send_value(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    send_bytes({reinterpret_cast<const std::byte*>(&value), sizeof value});
  }
  template <typename T>
  T recv_value() {
    auto bytes = recv_bytes();
    require(bytes.size() == sizeof(T), "channel: unexpected value size");
    T value;
    std::memcpy(&value, bytes.data(), sizeof value);
    return value;
  }
  // True when a message is waiting, or the peer closed its end (never blocks).
  [[nodiscard]] bool readable() const;
  // True once the peer closed its end (it exited or was killed) and every message it sent
  // before was read (never blocks).
  [[nodiscard]] bool peer_closed() const;
  // Both sides call it; returns when both have reached it.
  void barrier();
  // How long a receive waits for the peer before it throws (60 s unless set).
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  int fd_;
  std::chrono::milliseconds timeout_ = 60s;
};

// Runs `parent_role` here and `child_role` in a forked child; returns "" on success or what
// went wrong on either side. The child is killed after `timeout`. Where `parent_role` throws
// what is no std::exception (Catch2's REQUIRE), the child is killed and reaped before it goes on.
std::string run_pair(const std::function<void(Channel&)>& parent_role,
                     const std::function<void(Channel&)>& child_role,
                     std::chrono::seconds timeout = 120s);

// What run_star saw: "" for the hub and each peer that did its part, else what went wrong
// ("hub failed: ...", "child killed by signal 9", "child exited with 1").
struct StarOutcome {
  std::string hub;
  std::vector<std::string> peers;
};

// Runs `hub_role` here with a channel to each of `peers` forked children, which run
// `peer_role(channel, index)`. Children still running `timeout` after the hub's role returned
// are killed.
StarOutcome run_star(const std::function<void(std::span<Channel>)>& hub_role,
                     const std::function<void(Channel&, std::size_t)>& peer_role, std::size_t peers,
                     std::chrono::seconds timeout = 120s);

// Polls `step` until `done` returns true or `timeout` passes (then throws Failure(`what`)).
void poll_until(const std::function<bool()>& done, const std::function<void()>& step,
                const std::string& what, std::chrono::milliseconds timeout = 30000ms);

// Stopping or killing a peer process. shm (libfabric 1.17) copies between processes under a
// spin lock in one of their shared regions, held across process_vm_writev and
// process_vm_readv: a process stopped or killed inside a libfabric call may hold a peer's lock,
// and the peer then spins inside the provider while it is stopped, or for good (a stop lands
// at the end of a system call, inside the copy). No bound of loom's can reach there, so tests
// stop and kill a process only between its calls: the test tells it to (order_signal), and it
// raises the signal itself where it looks for the order (obey_signal), its operations still in
// flight.
void order_signal(Channel& victim, int signal);
// Raises the signal ordered on `channel`, if an order is waiting (returns after SIGCONT for
// SIGSTOP); true if one was. A message that is not an order fails the test.
bool obey_signal(Channel& channel);
// Waits until process `pid` is stopped (SIGSTOP took effect); throws Failure after `timeout`.
void wait_until_stopped(int pid, std::chrono::milliseconds timeout = 10000ms);

}  // namespace loom::test
