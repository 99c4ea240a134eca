// How completions find their communicator on a shared lane: the comm id rides in the tag of
// eager messages and in the remote CQ data of RMA writes. Bit budgets are fixed here and
// checked at compile time: tags within 48 bits (CXI reserves the rest), CQ data within 32 bits
// (EFA's cq_data_size is 4).
#pragma once

#include <cstdint>

namespace loom::mux {

using CommId = std::uint16_t;

inline constexpr unsigned kCommIdBits = 16;
inline constexpr unsigned kTagKindBits = 4;
// The sequence field: the low kTagSeqBits of a sequence number and, above them, one bit saying
// the message carries a control message for another lane after its payload (see
// mux/carried_control.hpp), one saying which sequence it names (DataTag::placed), and the
// message's eager fragment: its index and the count less one (kFragmentBits each).
inline constexpr unsigned kTagSeqBits = 22;
inline constexpr unsigned kFragmentBits = 2;
inline constexpr unsigned kTagSeqFieldBits = kTagSeqBits + 2 + 2 * kFragmentBits;
// The most eager fragments one message may take (p2p/eager.cpp).
inline constexpr unsigned kMaxEagerFragments = 1u << kFragmentBits;
inline constexpr unsigned kUsableTagBits = 48;
static_assert(kTagKindBits + kCommIdBits + kTagSeqFieldBits <= kUsableTagBits);

enum class TagKind : std::uint8_t {
  kEager = 1,  // a message sent ahead on a credit into one of the receiver's eager buffers
};

struct DataTag {
  TagKind kind;
  CommId comm;
  std::uint32_t seq;     // low kTagSeqBits of a sequence number (see `placed`)
  bool carrier = false;  // a carrier: control or padding follows the payload (carried_control.hpp)
  // The sender matched the message to a buffer it announced: `seq` names that buffer. Else the
  // message went ahead of any announcement and `seq` is its own number; a grouped receive
  // places it by tag (p2p/group.hpp).
  bool placed = false;
  // A message longer than one eager buffer goes in `fragments` eager messages of one sequence
  // number, fragment i with its bytes from i eager buffers' size on (p2p/eager.cpp).
  std::uint8_t fragment = 0;
  std::uint8_t fragments = 1;  // 1 .. kMaxEagerFragments
};

inline constexpr std::uint32_t kTagSeqMask = (1u << kTagSeqBits) - 1;
// What a receive that takes any sequence number ignores.
inline constexpr std::uint64_t kTagSeqFieldMask = (std::uint64_t{1} << kTagSeqFieldBits) - 1;
// What a receive that takes any communicator's message of a kind ignores (a lane's eager pool).
inline constexpr std::uint64_t kTagCommAndSeqMask =
    (std::uint64_t{1} << (kCommIdBits + kTagSeqFieldBits)) - 1;

inline constexpr unsigned kTagFragmentShift = kTagSeqBits + 2;
inline constexpr std::uint32_t kFragmentMask = (1u << kFragmentBits) - 1;

constexpr std::uint64_t encode_tag(DataTag t) {
  return (std::uint64_t{static_cast<std::uint8_t>(t.kind)} << (kCommIdBits + kTagSeqFieldBits)) |
         (std::uint64_t{t.comm} << kTagSeqFieldBits) |
         (std::uint64_t{(t.fragments - 1u) & kFragmentMask}
          << (kTagFragmentShift + kFragmentBits)) |
         (std::uint64_t{t.fragment & kFragmentMask} << kTagFragmentShift) |
         (std::uint64_t{t.placed} << (kTagSeqBits + 1)) |
         (std::uint64_t{t.carrier} << kTagSeqBits) | (t.seq & kTagSeqMask);
}

constexpr DataTag decode_tag(std::uint64_t tag) {
  return DataTag{
      static_cast<TagKind>((tag >> (kCommIdBits + kTagSeqFieldBits)) & ((1u << kTagKindBits) - 1)),
      static_cast<CommId>(tag >> kTagSeqFieldBits),
      static_cast<std::uint32_t>(tag & kTagSeqMask),
      ((tag >> kTagSeqBits) & 1u) != 0,
      ((tag >> (kTagSeqBits + 1)) & 1u) != 0,
      static_cast<std::uint8_t>((tag >> kTagFragmentShift) & kFragmentMask),
      static_cast<std::uint8_t>(((tag >> (kTagFragmentShift + kFragmentBits)) & kFragmentMask) +
                                1)};
}

// Remote CQ data of a rendezvous stripe: comm id | sequence | fills | stripe count. `fills`
// says the message fills the buffer its clear-to-send announced, with that buffer's tag (the
// sender checked both): the receiver then needs no ready-to-send to learn size and tag.
inline constexpr unsigned kImmSeqBits = 12;
inline constexpr unsigned kImmFillsBits = 1;
inline constexpr unsigned kImmStripeBits = 3;
static_assert(kCommIdBits + kImmSeqBits + kImmFillsBits + kImmStripeBits == 32);
inline constexpr std::uint32_t kImmSeqMask = (1u << kImmSeqBits) - 1;
inline constexpr unsigned kMaxStripes = 1u << kImmStripeBits;

struct WriteImmediate {
  CommId comm;
  std::uint16_t seq;     // low kImmSeqBits of the message sequence number
  bool fills;            // the message is exactly the announced buffer's size and tag
  std::uint8_t stripes;  // 1 .. kMaxStripes
};

constexpr std::uint32_t encode_immediate(WriteImmediate w) {
  return (std::uint32_t{w.comm} << (kImmSeqBits + kImmFillsBits + kImmStripeBits)) |
         ((w.seq & kImmSeqMask) << (kImmFillsBits + kImmStripeBits)) |
         (std::uint32_t{w.fills} << kImmStripeBits) | ((w.stripes - 1u) & (kMaxStripes - 1));
}

constexpr WriteImmediate decode_immediate(std::uint32_t data) {
  return WriteImmediate{
      static_cast<CommId>(data >> (kImmSeqBits + kImmFillsBits + kImmStripeBits)),
      static_cast<std::uint16_t>((data >> (kImmFillsBits + kImmStripeBits)) & kImmSeqMask),
      ((data >> kImmStripeBits) & 1u) != 0,
      static_cast<std::uint8_t>((data & (kMaxStripes - 1)) + 1)};
}

static_assert(decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0x2BCDEF})).comm == 0xBEEF);
static_assert(decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0x2BCDEF})).seq == 0x2BCDEF);
static_assert(!decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0xFFFFFFFF})).carrier);
static_assert(!decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0xFFFFFFFF, true})).placed);
static_assert(decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0x3FFFFF, false, true})).placed);
static_assert(decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0x3FFFFF, false, true})).seq ==
              0x3FFFFF);
static_assert(!decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0, false, true})).carrier);
static_assert(decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0, true})).carrier);
static_assert(decode_tag(encode_tag({TagKind::kEager, 0xFFFF, 0, true})).kind == TagKind::kEager);
static_assert(encode_tag({TagKind::kEager, 0xFFFF, 0xFFFFFFFF, true, true}) <
              (1ull << kUsableTagBits));
static_assert(
    decode_tag(encode_tag({TagKind::kEager, 0xFFFF, 0x3FFFFF, true, true, 3, 4})).fragment == 3);
static_assert(
    decode_tag(encode_tag({TagKind::kEager, 0xFFFF, 0x3FFFFF, true, true, 3, 4})).fragments == 4);
static_assert(decode_tag(encode_tag({TagKind::kEager, 0xFFFF, 0x3FFFFF, true, true, 3, 4})).seq ==
              0x3FFFFF);
static_assert(decode_tag(encode_tag({TagKind::kEager, 0xFFFF, 0x3FFFFF, true, true, 3, 4})).kind ==
              TagKind::kEager);
static_assert(decode_tag(encode_tag({TagKind::kEager, 0xBEEF, 0})).fragments == 1);
static_assert(encode_tag({TagKind::kEager, 0xFFFF, 0xFFFFFFFF, true, true, 3, 4}) <
              (1ull << kUsableTagBits));
static_assert(decode_immediate(encode_immediate({0x1234, 0xFFF, false, 8})).stripes == 8);
static_assert(decode_immediate(encode_immediate({0x1234, 0xABC, true, 1})).seq == 0xABC);
static_assert(decode_immediate(encode_immediate({0x1234, 0xABC, true, 1})).fills);
static_assert(!decode_immediate(encode_immediate({0xFFFF, 0xFFF, false, 8})).fills);
static_assert(decode_immediate(encode_immediate({0xFFFF, 0, false, 3})).comm == 0xFFFF);

}  // namespace loom::mux
