// Fixed-width little-endian encoding for everything loom puts on the wire. The reader never
// reads past its span: a short or malformed message turns `ok()` false and every later get
// returns zero, so decoders check ok() once at the end instead of after every field.
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace loom::util {

static_assert(std::endian::native == std::endian::little,
              "loom's wire format is little-endian; add byte swaps for this target");

// One field at a place the caller already knows lies inside its span: for records on a
// per-message path, whose whole length is checked once (WireWriter and WireReader check every
// field). Returns the place after the field.
template <std::unsigned_integral T>
inline std::byte* put_field(std::byte* at, T v) noexcept {
  std::memcpy(at, &v, sizeof v);
  return at + sizeof v;
}

template <std::unsigned_integral T>
inline T get_field(const std::byte* at) noexcept {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

class WireWriter {
 public:
  explicit WireWriter(std::span<std::byte> out) noexcept : out_(out) {}

  void u8(std::uint8_t v) noexcept { put(&v, sizeof v); }
  void u16(std::uint16_t v) noexcept { put(&v, sizeof v); }
  void u32(std::uint32_t v) noexcept { put(&v, sizeof v); }
  void u64(std::uint64_t v) noexcept { put(&v, sizeof v); }
  void bytes(std::span<const std::byte> v) noexcept { put(v.data(), v.size()); }

  // False once anything did not fit; nothing is written past the span.
  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::size_t size() const noexcept { return used_; }
  [[nodiscard]] std::span<std::byte> written() const noexcept { return out_.first(used_); }

 private:
  void put(const void* p, std::size_t n) noexcept {
    if (!ok_ || n > out_.size() - used_) {
      ok_ = false;
      return;
    }
    if (n != 0) std::memcpy(out_.data() + used_, p, n);
    used_ += n;
  }

  std::span<std::byte> out_;
  std::size_t used_ = 0;
  bool ok_ = true;
};

class WireReader {
 public:
  explicit WireReader(std::span<const std::byte> in) noexcept : in_(in) {}

  std::uint8_t u8() noexcept { return get<std::uint8_t>(); }
  std::uint16_t u16() noexcept { return get<std::uint16_t>(); }
  std::uint32_t u32() noexcept { return get<std::uint32_t>(); }
  std::uint64_t u64() noexcept { return get<std::uint64_t>(); }
  // The next n bytes (empty and !ok() if fewer remain).
  std::span<const std::byte> bytes(std::size_t n) noexcept {
    if (!ok_ || n > in_.size() - used_) {
      ok_ = false;
      return {};
    }
    auto view = in_.subspan(used_, n);
    used_ += n;
    return view;
  }

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return ok_ ? in_.size() - used_ : 0; }
  // True when everything was read and nothing was left over.
  [[nodiscard]] bool done() const noexcept { return ok_ && used_ == in_.size(); }

 private:
  template <typename T>
  T get() noexcept {
    T v{};
    if (!ok_ || sizeof v > in_.size() - used_) {
      ok_ = false;
      return T{};
    }
    std::memcpy(&v, in_.data() + used_, sizeof v);
    used_ += sizeof v;
    return v;
  }

  std::span<const std::byte> in_;
  std::size_t used_ = 0;
  bool ok_ = true;
};

}  // namespace loom::util
