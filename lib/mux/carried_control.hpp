// Control messages that ride on data messages. A control message goes on a lane's control rails,
// apart from its data; yet in a ping-pong each message one way is answered by one the other
// way: the clear-to-send our receive communicator owes the peer's sender can travel inside the
// eager message our send communicator (on the same lane, or another one) is about to inject
// towards the peer, instead of costing a message (and, on tcp, four system calls) of its own. The
// eager tag's carrier bit (routing.hpp) says one is there; after the payload come the control
// message, header and all, and a trailer naming the lane it is for on the receiving host:
//
//   payload | control header + body | padding | target lane id (u64) | control length (u16) |
//   padding length (u16) | magic (u16)
//
// Padding (zeros, up to kMaxCarrierPadding) lets a sender lengthen a small carrier where a
// provider delivers small messages slower than larger ones. loom's senders pad nothing: on one
// connection per pair tcp is faster unpadded (docs/performance.md). Receivers strip any padding,
// so a sender may pad again without a protocol change.
//
// The receiving communicator strips it and posts it to the target lane's inbox
// (LaneRegistry::post_carried); that lane dispatches it like one from its control rails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "mux/control_channel.hpp"

namespace loom::mux {

inline constexpr std::uint16_t kCarrierMagic = 0x4343;  // "CC"
inline constexpr std::size_t kCarrierTrailerBytes = 8 + 2 + 2 + 2;
inline constexpr std::size_t kMaxCarrierPadding = 256;
// A carried control message, header included, is at most this long: a clear-to-send of a few
// entries. A larger batch goes on the control rails.
inline constexpr std::size_t kMaxCarriedControl = 512;
// ofi::kInjectHeadroom (what loom asks providers to inject beyond LOOM_INJECT_MAX) leaves room
// for the largest carried message and its trailer.
static_assert(kMaxCarriedControl + kCarrierTrailerBytes <= 1024);

// Writes the trailer after a control message of `control_length` bytes (0: padding alone); false
// if `out` is too small or the length out of range.
bool encode_carrier_trailer(std::span<std::byte> out, std::uint64_t target_lane,
                            std::size_t control_length, std::size_t padding) noexcept;

struct CarriedControl {
  std::size_t payload_length = 0;      // the application's bytes, at the start
  std::uint64_t target_lane = 0;       // the lane of the receiving host it is for
  std::span<const std::byte> message;  // header + body, checked by decode_control_header; empty
                                       // for padding alone
};
// Splits a received carrier; the reason it is malformed, or nullptr.
const char* decode_carrier(std::span<const std::byte> received, CarriedControl& out) noexcept;

}  // namespace loom::mux
