// The per-communicator control bodies: clear-to-send (receiver to sender), ready-to-send
// (sender to receiver) and the close notice (either way). Every input goes through every
// decoder.
#include <algorithm>

#include "fuzz.hpp"
#include "mux/routing.hpp"

namespace {

using namespace loom::p2p;
using loom::fuzz::ByteSource;

bool same_entry(const CtsEntry& x, const CtsEntry& y) {
  const Announcement& a = x.announcement;
  const Announcement& b = y.announcement;
  return a.seq == b.seq && a.size == b.size && a.tag == b.tag && a.refused == b.refused &&
         a.group_index == b.group_index && a.group_size == b.group_size && x.address == y.address;
}

// Only the first `count` entries and `data_rails` keys are on the wire.
bool same_cts(const ClearToSend& a, const ClearToSend& b) {
  if (a.count != b.count || a.data_rails != b.data_rails || a.credits != b.credits ||
      a.eager_size != b.eager_size) {
    return false;
  }
  for (std::size_t i = 0; i < a.count; ++i) {
    if (!same_entry(a.entries[i], b.entries[i])) return false;
  }
  const std::size_t keys = std::size_t{a.count} * a.data_rails;
  return a.keys.size() >= keys && b.keys.size() >= keys &&
         std::equal(a.keys.begin(), a.keys.begin() + static_cast<std::ptrdiff_t>(keys),
                    b.keys.begin());
}
bool cts_fits(const ClearToSend& m) {
  const bool fits = m.data_rails >= 1 && m.data_rails <= kMaxDataRails &&
                    (m.count >= 1 || m.credits >= 1) && m.count <= max_cts_entries(m.data_rails) &&
                    (m.credits == 0 || m.eager_size != 0) && m.eager_size <= kMaxEagerBuffer &&
                    m.keys.size() >= std::size_t{m.count} * m.data_rails;
  return fits &&
         std::all_of(m.entries.begin(), m.entries.begin() + m.count, [](const CtsEntry& entry) {
           const Announcement& e = entry.announcement;
           return e.group_size >= 1 && e.group_size <= kMaxParts && e.group_index < e.group_size;
         });
}

bool same_rts(const ReadyToSend& a, const ReadyToSend& b) {
  if (a.count != b.count) return false;
  for (std::size_t i = 0; i < a.count; ++i) {
    const RtsEntry& x = a.entries[i];
    const RtsEntry& y = b.entries[i];
    if (x.seq != y.seq || x.size != y.size || x.tag != y.tag || x.stripes != y.stripes) {
      return false;
    }
  }
  return true;
}
bool rts_fits(const ReadyToSend& m) {
  if (m.count < 1 || m.count > kMaxBatch) return false;
  for (std::size_t i = 0; i < m.count; ++i) {
    const RtsEntry& e = m.entries[i];
    // An empty message has no writes; any other 1 to kMaxStripes.
    if (e.size == 0 ? e.stripes != 0 : e.stripes < 1 || e.stripes > loom::mux::kMaxStripes) {
      return false;
    }
  }
  return true;
}

// 0 to kMaxBatch + 1 entries of 0 to kMaxDataRails + 1 keys; entries past the array stay empty.
ClearToSend make_cts(ByteSource& s) {
  ClearToSend m;
  m.count = static_cast<std::uint8_t>(s.u8() % (kMaxBatch + 2));
  m.data_rails = static_cast<std::uint8_t>(s.u8() % (kMaxDataRails + 2));
  m.credits = s.take<std::uint16_t>();
  m.eager_size = s.take<std::uint32_t>();
  for (std::size_t i = 0; i < std::min<std::size_t>(m.count, kMaxBatch); ++i) {
    Announcement& e = m.entries[i].announcement;
    e.seq = s.take<std::uint32_t>();
    e.size = s.take<std::uint64_t>();
    e.tag = s.take<std::uint32_t>();
    const std::uint8_t flags = s.u8();
    e.refused = (flags & 2) != 0;
    e.group_index = static_cast<std::uint8_t>((flags >> 2) & 7);
    e.group_size = static_cast<std::uint8_t>(s.u8() % (kMaxParts + 2));
    m.entries[i].address = s.take<std::uint64_t>();
    for (std::size_t k = 0; k < std::min<std::size_t>(m.data_rails, kMaxDataRails); ++k) {
      m.keys.push_back(s.take<std::uint64_t>());
    }
  }
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = loom::fuzz::as_bytes(data, size);
  ByteSource source(in);
  const ClearToSend cts = make_cts(source);
  ReadyToSend rts;
  rts.count = static_cast<std::uint8_t>(source.u8() % (kMaxBatch + 2));
  for (std::size_t i = 0; i < std::min<std::size_t>(rts.count, kMaxBatch); ++i) {
    rts.entries[i] = RtsEntry{.seq = source.take<std::uint32_t>(),
                              .size = source.take<std::uint64_t>(),
                              .tag = source.take<std::uint32_t>(),
                              .stripes = source.u8()};
  }

  CloseNotice close{
      .complete_below = source.take<std::uint32_t>(),
      .span = static_cast<std::uint16_t>(source.take<std::uint16_t>() % (kCloseWindow + 2))};
  close.awaits_writes = (source.u8() & 1) != 0;
  close.reason = static_cast<CloseReason>(source.u8() % 3);
  close.writes_posted = source.take<std::uint32_t>();
  for (auto& byte : close.finished_bits) byte = source.u8();
  if (close.span <= kCloseWindow) {
    for (std::size_t bit = close.span; bit < kCloseWindow; ++bit) {
      close.finished_bits[bit / 8] &= static_cast<std::uint8_t>(~(1u << (bit % 8)));
    }
  }
  const auto same_close = [](const CloseNotice& a, const CloseNotice& b) {
    return a.complete_below == b.complete_below && a.span == b.span &&
           a.awaits_writes == b.awaits_writes && a.reason == b.reason &&
           a.writes_posted == b.writes_posted && a.finished_bits == b.finished_bits;
  };
  const auto close_fits = [](const CloseNotice& m) { return m.span <= kCloseWindow; };

  loom::fuzz::check_decode(in, cts, decode_cts, encode_cts, same_cts, cts_fits);
  loom::fuzz::check_decode(in, rts, decode_rts, encode_rts, same_rts, rts_fits);
  loom::fuzz::check_decode(in, close, decode_close, encode_close, same_close, close_fits);
  Ping ping;
  if (decode_ping(in, ping) == nullptr) {
    std::byte out[kPingAwaitingBytes];
    const std::size_t n = encode_ping(ping, out);
    loom::fuzz::require(n == in.size() && std::equal(out, out + n, in.begin()),
                        "a decoded ping re-encodes to the same bytes");
  }
  AskClearance ask;
  if (decode_ask_clearance(in, ask) == nullptr) {
    std::byte out[kAskClearanceBytes];
    const std::size_t n = encode_ask_clearance(ask, out);
    loom::fuzz::require(n == in.size() && std::equal(out, out + n, in.begin()),
                        "a decoded ask for clearance re-encodes to the same bytes");
    loom::fuzz::require(ask.until - ask.from <= kAskSpan, "an ask spans at most kAskSpan");
  }
  const std::size_t close_expected = close_notice_bytes(close.span);
  loom::fuzz::check_encode(close, close_fits(close), close_expected,
                           loom::fuzz::make_room(source, close_expected), decode_close,
                           encode_close, same_close);

  const std::size_t expected = cts_bytes(cts.count, cts.data_rails);
  loom::fuzz::check_encode(cts, cts_fits(cts), expected, loom::fuzz::make_room(source, expected),
                           decode_cts, encode_cts, same_cts);
  const std::size_t rts_expected = rts_bytes(rts.count);
  loom::fuzz::check_encode(rts, rts_fits(rts), rts_expected,
                           loom::fuzz::make_room(source, rts_expected), decode_rts, encode_rts,
                           same_rts);
  return 0;
}
