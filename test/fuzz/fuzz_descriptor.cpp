// A one-sided region's descriptor: bytes a target exports (RmaTarget::export_region) and an
// application ships to the initiator by any means, which import_region decodes.
#include "fuzz.hpp"
#include "p2p/rma_descriptor.hpp"

namespace {

using namespace loom::p2p;
using loom::fuzz::ByteSource;

// Only the keys of the descriptor's rails mean anything.
bool same(const RegionDescriptor& a, const RegionDescriptor& b) {
  if (a.context != b.context || a.lane != b.lane || a.slot != b.slot ||
      a.generation != b.generation || a.address != b.address || a.size != b.size ||
      a.rails != b.rails) {
    return false;
  }
  for (std::size_t i = 0; i < a.rails && i < kMaxDataRails; ++i)
    if (a.keys[i] != b.keys[i]) return false;
  return true;
}

bool fits(const RegionDescriptor& d) {
  return d.rails != 0 && d.rails <= kMaxDataRails && d.size != 0 && d.address + d.size > d.address;
}

RegionDescriptor make_descriptor(ByteSource& s, bool& valid) {
  RegionDescriptor d;
  d.context = s.take<std::uint64_t>();
  d.lane = s.take<std::uint64_t>();
  d.slot = s.take<std::uint32_t>();
  d.generation = s.take<std::uint32_t>();
  d.address = s.take<std::uint64_t>();
  d.size = s.take<std::uint64_t>();
  d.rails = static_cast<std::uint8_t>(s.u8() % (kMaxDataRails + 2));  // 0 to one too many
  for (std::size_t i = 0; i < d.rails && i < kMaxDataRails; ++i)
    d.keys[i] = s.take<std::uint64_t>();
  valid = fits(d);
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = loom::fuzz::as_bytes(data, size);
  ByteSource source(in);
  bool valid = true;
  const RegionDescriptor value = make_descriptor(source, valid);
  // A decoded descriptor re-encodes to the same bytes and describes a non-empty range that
  // does not wrap, whatever the decoding object held before.
  loom::fuzz::check_decode(in, value, decode_descriptor, encode_descriptor, same, fits);
  const std::size_t expected = descriptor_bytes(value.rails);
  loom::fuzz::check_encode(value, valid, expected, loom::fuzz::make_room(source, expected),
                           decode_descriptor, encode_descriptor, same);
  return 0;
}
