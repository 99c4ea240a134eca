#include "ofi/subnet.hpp"

#include <cstddef>
#include <cstring>
#include <stdexcept>

#include <arpa/inet.h>
#include <netinet/in.h>

namespace loom::ofi {
namespace {

// The address bytes of an IP endpoint address, or an empty span.
std::span<const std::uint8_t> ip_bytes(std::span<const std::byte> address, int& family) {
  sa_family_t sa_family = 0;
  if (address.size() < sizeof sa_family) return {};
  std::memcpy(&sa_family, address.data(), sizeof sa_family);
  const auto* raw = reinterpret_cast<const std::uint8_t*>(address.data());
  if (sa_family == AF_INET && address.size() >= sizeof(sockaddr_in)) {
    family = AF_INET;
    return {raw + offsetof(sockaddr_in, sin_addr), 4};
  }
  if (sa_family == AF_INET6 && address.size() >= sizeof(sockaddr_in6)) {
    family = AF_INET6;
    return {raw + offsetof(sockaddr_in6, sin6_addr), 16};
  }
  return {};
}

}  // namespace

std::optional<Subnet> Subnet::parse(const std::string& text) {
  const auto slash = text.find('/');
  if (slash == std::string::npos) return std::nullopt;
  const std::string host = text.substr(0, slash);
  unsigned length = 0;
  try {
    std::size_t used = 0;
    length = static_cast<unsigned>(std::stoul(text.substr(slash + 1), &used));
    if (used != text.size() - slash - 1) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  Subnet subnet;
  if (inet_pton(AF_INET, host.c_str(), subnet.prefix_.data()) == 1 && length <= 32) {
    subnet.family_ = AF_INET;
  } else if (inet_pton(AF_INET6, host.c_str(), subnet.prefix_.data()) == 1 && length <= 128) {
    subnet.family_ = AF_INET6;
  } else {
    return std::nullopt;
  }
  subnet.length_ = length;
  subnet.text_ = text;
  return subnet;
}

bool Subnet::contains(std::span<const std::byte> address) const noexcept {
  int family = 0;
  const auto bytes = ip_bytes(address, family);
  if (bytes.empty() || family != family_) return false;
  const unsigned whole = length_ / 8;
  if (std::memcmp(bytes.data(), prefix_.data(), whole) != 0) return false;
  const unsigned rest = length_ % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xFF00u >> rest);
  return (bytes[whole] & mask) == (prefix_[whole] & mask);
}

bool Subnet::loopback() const noexcept {
  if (family_ == AF_INET) return prefix_[0] == 127;
  static constexpr std::array<std::uint8_t, 16> kLoopback6{0, 0, 0, 0, 0, 0, 0, 0,
                                                           0, 0, 0, 0, 0, 0, 0, 1};
  return family_ == AF_INET6 && prefix_ == kLoopback6;
}

std::string address_text(std::span<const std::byte> address) {
  int family = 0;
  const auto bytes = ip_bytes(address, family);
  if (bytes.empty()) return "<" + std::to_string(address.size()) + " bytes>";
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(family, bytes.data(), text, sizeof text);
  std::uint16_t port = 0;
  std::memcpy(&port, address.data() + offsetof(sockaddr_in, sin_port), sizeof port);
  const std::string host = family == AF_INET6 ? "[" + std::string(text) + "]" : text;
  return host + ":" + std::to_string(ntohs(port));
}

}  // namespace loom::ofi
