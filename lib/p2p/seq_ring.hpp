// Entries by sequence number, for the numbers a communicator has in flight.
//
// The protocol lets a communicator have kSeqWindow numbers in flight (kMaxRequests requests of
// kMaxParts buffers each), but a table of kSeqWindow entries per communicator makes memory grow
// with peers rather than with traffic (88 KiB for a SendComm and RecvComm pair, most of a
// peer's cost). The ring starts small and doubles, up to kSeqWindow, only when a number would
// take the slot of an entry its owner still uses: memory follows what is in flight.
//
// Slot lookup is `seq % capacity`, and the capacity divides kSeqWindow, so a number known only
// by its low bits (remote CQ data) finds its slot too. A slot may hold another number's entry:
// readers compare the entry's sequence number, as they would with any table smaller than 2^32.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace loom::p2p {

template <class Entry, std::size_t kMaxCapacity>
class SeqRing {
 public:
  static constexpr std::size_t kFirstCapacity = 16;
  static_assert((kMaxCapacity & (kMaxCapacity - 1)) == 0 && kMaxCapacity >= kFirstCapacity);

  struct Slot {
    std::uint32_t seq = 0;
    bool claimed = false;  // an unclaimed slot holds a default entry
    Entry entry;
  };

  // `extras`: 64-bit words kept beside each entry (a sender's remote keys, one per data rail).
  explicit SeqRing(std::size_t extras = 0)
      : extras_per_slot_(extras),
        slots_(kFirstCapacity),
        extras_(kFirstCapacity * extras),
        mask_(kFirstCapacity - 1) {}

  // The slot `seq` maps to now (its entry, or another number's).
  [[nodiscard]] Slot& slot(std::uint32_t seq) noexcept { return slots_[seq & mask_]; }
  [[nodiscard]] const Slot& slot(std::uint32_t seq) const noexcept { return slots_[seq & mask_]; }
  // The entry of `seq`, or nullptr when its slot holds no entry of that number.
  [[nodiscard]] Entry* find(std::uint32_t seq) noexcept {
    Slot& s = slot(seq);
    return s.claimed && s.seq == seq ? &s.entry : nullptr;
  }
  [[nodiscard]] const Entry* find(std::uint32_t seq) const noexcept {
    const Slot& s = slot(seq);
    return s.claimed && s.seq == seq ? &s.entry : nullptr;
  }
  [[nodiscard]] std::uint64_t* extras(std::uint32_t seq) noexcept {
    return extras_.data() + (seq & mask_) * extras_per_slot_;
  }

  // The entry of `seq`, made if its slot held another number's (or none). `in_use(slot)` says
  // whether that other entry must be kept: then the ring doubles first. Entries and extras move
  // when it does: references taken before a claim do not survive it.
  // Inline, with the ring's growth out of line: every post claims an entry.
  template <class InUse>
  Entry& claim(std::uint32_t seq, InUse&& in_use) {
    Slot& s = slot(seq);
    if (s.claimed && s.seq == seq) return s.entry;
    // At the largest capacity the newer number takes the slot, as in a table of kMaxCapacity
    // entries: the numbers the protocol still reads lie within that span. (What an owner calls
    // in use may be wider: a send whose message arrived, waiting for its application to test it.)
    if (!s.claimed || !in_use(s) || slots_.size() == kMaxCapacity) [[likely]]
      return take(s, seq);
    return claim_grown(seq, in_use);
  }

  [[nodiscard]] std::span<Slot> slots() noexcept { return slots_; }
  [[nodiscard]] std::span<const Slot> slots() const noexcept { return slots_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_.size(); }

 private:
  Entry& take(Slot& s, std::uint32_t seq) {
    s.seq = seq;
    s.claimed = true;
    s.entry = Entry{};
    if (extras_per_slot_ != 0) std::fill_n(extras(seq), extras_per_slot_, 0);
    return s.entry;
  }
  // claim() once the ring had to grow (it may have to again).
  template <class InUse>
  [[gnu::noinline]] Entry& claim_grown(std::uint32_t seq, InUse& in_use) {
    for (;;) {
      grow(in_use);
      Slot& s = slot(seq);
      if (s.claimed && s.seq == seq) return s.entry;
      if (!s.claimed || !in_use(s) || slots_.size() == kMaxCapacity) return take(s, seq);
    }
  }
  // Twice the slots; the entries still in use move over (they cannot collide: they had
  // distinct slots at half the size), the others are dropped.
  template <class InUse>
  void grow(InUse& in_use) {
    const std::size_t capacity = slots_.size() * 2;
    std::vector<Slot> slots(capacity);
    std::vector<std::uint64_t> extras(capacity * extras_per_slot_);
    const std::size_t mask = capacity - 1;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (!s.claimed || !in_use(s)) continue;
      const std::size_t to = s.seq & mask;
      slots[to] = s;
      std::copy_n(extras_.data() + i * extras_per_slot_, extras_per_slot_,
                  extras.data() + to * extras_per_slot_);
    }
    slots_ = std::move(slots);
    extras_ = std::move(extras);
    mask_ = mask;
  }

  std::size_t extras_per_slot_;
  std::vector<Slot> slots_;
  std::vector<std::uint64_t> extras_;
  std::size_t mask_;
};

}  // namespace loom::p2p
