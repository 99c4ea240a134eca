// The connect message a listener's context receives on its bootstrap endpoint.
#include "fuzz.hpp"

namespace {

using namespace loom::p2p;
using loom::fuzz::ByteSource;

inline constexpr std::size_t kConnectHeaderBytes = 4 + 1 + 4 + 8 + 8 + 4 + 1 + 8;

bool same(const ConnectMessage& a, const ConnectMessage& b) {
  return a.magic == b.magic && a.version == b.version && a.listener == b.listener &&
         a.nonce == b.nonce && a.context == b.context && a.connect_id == b.connect_id &&
         a.kind == b.kind && a.label == b.label && a.reply_to == b.reply_to &&
         loom::fuzz::same(a.lane, b.lane);
}

// Magic and version are not the decoder's to check: the listener answers them with a reject.
bool fits(const ConnectMessage& m) {
  return !m.reply_to.empty() && m.reply_to.size() <= kMaxAddressBytes &&
         loom::fuzz::lane_fits(m.lane);
}

ConnectMessage make_connect(ByteSource& s, bool& valid) {
  ConnectMessage m;
  m.magic = s.take<std::uint32_t>();
  m.version = s.u8();
  m.listener = s.take<std::uint32_t>();
  m.nonce = s.take<std::uint64_t>();
  m.context = s.take<std::uint64_t>();
  m.connect_id = s.take<std::uint32_t>();
  // Two-sided, one-sided, or a kind no peer knows (the decoder refuses it).
  const std::uint8_t kind = s.u8() % 3;
  valid = valid && kind <= static_cast<std::uint8_t>(ConnectionKind::kOneSided);
  m.kind = static_cast<ConnectionKind>(kind);
  m.label = s.take<std::uint64_t>();
  m.reply_to = loom::fuzz::make_address(s, valid);
  m.lane = loom::fuzz::make_lane(s, valid);
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = loom::fuzz::as_bytes(data, size);
  ByteSource source(in);
  bool valid = true;
  const ConnectMessage value = make_connect(source, valid);
  loom::fuzz::check_decode(in, value, decode_connect, encode_connect, same, fits);
  const std::size_t expected =
      kConnectHeaderBytes + 1 + value.reply_to.size() + loom::fuzz::wire_size(value.lane);
  loom::fuzz::check_encode(value, valid, expected, loom::fuzz::make_room(source, expected),
                           decode_connect, encode_connect, same);
  return 0;
}
