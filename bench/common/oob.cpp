#include "common/oob.hpp"

#include <cerrno>
#include <cstring>
#include <thread>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

addrinfo* resolve(const std::string& host, std::uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    throw std::runtime_error("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  return result;
}

bool wait_fd(int fd, short events, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    pollfd pfd{fd, events, 0};
    int ready = ::poll(&pfd, 1, 100);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
  return false;
}

}  // namespace

Oob::~Oob() {
  if (fd_ >= 0) ::close(fd_);
}

Oob Oob::accept(const std::string& address, std::uint16_t port, std::chrono::seconds timeout) {
  addrinfo* info = resolve(address, port, true);
  int listener = ::socket(info->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) {
    freeaddrinfo(info);
    fail("bootstrap socket");
  }
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listener, info->ai_addr, info->ai_addrlen) != 0 || ::listen(listener, 1) != 0) {
    freeaddrinfo(info);
    ::close(listener);
    fail("bootstrap: cannot listen on port " + std::to_string(port));
  }
  freeaddrinfo(info);
  if (!wait_fd(listener, POLLIN, Clock::now() + timeout)) {
    ::close(listener);
    throw std::runtime_error("bootstrap: no client within " + std::to_string(timeout.count()) +
                             " s on port " + std::to_string(port));
  }
  int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ::close(listener);
  if (fd < 0) fail("bootstrap accept");
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return Oob(fd, timeout);
}

Oob Oob::connect(const std::string& server, std::uint16_t port, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "timed out";
  while (Clock::now() < deadline) {
    addrinfo* info = resolve(server, port, false);
    for (addrinfo* a = info; a != nullptr; a = a->ai_next) {
      int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        freeaddrinfo(info);
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return Oob(fd, timeout);
      }
      last_error = std::strerror(errno);
      ::close(fd);
    }
    freeaddrinfo(info);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw std::runtime_error("cannot reach server " + server + ":" + std::to_string(port) +
                           " within " + std::to_string(timeout.count()) + " s (" + last_error +
                           ")");
}

void Oob::send(std::span<const std::byte> bytes) {
  std::uint64_t length = bytes.size();
  auto write_all = [&](const void* data, std::size_t n) {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t written = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) fail("bootstrap: peer gone");
      p += written;
      n -= static_cast<std::size_t>(written);
    }
  };
  write_all(&length, sizeof length);
  write_all(bytes.data(), bytes.size());
}

std::vector<std::byte> Oob::receive() {
  const auto deadline = Clock::now() + timeout_;
  auto read_all = [&](void* data, std::size_t n) {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      if (!wait_fd(fd_, POLLIN, deadline)) {
        throw std::runtime_error("bootstrap: peer silent for " + std::to_string(timeout_.count()) +
                                 " s");
      }
      ssize_t got = ::recv(fd_, p, n, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) throw std::runtime_error("bootstrap: the peer closed the connection");
      p += got;
      n -= static_cast<std::size_t>(got);
    }
  };
  std::uint64_t length = 0;
  read_all(&length, sizeof length);
  if (length > (1u << 24)) throw std::runtime_error("bootstrap: implausible message length");
  std::vector<std::byte> bytes(length);
  read_all(bytes.data(), bytes.size());
  return bytes;
}

bool Oob::readable() const {
  pollfd pfd{fd_, POLLIN, 0};
  return ::poll(&pfd, 1, 0) > 0;
}

void Oob::sync() {
  send_value<std::uint32_t>(0x5359434E);
  if (receive_value<std::uint32_t>() != 0x5359434E)
    throw std::runtime_error("bootstrap: out of step");
}

}  // namespace loom::bench
