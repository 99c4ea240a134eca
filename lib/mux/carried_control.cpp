#include "mux/carried_control.hpp"

#include "util/wire.hpp"

namespace loom::mux {

bool encode_carrier_trailer(std::span<std::byte> out, std::uint64_t target_lane,
                            std::size_t control_length, std::size_t padding) noexcept {
  if ((control_length != 0 && control_length < kControlHeaderBytes) ||
      control_length > kMaxCarriedControl || padding > kMaxCarrierPadding) {
    return false;
  }
  util::WireWriter w(out);
  w.u64(target_lane);
  w.u16(static_cast<std::uint16_t>(control_length));
  w.u16(static_cast<std::uint16_t>(padding));
  w.u16(kCarrierMagic);
  return w.ok();
}

const char* decode_carrier(std::span<const std::byte> received, CarriedControl& out) noexcept {
  if (received.size() < kCarrierTrailerBytes) return "a carrier shorter than its trailer";
  util::WireReader r(received.last(kCarrierTrailerBytes));
  const std::uint64_t lane = r.u64();
  const std::size_t length = r.u16();
  const std::size_t padding = r.u16();
  const std::uint16_t magic = r.u16();
  if (!r.done() || magic != kCarrierMagic) return "a carrier trailer with a bad magic";
  if ((length != 0 && length < kControlHeaderBytes) || length > kMaxCarriedControl ||
      padding > kMaxCarrierPadding || length + padding > received.size() - kCarrierTrailerBytes) {
    return "a carried control message of a bad length";
  }
  const std::size_t payload = received.size() - kCarrierTrailerBytes - padding - length;
  const std::span<const std::byte> message = received.subspan(payload, length);
  if (length != 0 && !decode_control_header(message)) {
    return "a carried control message with a bad header";
  }
  out = CarriedControl{.payload_length = payload, .target_lane = lane, .message = message};
  return nullptr;
}

}  // namespace loom::mux
