// The IP subnet a NIC sits on, and whether a peer's endpoint address lies in it. Direct-connect
// meshes give every host pair its own subnet with no routes between them, so a connection must
// leave through the NIC on the peer's subnet. Providers addressed by IP (tcp, verbs over
// RoCE/IPoIB) name the subnet in their fabric name ("10.77.1.0/24"); providers with their own
// address formats (efa, cxi, shm) have no subnets, and any of their NICs reaches any peer.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace loom::ofi {

class Subnet {
 public:
  // From "a.b.c.d/len" or "v6addr/len"; nullopt for anything else.
  static std::optional<Subnet> parse(const std::string& text);

  // True when `address` (a raw endpoint address: sockaddr_in or sockaddr_in6) is inside.
  // False for addresses of the other family or of no IP family at all.
  [[nodiscard]] bool contains(std::span<const std::byte> address) const noexcept;
  [[nodiscard]] const std::string& text() const noexcept { return text_; }
  // 127.0.0.0/8 or ::1: meaningful on this host only.
  [[nodiscard]] bool loopback() const noexcept;

 private:
  int family_ = 0;
  std::array<std::uint8_t, 16> prefix_{};
  unsigned length_ = 0;  // prefix bits
  std::string text_;
};

// "10.77.1.2:41234" for IP endpoint addresses, else "<N bytes>" (for logs and errors).
std::string address_text(std::span<const std::byte> address);

}  // namespace loom::ofi
