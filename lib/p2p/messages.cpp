#include "p2p/messages.hpp"

#include <cstring>

#include "mux/control_channel.hpp"
#include "util/wire.hpp"

namespace loom::p2p {
namespace {

using util::get_field;
using util::put_field;
using util::WireReader;
using util::WireWriter;

static_assert(kHandleHeaderBytes + 1 + 16 <= 128, "an IPv4 sockaddr must fit a handle");
static_assert(max_cts_entries(kMaxDataRails) >= kMaxParts, "a whole irecv fits one message");
static_assert(cts_bytes(max_cts_entries(1), 1) <= mux::kMaxControlBody);
static_assert(rts_bytes(kMaxBatch) <= mux::kMaxControlBody);
static_assert(close_notice_bytes(kCloseWindow) <= mux::kMaxControlBody);

// A clear-to-send entry's flags byte, after seq, size and tag.
constexpr std::size_t kCtsFlagOffset = 4 + 8 + 4;
constexpr std::uint8_t kCtsRefused = 2;  // bit 0 was "an eager receive waits" (version 5)
// Bits 2-4: the buffer's index in its irecv's group; bits 5-7: the group's size - 1 (version 10).
constexpr unsigned kCtsGroupIndexShift = 2;
constexpr unsigned kCtsGroupSizeShift = 5;
constexpr std::uint8_t kCtsGroupFieldMask = 7;
static_assert(kMaxParts - 1 <= kCtsGroupFieldMask);

constexpr std::uint8_t cts_flags(const Announcement& e) {
  return static_cast<std::uint8_t>(
      (e.refused ? kCtsRefused : 0) | (e.group_index << kCtsGroupIndexShift) |
      (static_cast<std::uint8_t>(e.group_size - 1) << kCtsGroupSizeShift));
}

// An empty message's ready-to-send names no writes; any other's 1 to kMaxStripes (a refused
// message's, which has none written, says 1).
bool stripes_fit(const RtsEntry& e) {
  return e.size == 0 ? e.stripes == 0 : e.stripes >= 1 && e.stripes <= mux::kMaxStripes;
}

void put_address(WireWriter& w, std::span<const std::byte> address) {
  w.u8(static_cast<std::uint8_t>(address.size()));
  w.bytes(address);
}

bool get_address(WireReader& r, EndpointName& out) {
  const std::size_t length = r.u8();
  if (length == 0 || length > kMaxAddressBytes) return false;
  auto bytes = r.bytes(length);
  out.assign(bytes.begin(), bytes.end());
  return r.ok();
}

bool address_fits(std::span<const std::byte> address) {
  return !address.empty() && address.size() <= kMaxAddressBytes;
}

void put_lane(WireWriter& w, const LaneAddresses& lane) {
  w.u64(lane.lane);
  w.u16(lane.comm);
  w.u8(static_cast<std::uint8_t>(lane.data.size()));
  w.u8(static_cast<std::uint8_t>(lane.control.size()));
  for (const auto& a : lane.data) put_address(w, a);
  for (const auto& a : lane.control) put_address(w, a);
}

const char* get_lane(WireReader& r, LaneAddresses& lane) {
  lane.lane = r.u64();
  lane.comm = r.u16();
  const std::size_t data = r.u8();
  const std::size_t control = r.u8();
  if (!r.ok()) return "truncated lane description";
  if (data == 0 || data > kMaxDataRails) return "data rail count out of range";
  if (control == 0 || control > kMaxControlRails) return "control rail count out of range";
  lane.data.resize(data);
  lane.control.resize(control);
  for (auto& a : lane.data)
    if (!get_address(r, a)) return "bad rail address";
  for (auto& a : lane.control)
    if (!get_address(r, a)) return "bad rail address";
  return nullptr;
}

bool lane_fits(const LaneAddresses& lane) {
  if (lane.data.empty() || lane.data.size() > kMaxDataRails) return false;
  if (lane.control.empty() || lane.control.size() > kMaxControlRails) return false;
  for (const auto& a : lane.data)
    if (!address_fits(a)) return false;
  for (const auto& a : lane.control)
    if (!address_fits(a)) return false;
  return true;
}

std::size_t finish(const WireWriter& w) {
  return w.ok() ? w.size() : 0;
}

}  // namespace

std::size_t encode_handle(const HandleData& handle, std::span<std::byte> out) {
  if (handle.addresses.empty() || handle.addresses.size() > kMaxHandleAddresses) return 0;
  for (const auto& a : handle.addresses)
    if (!address_fits(a)) return 0;
  WireWriter w(out);
  w.u32(kHandleMagic);
  w.u8(kProtocolVersion);
  w.u8(static_cast<std::uint8_t>(handle.addresses.size()));
  w.u32(handle.listener);
  w.u64(handle.nonce);
  w.u64(handle.context);
  for (const auto& a : handle.addresses) put_address(w, a);
  return finish(w);
}

const char* decode_handle(std::span<const std::byte> in, HandleData& out) {
  WireReader r(in);
  const auto magic = r.u32();
  const auto version = r.u8();
  const std::size_t count = r.u8();
  out.listener = r.u32();
  out.nonce = r.u64();
  out.context = r.u64();
  if (!r.ok()) return "handle truncated";
  if (magic != kHandleMagic) return "not a loom handle (wrong magic)";
  if (version != kProtocolVersion) return "handle from an unsupported loom protocol version";
  if (count == 0 || count > kMaxHandleAddresses) return "handle address count out of range";
  out.addresses.resize(count);
  for (auto& a : out.addresses)
    if (!get_address(r, a)) return "handle address truncated or too long";
  if (!r.done()) return "handle has trailing bytes";
  return nullptr;
}

std::size_t encode_connect(const ConnectMessage& m, std::span<std::byte> out) {
  if (!address_fits(m.reply_to) || !lane_fits(m.lane)) return 0;
  WireWriter w(out);
  w.u32(m.magic);
  w.u8(m.version);
  w.u32(m.listener);
  w.u64(m.nonce);
  w.u64(m.context);
  w.u32(m.connect_id);
  w.u8(static_cast<std::uint8_t>(m.kind));
  w.u64(m.label);
  put_address(w, m.reply_to);
  put_lane(w, m.lane);
  return finish(w);
}

const char* decode_connect(std::span<const std::byte> in, ConnectMessage& out) {
  WireReader r(in);
  out.magic = r.u32();
  out.version = r.u8();
  out.listener = r.u32();
  out.nonce = r.u64();
  out.context = r.u64();
  out.connect_id = r.u32();
  const std::uint8_t kind = r.u8();
  out.label = r.u64();
  if (!r.ok()) return "connect message truncated";
  if (kind > static_cast<std::uint8_t>(ConnectionKind::kOneSided))
    return "connect message: unknown connection kind";
  out.kind = static_cast<ConnectionKind>(kind);
  if (!get_address(r, out.reply_to)) return "connect message: bad reply address";
  if (const char* why = get_lane(r, out.lane)) return why;
  if (!r.done()) return "connect message has trailing bytes";
  return nullptr;
}

std::size_t encode_accept(const AcceptMessage& m, std::span<std::byte> out) {
  if (!lane_fits(m.lane)) return 0;
  WireWriter w(out);
  w.u32(m.connect_id);
  w.u64(m.context);
  put_lane(w, m.lane);
  return finish(w);
}

const char* decode_accept(std::span<const std::byte> in, AcceptMessage& out) {
  WireReader r(in);
  out.connect_id = r.u32();
  out.context = r.u64();
  if (!r.ok()) return "accept message truncated";
  if (const char* why = get_lane(r, out.lane)) return why;
  if (!r.done()) return "accept message has trailing bytes";
  return nullptr;
}

std::size_t encode_reject(const RejectMessage& m, std::span<std::byte> out) {
  const auto reason = static_cast<std::uint8_t>(m.reason);
  if (reason < 1 || reason > static_cast<std::uint8_t>(RejectReason::kSetupFailed)) return 0;
  WireWriter w(out);
  w.u32(m.connect_id);
  w.u8(reason);
  return finish(w);
}

const char* decode_reject(std::span<const std::byte> in, RejectMessage& out) {
  WireReader r(in);
  out.connect_id = r.u32();
  const auto reason = r.u8();
  if (!r.done()) return "reject message has the wrong length";
  if (reason < 1 || reason > static_cast<std::uint8_t>(RejectReason::kSetupFailed)) {
    return "reject message: unknown reason";
  }
  out.reason = static_cast<RejectReason>(reason);
  return nullptr;
}

namespace {

// Bits past `span` are zero: one notice has one encoding.
bool close_bits_fit(const CloseNotice& m) {
  if (m.span > kCloseWindow) return false;
  for (std::size_t bit = m.span; bit < kCloseWindow; ++bit)
    if ((m.finished_bits[bit / 8] >> (bit % 8) & 1u) != 0) return false;
  return true;
}

}  // namespace

std::size_t encode_close(const CloseNotice& m, std::span<std::byte> out) {
  if (!close_bits_fit(m)) return 0;
  WireWriter w(out);
  w.u32(m.complete_below);
  w.u16(m.span);
  w.u8(static_cast<std::uint8_t>((m.awaits_writes ? 1u : 0u) |
                                 (static_cast<unsigned>(m.reason) << 1)));
  w.u32(m.writes_posted);
  w.bytes(std::as_bytes(std::span(m.finished_bits).first((m.span + 7u) / 8)));
  return finish(w);
}

const char* decode_close(std::span<const std::byte> in, CloseNotice& out) {
  WireReader r(in);
  out.complete_below = r.u32();
  out.span = r.u16();
  const std::uint8_t flags = r.u8();
  if (!r.ok() || out.span > kCloseWindow) return "close notice: span out of range";
  if ((flags >> 1) > static_cast<unsigned>(CloseReason::kLost)) {
    return "close notice: unknown flags";
  }
  out.awaits_writes = (flags & 1) != 0;
  out.reason = static_cast<CloseReason>(flags >> 1);
  out.writes_posted = r.u32();
  const auto bits = r.bytes((out.span + 7u) / 8);
  if (!r.done()) return "close notice has the wrong length";
  out.finished_bits.fill(0);
  std::memcpy(out.finished_bits.data(), bits.data(), bits.size());
  if (!close_bits_fit(out)) return "close notice: bits set past its span";
  return nullptr;
}

const char* to_string(ConnectionKind kind) {
  return kind == ConnectionKind::kOneSided ? "one-sided" : "two-sided";
}

std::size_t encode_notify(const Notify& m, std::span<std::byte> out) {
  WireWriter w(out);
  w.u32(m.seq);
  w.u64(m.tag);
  w.u64(m.value);
  w.u32(m.blocks);
  w.u64(m.bytes);
  w.u32(m.writes);
  w.u32(m.counter);
  return finish(w);
}

const char* decode_notify(std::span<const std::byte> in, Notify& out) {
  WireReader r(in);
  out.seq = r.u32();
  out.tag = r.u64();
  out.value = r.u64();
  out.blocks = r.u32();
  out.bytes = r.u64();
  out.writes = r.u32();
  out.counter = r.u32();
  if (!r.ok()) return "notification truncated";
  if (!r.done()) return "notification has trailing bytes";
  if (out.counter > mux::kImmSeqMask) return "notification: counter out of range";
  return nullptr;
}

std::size_t encode_region_note(const RegionNote& m, std::span<std::byte> out) {
  WireWriter w(out);
  w.u32(m.seq);
  w.u32(m.slot);
  w.u32(m.generation);
  w.u8(m.live ? 1 : 0);
  return finish(w);
}

const char* decode_region_note(std::span<const std::byte> in, RegionNote& out) {
  WireReader r(in);
  out.seq = r.u32();
  out.slot = r.u32();
  out.generation = r.u32();
  const std::uint8_t live = r.u8();
  if (!r.ok()) return "region note truncated";
  if (!r.done()) return "region note has trailing bytes";
  if (live > 1) return "region note: bad live flag";
  out.live = live == 1;
  return nullptr;
}

std::size_t encode_writes_posted(const WritesPosted& m, std::span<std::byte> out) {
  WireWriter w(out);
  w.u32(m.writes);
  return finish(w);
}

const char* decode_writes_posted(std::span<const std::byte> in, WritesPosted& out) {
  WireReader r(in);
  out.writes = r.u32();
  if (!r.done()) return "writes-posted answer has the wrong length";
  return nullptr;
}

std::size_t encode_ask_clearance(const AskClearance& m, std::span<std::byte> out) {
  if (m.until - m.from > kAskSpan) return 0;
  WireWriter w(out);
  w.u32(m.from);
  w.u32(m.until);
  return finish(w);
}

const char* decode_ask_clearance(std::span<const std::byte> in, AskClearance& out) {
  WireReader r(in);
  out.from = r.u32();
  out.until = r.u32();
  if (!r.done()) return "ask for clearance has the wrong length";
  if (out.until - out.from > kAskSpan) return "ask for clearance spans too many messages";
  return nullptr;
}

std::size_t encode_ping(const Ping& m, std::span<std::byte> out) {
  if (!m.awaiting) return 0;
  WireWriter w(out);
  w.u32(m.oldest_awaiting);
  return finish(w);
}

const char* decode_ping(std::span<const std::byte> in, Ping& out) {
  out = Ping{};
  if (in.empty()) return nullptr;
  WireReader r(in);
  out.oldest_awaiting = r.u32();
  if (!r.done()) return "ping has the wrong length";
  out.awaiting = true;
  return nullptr;
}

const char* to_string(RejectReason reason) {
  switch (reason) {
    case RejectReason::kBadMagic:
      return "wrong magic";
    case RejectReason::kBadVersion:
      return "unsupported protocol version";
    case RejectReason::kUnknownListener:
      return "no such listener (closed?)";
    case RejectReason::kBadNonce:
      return "wrong nonce (stale or forged handle)";
    case RejectReason::kSetupFailed:
      return "the listener failed to set up the communicator";
  }
  return "unknown reason";
}

// The batch is checked once, whole, and its fields written unchecked: a clear-to-send carries
// an entry for every message, and per-field bounds tests made encoding 64 of the ~930
// instructions a receiver's own code spends per 4 KiB message on shm (42 without).
std::size_t encode_cts(const ClearToSend& m, std::span<std::byte> out) {
  if (m.data_rails == 0 || m.data_rails > kMaxDataRails ||
      m.count > max_cts_entries(m.data_rails) || (m.count == 0 && m.credits == 0) ||
      (m.credits != 0 && m.eager_size == 0) || m.eager_size > kMaxEagerBuffer ||
      m.keys.size() < std::size_t{m.count} * m.data_rails) {
    return 0;
  }
  for (std::size_t i = 0; i < m.count; ++i) {
    const Announcement& e = m.entries[i].announcement;
    if (e.group_size == 0 || e.group_size > kMaxParts || e.group_index >= e.group_size) return 0;
  }
  const std::size_t length = cts_bytes(m.count, m.data_rails);
  if (length > out.size()) return 0;
  std::byte* at = out.data();
  at = put_field<std::uint8_t>(at, m.count);
  at = put_field<std::uint8_t>(at, m.data_rails);
  at = put_field<std::uint16_t>(at, m.credits);
  at = put_field<std::uint32_t>(at, m.eager_size);
  for (std::size_t i = 0; i < m.count; ++i) {
    const Announcement& e = m.entries[i].announcement;
    at = put_field<std::uint32_t>(at, e.seq);
    at = put_field<std::uint64_t>(at, e.size);
    at = put_field<std::uint32_t>(at, e.tag);
    at = put_field<std::uint8_t>(at, cts_flags(e));
    at = put_field<std::uint64_t>(at, m.entries[i].address);
    std::memcpy(at, m.keys.data() + i * m.data_rails, 8 * m.data_rails);
    at += 8 * m.data_rails;
  }
  return length;
}

CtsReader::CtsReader(std::span<const std::byte> body) noexcept : body_(body) {
  WireReader r(body);
  count_ = r.u8();
  rails_ = r.u8();
  credits_ = r.u16();
  eager_size_ = r.u32();
  if (!r.ok()) {
    error_ = "clear-to-send truncated";
  } else if (rails_ == 0 || rails_ > kMaxDataRails) {
    error_ = "clear-to-send: rail count out of range";
  } else if (count_ > max_cts_entries(rails_) || (count_ == 0 && credits_ == 0)) {
    error_ = "clear-to-send: entry count out of range";
  } else if ((credits_ != 0 && eager_size_ == 0) || eager_size_ > kMaxEagerBuffer) {
    error_ = "clear-to-send: eager buffer size out of range";
  } else if (body.size() != cts_bytes(count_, rails_)) {
    error_ = "clear-to-send: wrong length";
  } else {
    const std::size_t stride = cts_bytes(1, rails_) - kCtsHeaderBytes;
    for (std::size_t i = 0; i < count_ && error_ == nullptr; ++i) {
      const auto flags =
          std::to_integer<std::uint8_t>(body[kCtsHeaderBytes + i * stride + kCtsFlagOffset]);
      if ((flags & 1u) != 0) error_ = "clear-to-send: unknown flags";
      const unsigned index = (flags >> kCtsGroupIndexShift) & kCtsGroupFieldMask;
      const unsigned size = ((flags >> kCtsGroupSizeShift) & kCtsGroupFieldMask) + 1u;
      if (index >= size) error_ = "clear-to-send: group index beyond the group";
    }
  }
}

// The constructor checked the body's length against count and rails: entries read unchecked.
CtsEntryView CtsReader::entry(std::size_t i) const noexcept {
  const std::size_t stride = cts_bytes(1, rails_) - kCtsHeaderBytes;
  const std::byte* at = body_.data() + kCtsHeaderBytes + i * stride;
  CtsEntryView view;
  Announcement& a = view.announcement;
  a.seq = get_field<std::uint32_t>(at);
  a.size = get_field<std::uint64_t>(at + 4);
  a.tag = get_field<std::uint32_t>(at + 12);
  const auto flags = get_field<std::uint8_t>(at + kCtsFlagOffset);
  a.refused = (flags & kCtsRefused) != 0;
  a.group_index = static_cast<std::uint8_t>((flags >> kCtsGroupIndexShift) & kCtsGroupFieldMask);
  a.group_size =
      static_cast<std::uint8_t>(((flags >> kCtsGroupSizeShift) & kCtsGroupFieldMask) + 1u);
  view.address = get_field<std::uint64_t>(at + kCtsFlagOffset + 1);
  view.keys = at + kCtsEntryFixedBytes;
  return view;
}

const char* decode_cts(std::span<const std::byte> in, ClearToSend& out) {
  const CtsReader reader(in);
  if (reader.error() != nullptr) return reader.error();
  out.count = static_cast<std::uint8_t>(reader.count());
  out.data_rails = static_cast<std::uint8_t>(reader.data_rails());
  out.credits = static_cast<std::uint16_t>(reader.credits());
  out.eager_size = static_cast<std::uint32_t>(reader.eager_size());
  out.keys.resize(reader.count() * reader.data_rails());
  for (std::size_t i = 0; i < reader.count(); ++i) {
    const CtsEntryView view = reader.entry(i);
    out.entries[i] = CtsEntry{.announcement = view.announcement, .address = view.address};
    std::memcpy(out.keys_of(i), view.keys, 8 * reader.data_rails());
  }
  return nullptr;
}

std::size_t encode_rts(const ReadyToSend& m, std::span<std::byte> out) {
  if (m.count == 0 || m.count > kMaxBatch) return 0;
  for (std::size_t i = 0; i < m.count; ++i) {
    if (!stripes_fit(m.entries[i])) return 0;
  }
  WireWriter w(out);
  w.u8(m.count);
  for (std::size_t i = 0; i < m.count; ++i) {
    const RtsEntry& e = m.entries[i];
    w.u32(e.seq);
    w.u64(e.size);
    w.u32(e.tag);
    w.u8(e.stripes);
  }
  return finish(w);
}

const char* decode_rts(std::span<const std::byte> in, ReadyToSend& out) {
  WireReader r(in);
  out.count = r.u8();
  if (!r.ok()) return "ready-to-send truncated";
  if (out.count == 0 || out.count > kMaxBatch) return "ready-to-send: entry count out of range";
  if (in.size() != rts_bytes(out.count)) return "ready-to-send has the wrong length";
  for (std::size_t i = 0; i < out.count; ++i) {
    RtsEntry& e = out.entries[i];
    e.seq = r.u32();
    e.size = r.u64();
    e.tag = r.u32();
    e.stripes = r.u8();
    if (!stripes_fit(e)) return "ready-to-send: stripe count out of range";
  }
  return r.done() ? nullptr : "ready-to-send has the wrong length";
}

}  // namespace loom::p2p
