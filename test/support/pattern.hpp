// Byte patterns that differ per message (seed) and per position, never all zeros, so a message
// delivered to the wrong buffer, shifted, or truncated cannot pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace loom::test {

inline std::byte pattern_byte(std::uint64_t seed, std::size_t i) {
  std::uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<std::byte>((x & 0xff) | 1);  // odd: never zero
}

inline void fill_pattern(std::span<std::byte> bytes, std::uint64_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern_byte(seed, i);
}

// Empty string when the bytes match; otherwise where they first differ.
inline std::string check_pattern(std::span<const std::byte> bytes, std::uint64_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != pattern_byte(seed, i)) {
      return "byte " + std::to_string(i) + " of " + std::to_string(bytes.size()) + " is " +
             std::to_string(static_cast<int>(bytes[i])) + ", expected " +
             std::to_string(static_cast<int>(pattern_byte(seed, i))) + " (seed " +
             std::to_string(seed) + ")";
    }
  }
  return {};
}

}  // namespace loom::test
