// The out-of-band channel the two fi_p2p_bw processes use to swap loom handles and results:
// a TCP socket (server and client on two hosts) or a socketpair (--loopback); fi_p2p_hub's
// socketpair to each peer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom::bench {

class Oob {
 public:
  explicit Oob(int fd, std::chrono::seconds timeout) : fd_(fd), timeout_(timeout) {}
  Oob(Oob&& other) noexcept : fd_(other.fd_), timeout_(other.timeout_) { other.fd_ = -1; }
  Oob& operator=(Oob&&) = delete;
  ~Oob();

  // Server: waits for one client on address:port. Throws std::runtime_error.
  static Oob accept(const std::string& address, std::uint16_t port, std::chrono::seconds timeout);
  // Client: connects, retrying until the timeout (the server may start a little later).
  static Oob connect(const std::string& server, std::uint16_t port, std::chrono::seconds timeout);

  void send(std::span<const std::byte> bytes);
  std::vector<std::byte> receive();  // throws after the timeout or when the peer is gone
  // A message (or the peer's close) is waiting: receive() would not wait for it. Never blocks.
  [[nodiscard]] bool readable() const;
  template <typename T>
  void send_value(const T& value) {
    send({reinterpret_cast<const std::byte*>(&value), sizeof value});
  }
  template <typename T>
  T receive_value();
  void sync();  // both sides return once both called it

 private:
  int fd_;
  std::chrono::seconds timeout_;
};

template <typename T>
T Oob::receive_value() {
  auto bytes = receive();
  T value{};
  if (bytes.size() != sizeof value) throw std::runtime_error("bootstrap: unexpected message size");
  std::memcpy(&value, bytes.data(), sizeof value);
  return value;
}

}  // namespace loom::bench
