// A received eager message that carries a control message (mux/carried_control.hpp): the
// trailer and the control header are checked before anything is used, and what decodes splits
// the message into payload and control message exactly.
#include <algorithm>

#include "fuzz.hpp"
#include "mux/carried_control.hpp"

namespace {

using namespace loom::mux;
using loom::fuzz::require;

void check_decode(std::span<const std::byte> in) {
  CarriedControl carried;
  if (decode_carrier(in, carried) != nullptr) return;
  require(
      carried.payload_length + carried.message.size() + kCarrierTrailerBytes <= in.size() &&
          in.size() - (carried.payload_length + carried.message.size() + kCarrierTrailerBytes) <=
              kMaxCarrierPadding,
      "payload, control message, padding and trailer are the whole message");
  require(carried.message.data() == in.data() + carried.payload_length,
          "the control message follows the payload");
  require(carried.message.size() <= kMaxCarriedControl, "the control message is bounded");
  if (carried.message.empty()) return;  // padding alone
  const auto header = decode_control_header(carried.message);
  require(header && kControlHeaderBytes + header->length == carried.message.size(),
          "the control header covers the carried message");
}

// payload | header + body | padding | trailer, built from the input (or payload | padding |
// trailer, padding alone): decodes back to its parts, and a message one byte shorter does not
// decode to the same control message.
void check_encode(loom::fuzz::ByteSource& source) {
  const std::size_t payload = source.take<std::uint16_t>() % 5000;
  const bool padding_alone = source.u8() % 4 == 0;
  const std::size_t body = source.take<std::uint16_t>() % (kMaxCarriedControl + 8);
  const std::uint64_t lane = source.take<std::uint64_t>();
  const std::size_t padding = source.u8() % 2 == 0 ? 0 : source.take<std::uint16_t>() % 300;
  const ControlHeader header{.type = source.u8(),
                             .comm = source.take<CommId>(),
                             .length = static_cast<std::uint16_t>(body)};
  std::vector<std::byte> message = source.bytes(payload);
  const std::size_t at = message.size();
  const std::size_t control = padding_alone ? 0 : kControlHeaderBytes + body;
  message.resize(at + control + padding + kCarrierTrailerBytes);
  if (!padding_alone) {
    require(encode_control_header({message.data() + at, kControlHeaderBytes}, header),
            "the header fits");
  }
  const bool ok = encode_carrier_trailer(
      {message.data() + at + control + padding, kCarrierTrailerBytes}, lane, control, padding);
  require(ok == (control <= kMaxCarriedControl && padding <= kMaxCarrierPadding),
          "a trailer is written for a bounded message and padding");
  if (!ok) return;
  CarriedControl carried;
  const char* why = decode_carrier(message, carried);
  require(why == nullptr, "decode(encode(x)) succeeds");
  require(carried.payload_length == payload && carried.target_lane == lane &&
              carried.message.size() == control,
          "decode(encode(x)) == x");
  const std::span<const std::byte> shorter(message.data(), message.size() - 1);
  require(decode_carrier(shorter, carried) != nullptr || carried.message.size() != control ||
              carried.payload_length != payload,
          "a truncated carrier does not decode to the same parts");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = loom::fuzz::as_bytes(data, size);
  check_decode(in);
  loom::fuzz::ByteSource source(in);
  check_encode(source);
  return 0;
}
