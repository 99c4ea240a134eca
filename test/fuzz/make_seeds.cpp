// Writes the seed corpus (test/fuzz/corpus/<target>/<name>) from loom's own encoders, or with
// --check verifies that the committed seeds are still what the encoders produce, so a change of
// the wire format is noticed and the seeds regenerated:
//   fuzz_seeds test/fuzz/corpus            (from the source root: rewrite the seeds)
//   fuzz_seeds --check test/fuzz/corpus    (the fuzz-seeds test)
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mux/carried_control.hpp"
#include "mux/control_channel.hpp"
#include "p2p/messages.hpp"
#include "p2p/rma_descriptor.hpp"

namespace {

using namespace loom::p2p;
using Bytes = std::vector<std::byte>;

struct Seed {
  std::string path;  // <target>/<name>
  Bytes bytes;
};

EndpointName address(std::size_t n, std::uint8_t first) {
  EndpointName a(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = std::byte(first + i);
  return a;
}

std::vector<EndpointName> addresses(std::size_t count, std::size_t n) {
  std::vector<EndpointName> out;
  for (std::size_t i = 0; i < count; ++i)
    out.push_back(address(n, static_cast<std::uint8_t>(16 * i)));
  return out;
}

LaneAddresses lane(std::size_t data, std::size_t control, std::size_t n) {
  return {.lane = 7, .comm = 3, .data = addresses(data, n), .control = addresses(control, n)};
}

template <typename T, typename Encode>
Bytes encoded(const T& value, Encode encode) {
  Bytes out(4096);
  const std::size_t n = encode(value, std::span<std::byte>(out));
  if (n == 0) {
    std::fprintf(stderr, "fuzz_seeds: an encoder refused a seed value\n");
    std::exit(1);
  }
  out.resize(n);
  return out;
}

Bytes control(std::uint8_t type, const Bytes& body) {
  Bytes out(loom::mux::kControlHeaderBytes);
  loom::mux::encode_control_header(
      out, {.type = type, .comm = 5, .length = static_cast<std::uint16_t>(body.size())});
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

ClearToSend cts(std::uint8_t count, std::uint8_t rails) {
  ClearToSend m{.count = count,
                .data_rails = rails,
                .credits = static_cast<std::uint16_t>(count % 2 == 0 ? 16 : 0),
                .eager_size = count % 2 == 0 ? 16384u : 0u,
                .entries = {}};
  for (std::uint8_t i = 0; i < count; ++i) {
    // Up to kMaxParts entries: one grouped receive; more: receives of one buffer each.
    const bool grouped = count <= kMaxParts;
    m.entries[i] = {.announcement = {.seq = 100u + i,
                                     .size = 1u << 20,
                                     .tag = 9u + i % 2,
                                     .refused = i % 3 == 2,
                                     .group_index = grouped ? i : std::uint8_t{0},
                                     .group_size = grouped ? count : std::uint8_t{1}},
                    .address = 0x10000};
    for (std::uint8_t k = 0; k < rails; ++k) m.keys.push_back(0xabc0u + k);
  }
  return m;
}

std::vector<Seed> seeds() {
  std::vector<Seed> s;
  auto handle = [](std::size_t count, std::size_t n) {
    return encoded(HandleData{.listener = 1,
                              .nonce = 0x0123456789abcdef,
                              .context = 2,
                              .addresses = addresses(count, n)},
                   encode_handle);
  };
  s.push_back({"handle/one-sockaddr-in", handle(1, 16)});
  s.push_back({"handle/two-subnets", handle(2, 16)});
  s.push_back({"handle/four-short", handle(4, 4)});
  s.push_back({"handle/longest-address", handle(1, kMaxAddressBytes)});

  auto connect = [](std::size_t data, std::size_t ctrl, std::size_t n,
                    ConnectionKind kind = ConnectionKind::kTwoSided) {
    ConnectMessage m{.listener = 1,
                     .nonce = 42,
                     .context = 3,
                     .connect_id = 4,
                     .kind = kind,
                     .label = 7,
                     .reply_to = address(16, 200),
                     .lane = lane(data, ctrl, n)};
    return encoded(m, encode_connect);
  };
  s.push_back({"connect/one-rail", connect(1, 1, 16)});
  s.push_back({"connect/four-data-two-control", connect(4, 2, 16)});
  s.push_back({"connect/most-rails", connect(kMaxDataRails, kMaxControlRails, 8)});
  s.push_back({"connect/one-sided", connect(2, 1, 16, ConnectionKind::kOneSided)});

  auto accept = [](std::size_t data, std::size_t ctrl) {
    return encoded(AcceptMessage{.connect_id = 4, .context = 5, .lane = lane(data, ctrl, 16)},
                   encode_accept);
  };
  s.push_back({"accept_reject/accept-one-rail", accept(1, 1)});
  s.push_back({"accept_reject/accept-two-data", accept(2, 1)});
  s.push_back(
      {"accept_reject/reject-bad-nonce",
       encoded(RejectMessage{.connect_id = 4, .reason = RejectReason::kBadNonce}, encode_reject)});
  s.push_back({"accept_reject/reject-setup-failed",
               encoded(RejectMessage{.connect_id = 4, .reason = RejectReason::kSetupFailed},
                       encode_reject)});

  auto rts = [](std::initializer_list<RtsEntry> entries) {
    ReadyToSend m;
    for (const RtsEntry& e : entries) m.entries[m.count++] = e;
    return encoded(m, encode_rts);
  };
  s.push_back({"cts_rts/cts-one-part-one-rail", encoded(cts(1, 1), encode_cts)});
  s.push_back({"cts_rts/cts-two-parts-four-rails", encoded(cts(2, 4), encode_cts)});
  s.push_back({"cts_rts/cts-most-parts-two-rails", encoded(cts(kMaxParts, 2), encode_cts)});
  s.push_back({"cts_rts/cts-batch-one-rail", encoded(cts(max_cts_entries(1), 1), encode_cts)});
  s.push_back(
      {"cts_rts/rts-two-stripes", rts({{.seq = 7, .size = 1u << 24, .tag = 1, .stripes = 2}})});
  s.push_back(
      {"cts_rts/rts-most-stripes", rts({{.seq = 8, .size = 1u << 30, .tag = 2, .stripes = 8}})});
  s.push_back({"cts_rts/rts-batch", rts({{.seq = 9, .size = 65536, .tag = 3, .stripes = 1},
                                         {.seq = 10, .size = 1u << 20, .tag = 4, .stripes = 4},
                                         {.seq = 11, .size = 100000, .tag = 5, .stripes = 1},
                                         {.seq = 12, .size = 0, .tag = 6, .stripes = 0}})});

  s.push_back(
      {"control_header/close", control(static_cast<std::uint8_t>(MessageType::kClose),
                                       encoded(CloseNotice{.complete_below = 12}, encode_close))});
  CloseNotice out_of_order{.complete_below = 4096, .span = 20};
  out_of_order.set_finished(3);
  out_of_order.set_finished(19);
  s.push_back({"cts_rts/close", encoded(out_of_order, encode_close)});
  s.push_back(
      {"control_header/rts", control(static_cast<std::uint8_t>(MessageType::kReadyToSend),
                                     rts({{.seq = 7, .size = 1u << 24, .tag = 1, .stripes = 2}}))});
  s.push_back({"control_header/cts", control(static_cast<std::uint8_t>(MessageType::kClearToSend),
                                             encoded(cts(1, 2), encode_cts))});

  // Carriers: 8 payload bytes and a clear-to-send, the trailer naming lane 7; then the same
  // padded as tcp pads it.
  for (const std::size_t padding : {std::size_t{0}, std::size_t{170}}) {
    Bytes carrier = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4},
                     std::byte{5}, std::byte{6}, std::byte{7}, std::byte{8}};
    const Bytes message = control(static_cast<std::uint8_t>(MessageType::kClearToSend),
                                  encoded(cts(1, 1), encode_cts));
    carrier.insert(carrier.end(), message.begin(), message.end());
    carrier.resize(carrier.size() + padding + loom::mux::kCarrierTrailerBytes);
    loom::mux::encode_carrier_trailer(
        {carrier.data() + carrier.size() - loom::mux::kCarrierTrailerBytes,
         loom::mux::kCarrierTrailerBytes},
        7, message.size(), padding);
    s.push_back(
        {padding == 0 ? "carrier/cts-after-8-bytes" : "carrier/cts-after-8-bytes-padded", carrier});
  }
  // 8 payload bytes padded as tcp pads a small message with nothing to carry.
  Bytes padded(8 + 234 + loom::mux::kCarrierTrailerBytes);
  for (std::size_t i = 0; i < 8; ++i) padded[i] = std::byte(i + 1);
  loom::mux::encode_carrier_trailer(
      {padded.data() + padded.size() - loom::mux::kCarrierTrailerBytes,
       loom::mux::kCarrierTrailerBytes},
      0, 0, 234);
  s.push_back({"carrier/padding-alone", padded});
  s.push_back({"control_header/ping-awaiting",
               control(static_cast<std::uint8_t>(MessageType::kPing),
                       encoded(Ping{.awaiting = true, .oldest_awaiting = 77}, encode_ping))});
  s.push_back({"control_header/ask-clearance",
               control(static_cast<std::uint8_t>(MessageType::kAskClearance),
                       encoded(AskClearance{.from = 70, .until = 78}, encode_ask_clearance))});
  s.push_back({"cts_rts/ask-clearance",
               encoded(AskClearance{.from = 0xFFFFFFF0u, .until = 4}, encode_ask_clearance)});

  auto descriptor = [](std::uint8_t rails) {
    RegionDescriptor d{.context = 0x1122334455667788,
                       .lane = 3,
                       .slot = 5,
                       .generation = 1,
                       .address = 0x7f0000001000,
                       .size = 64u << 20,
                       .rails = rails,
                       .keys = {}};
    for (std::uint8_t i = 0; i < rails; ++i) d.keys[i] = 0x1000u + i;
    return encoded(d, encode_descriptor);
  };
  s.push_back({"descriptor/one-rail", descriptor(1)});
  s.push_back({"descriptor/four-rails", descriptor(4)});
  s.push_back({"descriptor/most-rails", descriptor(kMaxDataRails)});

  // fuzz_wire reads a buffer size, bytes, then operations; a counting pattern exercises them all.
  Bytes counting(160);
  for (std::size_t i = 0; i < counting.size(); ++i) counting[i] = std::byte(i * 37 + 11);
  s.push_back({"wire/pattern", counting});
  return s;
}

Bytes read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> chars{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  Bytes out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::strcmp(argv[1], "--check") == 0;
  if (argc != 2 && !check) {
    std::fprintf(stderr, "usage: %s [--check] CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[argc - 1];
  int stale = 0;
  for (const Seed& seed : seeds()) {
    const auto path = root / seed.path;
    if (check) {
      if (!std::filesystem::exists(path) || read_file(path) != seed.bytes) {
        std::fprintf(stderr, "fuzz_seeds: %s is missing or not what the encoders write now\n",
                     path.c_str());
        ++stale;
      }
      continue;
    }
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(seed.bytes.data()),
               static_cast<std::streamsize>(seed.bytes.size()));
  }
  if (stale != 0) {
    std::fprintf(stderr,
                 "fuzz_seeds: regenerate them from the source root with "
                 "`<build>/test/fuzz/fuzz_seeds test/fuzz/corpus`\n");
    return 1;
  }
  return 0;
}
