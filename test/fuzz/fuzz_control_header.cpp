// The header in front of every message on a lane's control rails and the bootstrap endpoint.
#include <algorithm>

#include "fuzz.hpp"
#include "mux/control_channel.hpp"

namespace {

using namespace loom::mux;
using loom::fuzz::require;

bool same(const ControlHeader& a, const ControlHeader& b) {
  return a.type == b.type && a.comm == b.comm && a.length == b.length;
}

void check_decode(std::span<const std::byte> in) {
  const auto header = decode_control_header(in);
  if (!header) return;
  require(in.size() == kControlHeaderBytes + header->length, "the length is the body received");
  std::vector<std::byte> out(kControlHeaderBytes);
  require(encode_control_header(out, *header), "a decoded header re-encodes");
  require(std::equal(out.begin(), out.end(), in.begin()), "re-encoding gives the same bytes");
}

// Encodes a header into `room` bytes; when it fits, the header followed by `length` body bytes
// decodes back to it, and a body one byte shorter or longer is refused.
void check_encode(const ControlHeader& header, std::size_t room) {
  std::vector<std::byte> out(room);
  const bool ok = encode_control_header(out, header);
  require(ok == (room >= kControlHeaderBytes), "the header is encoded exactly when it fits");
  if (!ok) return;
  std::vector<std::byte> message(out.begin(), out.begin() + kControlHeaderBytes);
  message.resize(kControlHeaderBytes + header.length + 1);
  const std::span<const std::byte> whole(message);
  const auto back = decode_control_header(whole.first(message.size() - 1));
  require(back && same(*back, header), "decode(encode(x)) == x");
  require(!decode_control_header(whole), "a longer body than the header says is refused");
  if (header.length != 0) {
    require(!decode_control_header(whole.first(message.size() - 2)),
            "a shorter body than the header says is refused");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = loom::fuzz::as_bytes(data, size);
  check_decode(in);
  loom::fuzz::ByteSource source(in);
  const ControlHeader header{
      .type = source.u8(),
      .comm = source.take<CommId>(),
      .length = static_cast<std::uint16_t>(source.take<std::uint16_t>() % (kMaxControlBody + 1))};
  check_encode(header, loom::fuzz::make_room(source, kControlHeaderBytes));
  return 0;
}
