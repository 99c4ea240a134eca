// The listener's answers a connector receives on its bootstrap endpoint: accept and reject.
// Every input goes through both decoders.
#include "fuzz.hpp"

namespace {

using namespace loom::p2p;
using loom::fuzz::ByteSource;

inline constexpr std::size_t kAcceptHeaderBytes = 4 + 8;
inline constexpr std::size_t kRejectBytes = 4 + 1;

bool same_accept(const AcceptMessage& a, const AcceptMessage& b) {
  return a.connect_id == b.connect_id && a.context == b.context && loom::fuzz::same(a.lane, b.lane);
}
bool accept_fits(const AcceptMessage& m) {
  return loom::fuzz::lane_fits(m.lane);
}

bool same_reject(const RejectMessage& a, const RejectMessage& b) {
  return a.connect_id == b.connect_id && a.reason == b.reason;
}
bool reject_fits(const RejectMessage& m) {
  const auto reason = static_cast<std::uint8_t>(m.reason);
  return reason >= 1 && reason <= static_cast<std::uint8_t>(RejectReason::kSetupFailed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = loom::fuzz::as_bytes(data, size);
  ByteSource source(in);
  bool valid = true;
  AcceptMessage accept{.connect_id = source.take<std::uint32_t>(),
                       .context = source.take<std::uint64_t>(),
                       .lane = loom::fuzz::make_lane(source, valid)};
  RejectMessage reject{.connect_id = source.take<std::uint32_t>(),
                       .reason = static_cast<RejectReason>(source.u8())};

  loom::fuzz::check_decode(in, accept, decode_accept, encode_accept, same_accept, accept_fits);
  loom::fuzz::check_decode(in, reject, decode_reject, encode_reject, same_reject, reject_fits);
  // Printing any reason a peer sent must be safe.
  loom::fuzz::require(to_string(reject.reason) != nullptr, "every reason has a text");

  const std::size_t expected = kAcceptHeaderBytes + loom::fuzz::wire_size(accept.lane);
  loom::fuzz::check_encode(accept, valid, expected, loom::fuzz::make_room(source, expected),
                           decode_accept, encode_accept, same_accept);
  loom::fuzz::check_encode(reject, reject_fits(reject), kRejectBytes,
                           loom::fuzz::make_room(source, kRejectBytes), decode_reject,
                           encode_reject, same_reject);
  return 0;
}
