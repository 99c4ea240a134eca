// Carried control (mux/carried_control.hpp): a receiving communicator's clear-to-sends ride
// inside the eager messages its process sends the other way, and one lost with a receiving
// communicator that closed before it landed is announced again (RecvCommImpl::
// repeat_clearances). LOOM_CARRY_CONTROL=2 carries on every provider, shm included.
#include <algorithm>
#include <chrono>
#include <vector>

#include <catch2/catch.hpp>

#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

using namespace std::chrono_literals;

Config carried_config() {
  Config config = test_config(1);
  config.carry_control = CarryControl::kAlways;
  config.eager_max = 16 * 1024;
  config.eager_credits = 16;
  config.peer_timeout_ms = 2000;  // pings (and the repeat they ask for) every 500 ms
  return config;
}

// A rank's context, connected to the peer's both ways.
struct Ends {
  Context context;
  Listener listener;
  Connector connector;
  CommPair pair;
  Ends(Channel& channel, const Config& config, const std::string& what)
      : context(config),
        listener(context.listen()),
        // Handles cross before either rank connects.
        connector((send_handle(channel, listener.handle()), context.connect(recv_handle(channel)))),
        pair(connect_both(connector, listener, what)) {}
};

// Eager sizes that carry (with the batch beside them they fit in a 4 KiB inject; tcp injects up
// to 15 KiB, so 5000 and 15 KiB carry there too, the latter filling rxm's 16 KiB buffer), an
// eager size that is not injected, and rendezvous ones.
constexpr std::size_t kSizes[] = {0, 1, 8, 100, 1000, 3000, 5000, 15 * 1024, 16 * 1024, 40000};
constexpr std::size_t kRounds = 180;
constexpr std::size_t kLargest = 40000;

std::uint64_t seed(std::size_t round, bool ping) {
  return 900000 + round * 2 + (ping ? 0 : 1);
}

// One rank's side of a ping-pong in which every message is verified and each round's size
// changes; the client pings, the server answers. Both post the next receive before they send.
void ping_pong(Channel& channel, bool client) {
  // Two credits: each message's buffer is granted again at once (half of them), so every round
  // has a batch to carry (a receive within the eager size is not announced: clear_to_send.cpp).
  Config config = carried_config();
  config.eager_credits = 2;
  Ends ends(channel, config, "carried ping-pong connect");
  auto& out = ends.pair.out;
  auto& in = ends.pair.in;
  std::vector<std::byte> send_buffer(kLargest), recv_buffer(kLargest);
  const CloseOnUnwind guard{out.get(), in.get()};
  const MemoryRegion send_region = out->register_memory(send_buffer.data(), kLargest);
  const MemoryRegion recv_region = in->register_memory(recv_buffer.data(), kLargest);
  // Each buffer the size of its message: one above the eager size is announced at once (its
  // sender may write into it), never carried.
  auto post_receive = [&](std::size_t round) {
    RecvBuffer target{recv_buffer.data(), kSizes[round % std::size(kSizes)], Tag(round),
                      recv_region};
    Request r;
    require(post_into(in->irecv({&target, 1}), r) == Status::kOk, in->last_error());
    return r;
  };
  auto send = [&](std::size_t round, std::size_t size, bool ping) {
    fill_pattern({send_buffer.data(), size}, seed(round, ping));
    Request r;
    require(
        post_into(out->isend(send_buffer.data(), size, Tag(round), send_region), r) == Status::kOk,
        out->last_error());
    return r;
  };
  auto check = [&](Request r, std::size_t round, std::size_t size, bool ping) {
    require(finish(*in, r) == size, "round " + std::to_string(round) + ": wrong size");
    const std::string wrong = check_pattern({recv_buffer.data(), size}, seed(round, ping));
    require(wrong.empty(), "round " + std::to_string(round) + ": " + wrong);
  };
  Request next = client ? Request{} : post_receive(0);
  for (std::size_t round = 0; round < kRounds; ++round) {
    const std::size_t size = kSizes[round % std::size(kSizes)];
    if (client) {
      Request reply = post_receive(round);
      Request ping = send(round, size, true);
      finish(*out, ping);
      check(reply, round, size, false);
    } else {
      check(next, round, size, true);
      if (round + 1 < kRounds) next = post_receive(round + 1);
      finish(*out, send(round, size, false));
    }
  }
  const CommStats sent = out->stats();
  const CommStats received = in->stats();
  require(sent.messages == kRounds && received.messages == kRounds, "every message completed");
  // Six sizes in ten leave room for the batch in a 4 KiB inject (eight on tcp): the rounds of
  // at least those carry one each way. The others' batches, and those taken by nobody, go as
  // messages.
  const std::uint64_t carrying = kRounds * 6 / std::size(kSizes);
  require(received.cts_carried >= carrying / 2,
          std::to_string(received.cts_carried) + " clear-to-send batches carried in " +
              std::to_string(carrying) + " rounds that could carry one");
  // A buffer above the eager size (shm's is its 4 KiB inject size) is announced at once, on
  // its own: its message is written. The rest ride more often than not.
  const std::uint64_t announced_at_once = std::min(received.cts_sent, received.rendezvous);
  require(received.cts_carried > received.cts_sent - announced_at_once,
          "fewer batches carried (" + std::to_string(received.cts_carried) + ") than sent (" +
              std::to_string(received.cts_sent) + ", " + std::to_string(announced_at_once) +
              " of them for written messages)");
  std::uint64_t inbox = 0;
  for (const auto& lane : ends.context.stats().lanes) inbox += lane.carried_control;
  require(inbox >= carrying / 2,
          "the send lane took " + std::to_string(inbox) + " control messages from its inbox");
  channel.barrier();
}

// The server closes its receiving communicator; the client then posts a grouped receive of two
// small buffers (announced in a batch, not left quiet) and sends, its message carrying the
// announcement to the closed communicator, where it is lost. The server's first message, above
// the eager size, waits for that announcement: its pings name it, and the client announces it
// again; the message is refused there (too large for its buffer) on both sides, and the second
// one delivered.
void lost_carrier(Channel& channel, bool client) {
  const Config config = carried_config();
  Ends ends(channel, config, "lost carrier connect");
  auto& out = ends.pair.out;
  auto& in = ends.pair.in;
  exchange(*out, *in, client ? 1 : 2, client ? 2 : 1, 64);  // credits granted both ways
  channel.barrier();
  constexpr std::size_t kSize = 8;
  const std::size_t large = config.eager_max + 4096;
  std::vector<std::byte> send_buffer(large), recv_buffer(2 * kSize);
  const CloseOnUnwind guard{out.get(), in.get()};
  fill_pattern(send_buffer, client ? 11 : 12);
  const MemoryRegion send_region = out->register_memory(send_buffer.data(), large);
  if (!client) {
    in->close();
    channel.send_value(1);
    require(channel.recv_value<int>() == 2, "client out of step");
    Request r;
    require(post_into(out->isend(send_buffer.data(), large, 5, send_region), r) == Status::kOk,
            out->last_error());
    // Without the repeat this waits for good: the peer is alive and answers every ping. With
    // it, one ping interval (500 ms) and a round trip.
    finish(*out, r, Status::kTruncated, 20s);
    fill_pattern({send_buffer.data(), kSize}, 13);
    require(post_into(out->isend(send_buffer.data(), kSize, 6, send_region), r) == Status::kOk,
            out->last_error());
    finish(*out, r, Status::kOk, 20s);
    channel.barrier();
    return;
  }
  const MemoryRegion recv_region = in->register_memory(recv_buffer.data(), 2 * kSize);
  require(channel.recv_value<int>() == 1, "server out of step");
  // No progress since the server closed: the send lane has not read the close notice, and the
  // message goes with the group's announcement inside it.
  const std::uint64_t carried_before = in->stats().cts_carried;
  const RecvBuffer group[] = {{recv_buffer.data(), kSize, 5, recv_region},
                              {recv_buffer.data() + kSize, kSize, 6, recv_region}};
  Request receive;
  require(post_into(in->irecv(group), receive) == Status::kOk, in->last_error());
  Request send;
  require(post_into(out->isend(send_buffer.data(), kSize, 5, send_region), send) == Status::kOk,
          out->last_error());
  require(in->stats().cts_carried == carried_before + 1, "the announcement was not carried");
  channel.send_value(2);
  finish(*in, receive, Status::kTruncated, 20s);
  for (std::size_t b = 0; b < kSize; ++b) {
    require(recv_buffer[b] == std::byte{0}, "the refused message wrote into its buffer");
  }
  const std::string wrong = check_pattern({recv_buffer.data() + kSize, kSize}, 13);
  require(wrong.empty(), "the second message: " + wrong);
  // Our message met a closed communicator. Sent ahead on a credit, it was done once it left;
  // else it fails (kPeerError from the close notice, or kError where the provider refused the
  // message for the endpoint that closed with it). Never delivered either way.
  bool done = false;
  Status status = Status::kOk;
  poll_until([&] { return done || status != Status::kOk; },
             [&] { status = test_once(*out, send, done, {}); }, "the send to the closed comm", 20s);
  require(status == Status::kOk || status == Status::kPeerError || status == Status::kError,
          "the send to a closed communicator: " + std::string(to_string(status)) + ": " +
              out->last_error());
  channel.barrier();
}

// Both ranks post a window of receive-then-send pairs on 4 credits, each send carrying the
// announcement of the receive before it: the sends run out of credits while clearances for
// the next ones wait in the inbox, and credits come back carried too. Every byte is checked.
void both_ways(Channel& channel, std::uint64_t me, std::uint64_t peer) {
  Config config = carried_config();
  config.eager_credits = 4;
  Ends ends(channel, config, "both ways connect");
  CommPair& pair = ends.pair;
  constexpr std::size_t kWindow = 48;
  constexpr std::size_t kWindows = 6;
  constexpr std::size_t kSlot = 2048;
  std::vector<std::byte> send_buffer(kWindow * kSlot), recv_buffer(kWindow * kSlot);
  const CloseOnUnwind guard{pair.out.get(), pair.in.get()};
  const MemoryRegion send_region =
      pair.out->register_memory(send_buffer.data(), send_buffer.size());
  const MemoryRegion recv_region = pair.in->register_memory(recv_buffer.data(), recv_buffer.size());
  auto size_of = [](std::size_t message) { return (message * 131) % kSlot; };
  for (std::size_t w = 0; w < kWindows; ++w) {
    std::vector<Request> receives(kWindow), sends(kWindow);
    for (std::size_t i = 0; i < kWindow; ++i) {
      const std::size_t m = w * kWindow + i;
      RecvBuffer target{recv_buffer.data() + i * kSlot, size_of(m), Tag(m), recv_region};
      require(post_into(pair.in->irecv({&target, 1}), receives[i]) == Status::kOk,
              pair.in->last_error());
      std::byte* data = send_buffer.data() + i * kSlot;
      fill_pattern({data, size_of(m)}, me * 100000 + m);
      require(post_into(pair.out->isend(data, size_of(m), Tag(m), send_region), sends[i]) ==
                  Status::kOk,
              pair.out->last_error());
    }
    for (std::size_t i = 0; i < kWindow; ++i) finish(*pair.out, sends[i]);
    for (std::size_t i = 0; i < kWindow; ++i) {
      const std::size_t m = w * kWindow + i;
      require(finish(*pair.in, receives[i]) == size_of(m), "message " + std::to_string(m));
      const std::string wrong =
          check_pattern({recv_buffer.data() + i * kSlot, size_of(m)}, peer * 100000 + m);
      require(wrong.empty(), "message " + std::to_string(m) + ": " + wrong);
    }
    channel.barrier();
  }
}

}  // namespace

TEST_CASE("p2p both ways at once on few credits, clearances carried", "[carried]") {
  const std::string failure =
      run_pair([](Channel& c) { both_ways(c, 1, 2); }, [](Channel& c) { both_ways(c, 2, 1); });
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("p2p clear-to-sends ride on messages going the other way", "[carried]") {
  const std::string failure =
      run_pair([](Channel& c) { ping_pong(c, false); }, [](Channel& c) { ping_pong(c, true); });
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("p2p a clear-to-send carried into a closed communicator is announced again",
          "[carried]") {
  const std::string failure = run_pair([](Channel& c) { lost_carrier(c, false); },
                                       [](Channel& c) { lost_carrier(c, true); });
  INFO(failure);
  REQUIRE(failure.empty());
}

}  // namespace loom::test
