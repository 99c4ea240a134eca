// A region's remote descriptor: what a one-sided target exports (RmaTarget::export_region) and
// its initiator imports (RmaInitiator::import_region), both ends here. The application carries
// the bytes by any means, so everything in them is checked before use: magic, version, the
// length it claims against the length given, the rail count, and that the descriptor was made
// by the connection's own peer context for its own lane (another's keys would reach nothing, or
// the wrong memory).
//
//   u32 magic "LMRD" | u8 version | u8 data rails | u16 length (all of it) | u64 context |
//   u64 lane | u32 region slot | u32 region generation | u64 address | u64 size |
//   u64 key per data rail
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "loom/rma.hpp"
#include "p2p/messages.hpp"

namespace loom::p2p {

inline constexpr std::uint32_t kDescriptorMagic = 0x44524D4C;  // "LMRD"
// Its own version, not the wire protocol's: descriptors may be stored and shipped apart from any
// connection. Bump it for any change in the layout or meaning.
inline constexpr std::uint8_t kDescriptorVersion = 1;
inline constexpr std::size_t kDescriptorHeaderBytes = 4 + 1 + 1 + 2 + 8 + 8 + 4 + 4 + 8 + 8;
inline constexpr std::size_t descriptor_bytes(std::size_t rails) {
  return kDescriptorHeaderBytes + 8 * rails;
}
static_assert(descriptor_bytes(kMaxDataRails) <= kMaxRegionDescriptorBytes);

struct RegionDescriptor {
  std::uint64_t context = 0;  // the target's context id
  std::uint64_t lane = 0;     // the target's lane the keys belong to
  std::uint32_t slot = 0;     // the region in the target's context
  std::uint32_t generation = 0;
  std::uint64_t address = 0;  // what the target's provider calls the region's first byte
  std::uint64_t size = 0;
  std::uint8_t rails = 0;
  std::array<std::uint64_t, kMaxDataRails> keys{};  // per data rail of the lane

  // Whether [offset, offset + length) lies within the region.
  [[nodiscard]] bool covers(std::size_t offset, std::size_t length) const noexcept {
    return length <= size && offset <= size - length;
  }
};

// 0 when `out` is too short or the rail count is out of range.
std::size_t encode_descriptor(const RegionDescriptor& descriptor, std::span<std::byte> out);
// Why `in` is no descriptor, or nullptr. Checks the format only; the importer checks whose it is.
const char* decode_descriptor(std::span<const std::byte> in, RegionDescriptor& out);

}  // namespace loom::p2p
