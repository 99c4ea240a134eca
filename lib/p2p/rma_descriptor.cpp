#include "p2p/rma_descriptor.hpp"

#include "util/wire.hpp"

namespace loom::p2p {

std::size_t encode_descriptor(const RegionDescriptor& d, std::span<std::byte> out) {
  if (d.rails == 0 || d.rails > kMaxDataRails) return 0;
  util::WireWriter w(out);
  w.u32(kDescriptorMagic);
  w.u8(kDescriptorVersion);
  w.u8(d.rails);
  w.u16(static_cast<std::uint16_t>(descriptor_bytes(d.rails)));
  w.u64(d.context);
  w.u64(d.lane);
  w.u32(d.slot);
  w.u32(d.generation);
  w.u64(d.address);
  w.u64(d.size);
  for (std::size_t i = 0; i < d.rails; ++i) w.u64(d.keys[i]);
  return w.ok() ? w.size() : 0;
}

const char* decode_descriptor(std::span<const std::byte> in, RegionDescriptor& out) {
  util::WireReader r(in);
  const std::uint32_t magic = r.u32();
  const std::uint8_t version = r.u8();
  out.rails = r.u8();
  const std::uint16_t length = r.u16();
  if (!r.ok()) return "too short to be a region descriptor";
  if (magic != kDescriptorMagic) return "not a region descriptor (bad magic)";
  if (version != kDescriptorVersion) return "a region descriptor of another version";
  if (out.rails == 0 || out.rails > kMaxDataRails)
    return "a region descriptor with a bad rail count";
  if (length != descriptor_bytes(out.rails)) return "a region descriptor with a bad length field";
  if (in.size() < length) return "a truncated region descriptor";
  if (in.size() > length) return "a region descriptor with trailing bytes";
  out.context = r.u64();
  out.lane = r.u64();
  out.slot = r.u32();
  out.generation = r.u32();
  out.address = r.u64();
  out.size = r.u64();
  for (std::size_t i = 0; i < out.rails; ++i) out.keys[i] = r.u64();
  if (!r.done()) return "a truncated region descriptor";
  if (out.size == 0) return "a region descriptor of an empty region";
  if (out.address + out.size < out.address) return "a region descriptor whose range wraps";
  return nullptr;
}

}  // namespace loom::p2p
