// Grouped receives: an irecv of n buffers takes the next n messages, each into the buffer its
// tag names, in whatever order the sender posts them. NCCL posts such groups when one
// connection serves several remote GPUs (PXN, shared connections), whose sends arrive in any
// order; its IB transport matches them the same way.
//
// The rule (place_in_group), applied by both ends to the group's messages in sequence order:
// a message takes the first buffer of the group not taken yet whose tag is its own, so equal
// tags fill their buffers in posting order; a message whose tag no free buffer has takes the
// first free buffer and fails there (wrong tag) on both sides, so that every message still
// pairs with one buffer and nothing waits for a message that will not come.
//
// Who applies it: the sender, for every message whose group it knows (every buffer of it
// announced: CtsEntry::group_index/group_size), before anything is written, and the message
// then names its buffer's sequence number on the wire (writes, ready-to-send, DataTag::placed).
// A message sent ahead on a credit is sent before its group is known: the receiver places it,
// and the sender places it too once it learns the group (its tag is kept for that: the send
// may have finished).
// Both reach the same placement because messages go ahead in sequence order only (a message
// waiting for its announcement holds back later ones: send_ahead_waiting), so the messages of a
// group that went ahead are its first ones, which the receiver places in sequence order and the
// sender, once it learns the group, places first in the same order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/p2p.hpp"
#include "p2p/messages.hpp"

namespace loom::p2p {

// Bit i: buffer i of a group has its message.
using GroupTaken = std::uint8_t;
static_assert(kMaxParts <= 8 * sizeof(GroupTaken));

// The buffer of a group of `count` buffers with `tags` that a message with `tag` goes into,
// given the buffers `taken` by its earlier messages; `count` when every buffer is taken.
constexpr std::size_t place_in_group(const Tag* tags, std::size_t count, GroupTaken taken,
                                     Tag tag) noexcept {
  std::size_t first_free = count;
  for (std::size_t i = 0; i < count; ++i) {
    if ((taken >> i) & 1u) continue;
    if (tags[i] == tag) return i;
    if (first_free == count) first_free = i;
  }
  return first_free;
}

namespace group_checks {
constexpr Tag kTags[] = {5, 7, 5, 9};
static_assert(place_in_group(kTags, 4, 0, 7) == 1);
static_assert(place_in_group(kTags, 4, 0, 5) == 0);
static_assert(place_in_group(kTags, 4, 0b0001, 5) == 2);  // equal tags in posting order
static_assert(place_in_group(kTags, 4, 0b0010, 8) == 0);  // no buffer has it: the first free
static_assert(place_in_group(kTags, 4, 0b1111, 5) == 4);
}  // namespace group_checks

}  // namespace loom::p2p
