// The listen handle: bytes a peer passes out of band and connect() decodes.
#include "fuzz.hpp"

namespace {

using namespace loom::p2p;

bool same(const HandleData& a, const HandleData& b) {
  return a.listener == b.listener && a.nonce == b.nonce && a.context == b.context &&
         a.addresses == b.addresses;
}

bool fits(const HandleData& h) {
  return loom::fuzz::addresses_fit(h.addresses, kMaxHandleAddresses);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = loom::fuzz::as_bytes(data, size);
  loom::fuzz::ByteSource source(in);
  bool valid = true;
  HandleData value{.listener = source.take<std::uint32_t>(),
                   .nonce = source.take<std::uint64_t>(),
                   .context = source.take<std::uint64_t>(),
                   .addresses = loom::fuzz::make_addresses(source, kMaxHandleAddresses, valid)};
  loom::fuzz::check_decode(in, value, decode_handle, encode_handle, same, fits);
  const std::size_t expected = kHandleHeaderBytes + loom::fuzz::wire_size(value.addresses);
  loom::fuzz::check_encode(value, valid, expected, loom::fuzz::make_room(source, expected),
                           decode_handle, encode_handle, same);
  return 0;
}
