// Connection setup and bad input through the p2p API.
#include <chrono>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

// Both ranks listen, swap handles and connect to each other at once, polling connect and
// accept in turn: neither may wait for the other.
void simultaneous(Channel& channel, std::uint64_t me, std::uint64_t peer) {
  Context context(test_config(1));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  Connector connector = context.connect(recv_handle(channel));
  auto [out, in] = connect_both(connector, listener, "simultaneous connect");
  exchange(*out, *in, me, peer, 100000);
  channel.barrier();
}

}  // namespace

TEST_CASE("p2p both ranks connect to each other simultaneously", "[pair]") {
  auto failure = run_pair([](Channel& c) { simultaneous(c, 1, 2); },
                          [](Channel& c) { simultaneous(c, 2, 1); });
  INFO(failure);
  REQUIRE(failure.empty());
}

// Each connect carries a label (here 40 + i), which both ends' label() give: the receiver
// pairs each accepted communicator with its sender by it, whatever order accept() takes them in.
TEST_CASE("p2p 32 communicators between one pair set up at once", "[pair]") {
  constexpr std::size_t kComms = 32;
  auto receiver = [](Channel& channel) {
    Context context(test_config(1));
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    std::vector<std::unique_ptr<RecvComm>> comms;
    poll_until([&] { return comms.size() == kComms; },
               [&] {
                 if (auto comm = listener.accept()) comms.push_back(std::move(comm));
               },
               "32 accepts");
    // The n-th accepted comm is not necessarily the sender's n-th: its label names it.
    std::vector<bool> labelled(kComms, false);
    for (const auto& comm : comms) {
      const std::uint64_t label = comm->label();
      require(label >= 40 && label < 40 + kComms && !labelled[label - 40],
              "accepted a comm labelled " + std::to_string(label));
      labelled[label - 40] = true;
    }
    std::vector<std::vector<std::byte>> buffers(kComms, std::vector<std::byte>(8192));
    std::vector<Request> requests(kComms);
    std::vector<MemoryRegion> regions(kComms);
    for (std::size_t i = 0; i < kComms; ++i) {
      regions[i] = comms[i]->register_memory(buffers[i].data(), 8192);
      RecvBuffer b{buffers[i].data(), 8192, 9, regions[i]};
      require(post_into(comms[i]->irecv({&b, 1}), requests[i]) == Status::kOk,
              comms[i]->last_error());
    }
    for (std::size_t i = 0; i < kComms; ++i) {
      require(finish(*comms[i], requests[i]) == 8192, "size");
      const std::string wrong = check_pattern(buffers[i], comms[i]->label());
      require(wrong.empty(), "comm labelled " + std::to_string(comms[i]->label()) +
                                 " got another sender's bytes: " + wrong);
    }
    REQUIRE(context.stats().lanes.size() >= 1);
    channel.barrier();
  };
  auto sender = [](Channel& channel) {
    Context context(test_config(1));
    Handle handle = recv_handle(channel);
    std::vector<Connector> connectors;
    for (std::size_t i = 0; i < kComms; ++i) connectors.push_back(context.connect(handle, 40 + i));
    std::vector<std::unique_ptr<SendComm>> comms(kComms);
    std::size_t ready = 0;
    poll_until([&] { return ready == kComms; },
               [&] {
                 for (std::size_t i = 0; i < kComms; ++i) {
                   if (!comms[i] && (comms[i] = connectors[i].poll())) ++ready;
                 }
               },
               "32 connects");
    std::vector<std::vector<std::byte>> buffers(kComms, std::vector<std::byte>(8192));
    std::vector<Request> requests(kComms);
    for (std::size_t i = 0; i < kComms; ++i) {
      require(comms[i]->label() == 40 + i, "a send comm's label is the one its connect gave");
      fill_pattern(buffers[i], 40 + i);
      MemoryRegion region = comms[i]->register_memory(buffers[i].data(), 8192);
      require(post_into(comms[i]->isend(buffers[i].data(), 8192, 9, region), requests[i]) ==
                  Status::kOk,
              comms[i]->last_error());
    }
    for (std::size_t i = 0; i < kComms; ++i) finish(*comms[i], requests[i]);
    channel.barrier();
  };
  auto failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

// With a shared lane, a receiver that posts right after accepting can get its clear-to-send
// processed by the sender (while it tests another communicator of the lane) before the
// sender has seen the accept. The keys in it must not be lost.
TEST_CASE("p2p clear-to-send that arrives before the sender's handshake completes", "[pair]") {
  constexpr std::size_t kLarge = 1 << 20;
  auto receiver = [&](Channel& channel) {
    Context context(test_config(1));  // default grouping: one shared lane
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto first = accept_one(listener);
    auto second = accept_one(listener);
    std::vector<std::byte> large(kLarge), small(64);
    const CloseOnUnwind guard{first.get(), second.get()};
    MemoryRegion large_region = second->register_memory(large.data(), large.size());
    MemoryRegion small_region = first->register_memory(small.data(), small.size());
    RecvBuffer b{large.data(), large.size(), 2, large_region};
    Request on_second;
    require(post_into(second->irecv({&b, 1}), on_second) == Status::kOk, second->last_error());
    RecvBuffer s{small.data(), small.size(), 1, small_region};
    Request on_first;
    require(post_into(first->irecv({&s, 1}), on_first) == Status::kOk, first->last_error());
    require(finish(*second, on_second) == kLarge, "size");
    auto error = check_pattern(large, 909);
    require(error.empty(), error);
    finish(*first, on_first);
    channel.barrier();
  };
  auto sender = [&](Channel& channel) {
    Context context(test_config(1));
    const Handle handle = recv_handle(channel);
    auto first = connect_one(context, handle);
    std::vector<std::byte> small(64), large(kLarge);
    const CloseOnUnwind guard{first.get()};
    fill_pattern(small, 1);
    fill_pattern(large, 909);
    MemoryRegion small_region = first->register_memory(small.data(), small.size());
    Request pending;
    require(post_into(first->isend(small.data(), small.size(), 1, small_region), pending) ==
                Status::kOk,
            first->last_error());
    Connector connector = context.connect(handle);
    std::unique_ptr<SendComm> second = connector.poll();  // sends the connect
    // Drive the shared lane through the first communicator while the second's accept and the
    // receiver's clear-to-send are on their way.
    bool done = false;
    const auto until = std::chrono::steady_clock::now() + 300ms;
    while (std::chrono::steady_clock::now() < until) {
      if (!done) require(test_once(*first, pending, done) == Status::kOk, first->last_error());
    }
    poll_until([&] { return second != nullptr; }, [&] { second = connector.poll(); }, "connect");
    MemoryRegion large_region = second->register_memory(large.data(), large.size());
    Request request;
    require(post_into(second->isend(large.data(), kLarge, 2, large_region), request) == Status::kOk,
            second->last_error());
    finish(*second, request);
    if (!done) finish(*first, pending);
    channel.barrier();
  };
  auto failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("p2p bad handles are refused with a clear error", "[local]") {
  Context context(test_config(1));
  Listener listener = context.listen();
  const Handle good = listener.handle();
  REQUIRE(good.size <= kMaxHandleBytes);

  Handle wrong_magic = good;
  wrong_magic.bytes[0] ^= std::byte{0xFF};
  CHECK_THROWS_WITH(context.connect(wrong_magic), Catch::Contains("wrong magic"));
  Handle wrong_version = good;
  wrong_version.bytes[4] = std::byte{99};
  CHECK_THROWS_WITH(context.connect(wrong_version), Catch::Contains("protocol version"));
  Handle truncated = good;
  truncated.size = good.size - 3;
  CHECK_THROWS_WITH(context.connect(truncated), Catch::Contains("truncated"));
  truncated.size = 5;
  CHECK_THROWS_WITH(context.connect(truncated), Catch::Contains("truncated"));
  std::vector<std::byte> too_long(kMaxHandleBytes + 1);
  CHECK_THROWS_WITH(Handle::from_bytes(too_long), Catch::Contains("longer than a handle"));

  // A wrong nonce gets as far as the listener, which refuses it: an error on both sides, and
  // the legitimate peer still connects afterwards.
  Handle wrong_nonce = good;
  wrong_nonce.bytes[10] ^= std::byte{0x5A};  // inside the nonce (offset 10..17)
  Connector forged = context.connect(wrong_nonce);
  std::string refusal;
  poll_until([&] { return !refusal.empty(); },
             [&] {
               try {
                 (void)forged.poll();
               } catch (const Error& e) {
                 refusal = e.what();
               }
               (void)listener.accept();
             },
             "the refusal");
  CHECK_THAT(refusal, Catch::Contains("wrong nonce"));
  CHECK(listener.stats().refused == 1);
  CHECK_THAT(listener.stats().last_refusal, Catch::Contains("wrong nonce"));

  Connector genuine = context.connect(good);
  auto [out, in] = connect_both(genuine, listener, "the genuine connect");
  exchange(*out, *in, 77, 77, 3000);
  CHECK(listener.stats().accepted == 1);
}

TEST_CASE("p2p bad data-path input gives clear errors and the process and other comms go on",
          "[local]") {
  Context context(test_config(1));
  Listener listener = context.listen();
  Connector connector = context.connect(listener.handle());
  auto [out, in] = connect_both(connector, listener, "connect to self");
  std::vector<std::byte> buffer(1 << 20);
  fill_pattern(buffer, 3);
  MemoryRegion region = out->register_memory(buffer.data(), 4096);
  MemoryRegion in_region = in->register_memory(buffer.data() + 65536, 8192);
  Request request;

  CHECK(post_into(out->isend(buffer.data(), 100, 1, MemoryRegion{}), request) == Status::kInvalid);
  CHECK_THAT(out->last_error(), Catch::Contains("empty memory region"));
  CHECK(!request.valid());
  CHECK(post_into(out->isend(buffer.data() + 65536, 100, 1, in_region), request) ==
        Status::kInvalid);
  CHECK_THAT(out->last_error(), Catch::Contains("registered on another communicator"));
  CHECK(post_into(out->isend(buffer.data() + 4000, 200, 1, region), request) == Status::kInvalid);
  CHECK_THAT(out->last_error(), Catch::Contains("outside its registered region"));
  out->deregister(region);
  CHECK(post_into(out->isend(buffer.data(), 100, 1, region), request) == Status::kInvalid);
  CHECK_THAT(out->last_error(), Catch::Contains("deregistered"));

  RecvBuffer nine[9];
  for (auto& b : nine) b = {buffer.data() + 65536, 16, 1, in_region};
  CHECK(post_into(in->irecv(nine), request) == Status::kInvalid);
  CHECK_THAT(in->last_error(), Catch::Contains("1 to 8 buffers"));
  CHECK(post_into(in->irecv({}), request) == Status::kInvalid);
  // A buffer that starts before its region, or runs past its end, on the receiving side too.
  const RecvBuffer below{buffer.data() + 65536 - 16, 32, 1, in_region};
  CHECK(post_into(in->irecv({&below, 1}), request) == Status::kInvalid);
  CHECK_THAT(in->last_error(), Catch::Contains("outside its registered region"));
  const RecvBuffer past{buffer.data() + 65536 + 8000, 193, 1, in_region};
  CHECK(post_into(in->irecv({&past, 1}), request) == Status::kInvalid);
  CHECK_THAT(in->last_error(), Catch::Contains("outside its registered region"));
  CHECK(!request.valid());

  // Messages larger than the posted buffer fail, eager and rendezvous: on the receiving side,
  // and on the sending side where the message waited for its buffer's announcement (one sent
  // ahead on a credit is judged by its receiver alone, its send done once it left).
  region = out->register_memory(buffer.data(), buffer.size());
  auto sender_verdict = [](SendComm& sender, Request send, std::uint64_t eager_before,
                           Status refusal, const char* why) {
    bool done = false;
    Status status = Status::kOk;
    poll_until([&] { return done; }, [&] { status = test_once(sender, send, done, {}); }, "send",
               60s);
    if (sender.stats().eager != eager_before) {
      CHECK(status == Status::kOk);  // sent ahead
    } else {
      CHECK(status == refusal);
      CHECK_THAT(sender.last_error(), Catch::Contains(why));
    }
  };
  for (std::size_t size : {std::size_t{3000}, std::size_t{600000}}) {
    INFO("message size " << size);
    RecvBuffer small{buffer.data() + 65536, 1000, 4, in_region};
    Request receive;
    Request send;
    const std::uint64_t eager = out->stats().eager;
    REQUIRE(post_into(in->irecv({&small, 1}), receive) == Status::kOk);
    REQUIRE(post_into(out->isend(buffer.data(), size, 4, region), send) == Status::kOk);
    finish(*in, receive, Status::kTruncated);
    CHECK_THAT(in->last_error(), Catch::Contains("larger than the posted buffer"));
    sender_verdict(*out, send, eager, Status::kTruncated, "larger than the peer's posted buffer");
  }
  // A tag mismatch fails alike: into a quiet receive, into a buffer above the eager limit
  // (announced at once), written or empty.
  MemoryRegion large_region = in->register_memory(buffer.data() + 131072, 131072);
  for (const auto& [message, capacity] : {std::pair<std::size_t, std::size_t>{100, 8192},
                                          {100, 32768},
                                          {0, 32768},
                                          {40000, 65536},
                                          {65536, 65536}}) {
    INFO("message " << message << " into a buffer of " << capacity);
    RecvBuffer tagged = capacity <= 8192
                            ? RecvBuffer{buffer.data() + 65536, capacity, 5, in_region}
                            : RecvBuffer{buffer.data() + 131072, capacity, 5, large_region};
    Request receive;
    Request send;
    const std::uint64_t eager = out->stats().eager;
    REQUIRE(post_into(in->irecv({&tagged, 1}), receive) == Status::kOk);
    REQUIRE(post_into(out->isend(buffer.data(), message, 6, region), send) == Status::kOk);
    finish(*in, receive, Status::kInvalid);
    CHECK_THAT(in->last_error(), Catch::Contains("tag"));
    sender_verdict(*out, send, eager, Status::kInvalid, "tag");
  }
  // The pair still works after all that.
  exchange(*out, *in, 11, 11, 5000);

  // A closed communicator refuses work; another one on the same context keeps going.
  Connector second = context.connect(listener.handle());
  auto [out2, in2] = connect_both(second, listener, "second connect");
  out->close();
  CHECK(post_into(out->isend(buffer.data(), 100, 1, region), request) == Status::kInvalid);
  exchange(*out2, *in2, 12, 12, 700000);
  // The peer of the closed comm sees its pending receive fail, not hang.
  RecvBuffer orphan{buffer.data() + 65536, 100, 1, in_region};
  Status posted = post_into(in->irecv({&orphan, 1}), request);
  if (posted == Status::kOk) {
    finish(*in, request, Status::kPeerError);
  } else {
    CHECK(posted == Status::kPeerError);
  }
}

// A handle names its request until test() reported it, never the request that reuses its
// record next (the pool hands records back last-in first-out, so the next post takes it).
TEST_CASE("p2p a finished, foreign or empty request handle is refused, never another request",
          "[local]") {
  Context context(test_config(1));
  Listener listener = context.listen();
  Connector connector = context.connect(listener.handle());
  auto [out, in] = connect_both(connector, listener, "connect to self");
  std::vector<std::byte> sent(256), received(256);
  MemoryRegion send_region = out->register_memory(sent.data(), sent.size());
  MemoryRegion recv_region = in->register_memory(received.data(), received.size());
  RecvBuffer target{received.data(), received.size(), 1, recv_region};

  const Posted first = in->irecv({&target, 1});
  REQUIRE(first.status == Status::kOk);
  REQUIRE(first.request.valid());
  CHECK(in->test(first.request) == Status::kInProgress);  // nothing was sent yet
  fill_pattern(sent, 21);
  Request send;
  REQUIRE(post_into(out->isend(sent.data(), 200, 1, send_region), send) == Status::kOk);
  finish(*out, send);
  REQUIRE(finish(*in, first.request) == 200);
  CHECK(check_pattern({received.data(), 200}, 21).empty());

  CHECK(in->test(first.request) == Status::kInvalid);
  CHECK_THAT(in->last_error(), Catch::Contains("already reported done"));
  const Posted second = in->irecv({&target, 1});  // takes the first one's record
  REQUIRE(second.status == Status::kOk);
  CHECK(second.request != first.request);
  CHECK(in->test(first.request) == Status::kInvalid);
  CHECK(in->wait(first.request, {}, std::chrono::milliseconds(10)) == Status::kInvalid);
  CHECK(out->test(second.request) == Status::kInvalid);
  CHECK_THAT(out->last_error(), Catch::Contains("another communicator"));
  CHECK(in->test(Request{}) == Status::kInvalid);
  CHECK_THAT(in->last_error(), Catch::Contains("empty request handle"));
  CHECK(in->wait(second.request, {}, std::chrono::milliseconds(10)) == Status::kInProgress);

  // The second receive was left alone by all that: it gets its own message.
  fill_pattern(sent, 22);
  REQUIRE(post_into(out->isend(sent.data(), 150, 1, send_region), send) == Status::kOk);
  finish(*out, send);
  REQUIRE(finish(*in, second.request) == 150);
  CHECK(check_pattern({received.data(), 150}, 22).empty());

  // A closed communicator's handles name nothing either.
  const Posted orphan = in->irecv({&target, 1});
  REQUIRE(orphan.status == Status::kOk);
  in->close();
  CHECK(in->test(orphan.request) == Status::kInvalid);
}

namespace {

// Bad messages between two processes: sizes and tags the receiver's buffer refuses, and buffers
// larger than their message. Each side must reach its verdict from what crossed the wire, at
// once (a sender whose message went ahead on a credit has none to reach: its send is done): a
// refusal that needs LOOM_PEER_TIMEOUT_MS (long here) to surface means one side waited for
// something the other never sent. A side whose request ended makes no loom call until the other has
// its verdict too (a barrier after each message): what its request needed must have left by then,
// as for an application that has nothing more to do.
constexpr unsigned kBadInputPeerTimeoutMs = 30000;
constexpr auto kPrompt = std::chrono::seconds(8);

struct BadInput {
  std::size_t message;
  std::size_t buffer;
  Tag send_tag;
  Status expect;
  const char* error;  // in both sides' last_error() when the message is refused
};

constexpr BadInput kBadInputs[] = {
    {3000, 1000, 1, Status::kTruncated, "larger than"},      // eager-sized into an eager buffer
    {600000, 1000, 1, Status::kTruncated, "larger than"},    // rendezvous-sized into one
    {600000, 300000, 1, Status::kTruncated, "larger than"},  // into a buffer written to
    {100, 8192, 6, Status::kInvalid, "tag"},                 // eager, wrong tag
    {40000, 65536, 6, Status::kInvalid, "tag"},              // rendezvous, wrong tag
    {0, 32768, 6, Status::kInvalid, "tag"},                  // empty, wrong tag
    {100, 8192, 1, Status::kOk, ""},                         // buffers larger than the message
    {40000, 65536, 1, Status::kOk, ""},
    {0, 32768, 1, Status::kOk, ""},
    {300000, 300000, 1, Status::kOk, ""},  // and the pair goes on
};
constexpr Tag kBufferTag = 1;

Config bad_input_config() {
  Config config = test_config(1);
  config.peer_timeout_ms = kBadInputPeerTimeoutMs;
  return config;
}

// Waits for `request`; requires `c.expect` within kPrompt and, when refused, `c.error` in the
// error text. Returns the delivered size.
std::size_t expect_verdict(Communicator& comm, Request request, const BadInput& c,
                           const std::string& what,
                           std::optional<std::uint64_t> eager_before = std::nullopt) {
  const auto start = std::chrono::steady_clock::now();
  bool done = false;
  Status status = Status::kOk;
  std::size_t size = 0;
  poll_until([&] { return done; },
             [&] {
               status = test_once(comm, request, done, {&size, 1});
             },
             what, 40s);
  const auto took = std::chrono::steady_clock::now() - start;
  // A refused message counted eager went ahead on a credit (a matched one is refused before it
  // counts): its receiver alone judges it, and its send is done once it left.
  const bool ahead = eager_before && comm.stats().eager != *eager_before;
  const Status expect = ahead ? Status::kOk : c.expect;
  require(status == expect, what + ": " + std::string(to_string(status)) + ", expected " +
                                std::string(to_string(expect)) + ": " + comm.last_error());
  require(expect == Status::kOk || comm.last_error().find(c.error) != std::string::npos,
          what + ": the error does not say why: " + comm.last_error());
  require(took < kPrompt, what + ": the verdict took until the peer timeout");
  return size;
}

std::string describe(const BadInput& c) {
  return std::to_string(c.message) + " B with tag " + std::to_string(c.send_tag) +
         " into a buffer of " + std::to_string(c.buffer) + " B with tag " +
         std::to_string(kBufferTag);
}

void bad_input_receiver(Channel& channel) {
  Context context(bad_input_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  std::vector<std::byte> buffer(300000);
  const CloseOnUnwind guard{in.get()};
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  for (std::size_t i = 0; i < std::size(kBadInputs); ++i) {
    const BadInput& c = kBadInputs[i];
    fill_pattern(buffer, 1000 + i);
    RecvBuffer target{buffer.data(), c.buffer, kBufferTag, region};
    Request receive;
    require(post_into(in->irecv({&target, 1}), receive) == Status::kOk, in->last_error());
    const std::size_t size = expect_verdict(*in, receive, c, "receive of " + describe(c));
    channel.barrier();
    if (c.expect != Status::kOk) continue;
    require(size == c.message, describe(c) + ": delivered " + std::to_string(size) + " B");
    const std::string wrong = check_pattern({buffer.data(), c.message}, i);
    require(wrong.empty(), describe(c) + ": " + wrong);
    // Nothing past the message changed.
    for (std::size_t k = c.message; k < c.buffer; ++k) {
      require(buffer[k] == pattern_byte(1000 + i, k),
              describe(c) + ": byte " + std::to_string(k) + " past the message was written");
    }
  }
}

void bad_input_sender(Channel& channel) {
  Context context(bad_input_config());
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  std::vector<std::byte> buffer(600000);
  const CloseOnUnwind guard{out.get()};
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  for (std::size_t i = 0; i < std::size(kBadInputs); ++i) {
    const BadInput& c = kBadInputs[i];
    fill_pattern(buffer, i);
    const std::uint64_t eager = out->stats().eager;
    Request send;
    require(
        post_into(out->isend(buffer.data(), c.message, c.send_tag, region), send) == Status::kOk,
        out->last_error());
    expect_verdict(*out, send, c, "send of " + describe(c), eager);
    channel.barrier();
  }
}

}  // namespace

TEST_CASE("p2p bad input between two processes fails at once, and the pair goes on",
          "[bad-input]") {
  auto failure = run_pair(bad_input_receiver, bad_input_sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

}  // namespace loom::test
