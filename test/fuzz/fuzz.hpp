// Shared by the fuzz targets. Each target decodes the input as received bytes and, separately,
// builds a value from the same bytes to encode. A broken property prints what broke and traps,
// so libFuzzer (or replay_main.cpp under gcc) keeps the input that broke it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "p2p/messages.hpp"

namespace loom::fuzz {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz property broken: %s\n", what);
  std::fflush(stderr);
  __builtin_trap();
}

inline void require(bool ok, const char* what) {
  if (!ok) [[unlikely]]
    fail(what);
}

inline std::span<const std::byte> as_bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

// Reads fixed-width values from the fuzz input to build a value to encode; zeros once it runs out.
class ByteSource {
 public:
  explicit ByteSource(std::span<const std::byte> in) : in_(in) {}

  template <typename T>
  T take() {
    T v{};
    const std::size_t n = std::min(sizeof v, in_.size() - used_);
    if (n != 0) std::memcpy(&v, in_.data() + used_, n);
    used_ += n;
    return v;
  }
  std::uint8_t u8() { return take<std::uint8_t>(); }
  // Exactly n bytes: the input's next bytes, then zeros.
  std::vector<std::byte> bytes(std::size_t n) {
    std::vector<std::byte> out(n);
    const std::size_t have = std::min(n, in_.size() - used_);
    if (have != 0) std::memcpy(out.data(), in_.data() + used_, have);
    used_ += have;
    return out;
  }

 private:
  std::span<const std::byte> in_;
  std::size_t used_ = 0;
};

// An address of 0 to kMaxAddressBytes + 1 bytes; `valid` turns false when it is out of range.
inline p2p::EndpointName make_address(ByteSource& s, bool& valid) {
  const std::size_t length = s.u8() % (p2p::kMaxAddressBytes + 2);
  valid = valid && length != 0 && length <= p2p::kMaxAddressBytes;
  return s.bytes(length);
}

// 0 to max + 1 addresses, each through make_address.
inline std::vector<p2p::EndpointName> make_addresses(ByteSource& s, std::size_t max, bool& valid) {
  const std::size_t count = s.u8() % (max + 2);
  valid = valid && count != 0 && count <= max;
  std::vector<p2p::EndpointName> out(count);
  for (auto& a : out) a = make_address(s, valid);
  return out;
}

// A buffer size around `expected`: exact or up to 7 bytes more, or 1 to 128 bytes less.
inline std::size_t make_room(ByteSource& s, std::size_t expected) {
  const std::uint8_t b = s.u8();
  if (b < 0x80) return expected + b % 8;
  return expected - std::min<std::size_t>(expected, 1 + (b & 0x7f));
}

inline bool addresses_fit(const std::vector<p2p::EndpointName>& addresses, std::size_t max) {
  if (addresses.empty() || addresses.size() > max) return false;
  return std::all_of(addresses.begin(), addresses.end(), [](const p2p::EndpointName& a) {
    return !a.empty() && a.size() <= p2p::kMaxAddressBytes;
  });
}

inline p2p::LaneAddresses make_lane(ByteSource& s, bool& valid) {
  p2p::LaneAddresses lane;
  lane.lane = s.take<std::uint64_t>();
  lane.comm = s.take<std::uint16_t>();
  lane.data = make_addresses(s, p2p::kMaxDataRails, valid);
  lane.control = make_addresses(s, p2p::kMaxControlRails, valid);
  return lane;
}

inline bool lane_fits(const p2p::LaneAddresses& lane) {
  return addresses_fit(lane.data, p2p::kMaxDataRails) &&
         addresses_fit(lane.control, p2p::kMaxControlRails);
}

inline std::size_t wire_size(const std::vector<p2p::EndpointName>& addresses) {
  std::size_t n = 0;
  for (const auto& a : addresses) n += 1 + a.size();
  return n;
}

inline std::size_t wire_size(const p2p::LaneAddresses& lane) {
  return 8 + 2 + 1 + 1 + wire_size(lane.data) + wire_size(lane.control);
}

inline bool same(const p2p::LaneAddresses& a, const p2p::LaneAddresses& b) {
  return a.lane == b.lane && a.comm == b.comm && a.data == b.data && a.control == b.control;
}

// Decoding `in`: the result must not depend on what the output object held before (`dirty`);
// on success the value must satisfy `fits` and re-encode to exactly `in`.
template <typename T, typename Decode, typename Encode, typename Same, typename Fits>
void check_decode(std::span<const std::byte> in, T dirty, Decode decode, Encode encode, Same same,
                  Fits fits) {
  T value{};
  const char* why = decode(in, value);
  const char* why_dirty = decode(in, dirty);
  require(why == why_dirty, "decoding does not depend on what the output held");
  if (why != nullptr) return;
  require(same(value, dirty), "decoding into a used object gives the same value");
  require(fits(value), "a decoded value is within the documented limits");
  std::vector<std::byte> out(in.size());
  require(encode(value, std::span<std::byte>(out)) == in.size(),
          "a decoded value re-encodes to the length it was decoded from");
  require(std::equal(out.begin(), out.end(), in.begin()), "re-encoding gives the same bytes");
}

// Encoding `value` into exactly `room` bytes (so ASan sees any write past them): a valid value
// that fits gives `expected` bytes that decode back to it; a value that does not fit gives 0;
// an invalid value gives 0 or bytes the decoder refuses.
template <typename T, typename Decode, typename Encode, typename Same>
void check_encode(const T& value, bool valid, std::size_t expected, std::size_t room, Decode decode,
                  Encode encode, Same same) {
  std::vector<std::byte> out(room);
  const std::size_t n = encode(value, std::span<std::byte>(out));
  require(n <= room, "the encoder reports no more bytes than it was given");
  T back{};
  if (!valid) {
    require(n == 0 || decode(std::span<const std::byte>(out).first(n), back) != nullptr,
            "an invalid value is refused by the encoder or by the decoder");
    return;
  }
  if (room < expected) {
    require(n == 0, "the encoder returns 0 when the message does not fit");
    return;
  }
  require(n == expected, "the encoder writes the documented number of bytes");
  require(decode(std::span<const std::byte>(out).first(n), back) == nullptr,
          "the decoder accepts what the encoder wrote");
  require(same(value, back), "decode(encode(x)) == x");
}

}  // namespace loom::fuzz
