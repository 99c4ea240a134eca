// A peer that dies (SIGKILL) while the survivor waits on it: during connect, during an eager
// receive, during a rendezvous receive and during a rendezvous send. Every pending request
// fails with kPeerError within a bounded time (LOOM_PEER_TIMEOUT_MS, short here), the survivor
// closes cleanly, and its context goes on to carry verified bytes on new communicators.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <signal.h>

#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

constexpr unsigned kPeerTimeoutMs = 1500;
constexpr std::size_t kLarge = 4u << 20;  // rendezvous, several stripes
// Detection takes at most the timeout plus a ping interval; the rest is slack for sanitizers.
constexpr auto kBound = std::chrono::milliseconds(3 * kPeerTimeoutMs);

Config failure_config() {
  Config config = test_config(2);
  config.peer_timeout_ms = kPeerTimeoutMs;
  return config;
}

[[noreturn]] void die() {
  std::fflush(nullptr);
  ::raise(SIGKILL);
  std::abort();
}

// Waits for `request`, which must fail with kPeerError within kBound of `since`.
void expect_peer_error(Communicator& comm, Request request,
                       std::chrono::steady_clock::time_point since, const char* what) {
  bool done = false;
  Status status = Status::kOk;
  poll_until([&] { return done || status != Status::kOk; },
             [&] { status = test_once(comm, request, done, {}); }, what, 30s);
  const auto took = std::chrono::steady_clock::now() - since;
  std::fprintf(
      stderr, "%s: %s after %lld ms: %s\n", what, std::string(to_string(status)).c_str(),
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
      comm.last_error().c_str());
  require(
      status == Status::kPeerError,
      std::string(what) + ": status " + std::string(to_string(status)) + ": " + comm.last_error());
  require(took < kBound, std::string(what) + ": the failure took longer than the bound");
}

// The survivor's context still works: a fresh pair of communicators on it moves bytes.
void still_works(Context& context) {
  Listener listener = context.listen();
  Connector connector = context.connect(listener.handle());
  auto [out, in] = connect_both(connector, listener, "a new pair after the peer died");
  exchange(*out, *in, 31, 31, 300000);
}

enum class Phase { kEagerReceive, kRendezvousReceive, kRendezvousSend };

// The survivor listens and receives (or sends); the child connects and dies at `phase`.
void survivor(Channel& channel, Phase phase) {
  Context context(failure_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  std::vector<std::byte> buffer(2 * kLarge);
  const CloseOnUnwind guard{in.get()};
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  // The child connects back so the survivor also has a send comm to it.
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  MemoryRegion out_region = out->register_memory(buffer.data(), buffer.size());

  Request first;
  Request second;
  const std::size_t size = phase == Phase::kEagerReceive ? 1000 : kLarge;
  if (phase == Phase::kRendezvousSend) {
    fill_pattern(buffer, 5);
    require(post_into(out->isend(buffer.data(), size, 1, out_region), first) == Status::kOk,
            out->last_error());
    require(post_into(out->isend(buffer.data(), size, 2, out_region), second) == Status::kOk,
            out->last_error());
  } else {
    RecvBuffer a{buffer.data(), size, 1, region};
    RecvBuffer b{buffer.data() + size, size / 2, 2, region};
    require(post_into(in->irecv({&a, 1}), first) == Status::kOk, in->last_error());
    require(post_into(in->irecv({&b, 1}), second) == Status::kOk, in->last_error());
  }
  channel.send_value(1);  // posted: the child may go on and die
  (void)channel.recv_value<int>();
  Communicator& comm = phase == Phase::kRendezvousSend ? static_cast<Communicator&>(*out)
                                                       : static_cast<Communicator&>(*in);
  // The child is dead once the channel closes; the clock starts there.
  const auto since = std::chrono::steady_clock::now();
  expect_peer_error(comm, first, since, "first request");
  expect_peer_error(comm, second, since, "second request");
  Request late;
  if (phase == Phase::kRendezvousSend) {
    require(post_into(out->isend(buffer.data(), 10, 3, out_region), late) == Status::kPeerError,
            "isend to a dead peer: " + out->last_error());
  } else {
    RecvBuffer c{buffer.data(), 10, 3, region};
    require(post_into(in->irecv({&c, 1}), late) == Status::kPeerError,
            "irecv from a dead peer: " + in->last_error());
  }
  out->close();
  in->close();
  still_works(context);
}

void doomed(Channel& channel, Phase phase) {
  Context context(failure_config());
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  require(channel.recv_value<int>() == 1, "survivor out of step");
  std::vector<std::byte> buffer(kLarge);
  const CloseOnUnwind guard{in.get()};
  fill_pattern(buffer, 9);
  if (phase == Phase::kRendezvousReceive) {
    // Start the first rendezvous message and die with it in flight.
    MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
    Request request;
    require(post_into(out->isend(buffer.data(), buffer.size(), 1, region), request) == Status::kOk,
            out->last_error());
    bool done = false;
    for (int i = 0; i < 50 && !done; ++i) (void)test_once(*out, request, done, {});
  } else if (phase == Phase::kRendezvousSend) {
    // Clear one buffer to send into, then die before the data lands.
    MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
    RecvBuffer target{buffer.data(), buffer.size(), 1, region};
    Request request;
    require(post_into(in->irecv({&target, 1}), request) == Status::kOk, in->last_error());
  }
  channel.send_value(1);
  die();
}

}  // namespace

TEST_CASE("p2p a peer killed during an eager receive fails the survivor's requests in bounds",
          "[peer-failure]") {
  auto failure = run_pair([](Channel& c) { survivor(c, Phase::kEagerReceive); },
                          [](Channel& c) { doomed(c, Phase::kEagerReceive); });
  INFO(failure);
  CHECK(failure.find("killed by signal 9") != std::string::npos);
  CHECK(failure.find("parent failed") == std::string::npos);
}

TEST_CASE("p2p a peer killed during a rendezvous receive fails the survivor's requests in bounds",
          "[peer-failure]") {
  auto failure = run_pair([](Channel& c) { survivor(c, Phase::kRendezvousReceive); },
                          [](Channel& c) { doomed(c, Phase::kRendezvousReceive); });
  INFO(failure);
  CHECK(failure.find("killed by signal 9") != std::string::npos);
  CHECK(failure.find("parent failed") == std::string::npos);
}

TEST_CASE("p2p a peer killed during a rendezvous send fails the survivor's requests in bounds",
          "[peer-failure]") {
  auto failure = run_pair([](Channel& c) { survivor(c, Phase::kRendezvousSend); },
                          [](Channel& c) { doomed(c, Phase::kRendezvousSend); });
  INFO(failure);
  CHECK(failure.find("killed by signal 9") != std::string::npos);
  CHECK(failure.find("parent failed") == std::string::npos);
}

// The other side of the bound: a live peer is never taken as dead. The clock is read at the
// liveness checks only, so what happened between two of them (a wait began, the peer was heard
// from) must count as of the next check, not as of the last one.
TEST_CASE("p2p a live peer is not taken as dead after an idle spell or during a long wait",
          "[peer-failure]") {
  constexpr unsigned kShortTimeoutMs = 300;
  Config config = test_config();
  config.peer_timeout_ms = kShortTimeoutMs;
  Context context(config);
  Listener listener = context.listen();
  Connector connector = context.connect(listener.handle());
  auto [out, in] = connect_both(connector, listener, "a pair to itself");
  exchange(*out, *in, 41, 41, 1000);

  // Idle (nothing pending, nothing polled) for three timeouts: the silence did not count.
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kShortTimeoutMs));
  exchange(*out, *in, 42, 42, 1000);

  // A receive that waits three timeouts for its message: the peer answers the pings meanwhile.
  std::vector<std::byte> sent(1000), received(1000);
  fill_pattern(sent, 43);
  MemoryRegion send_region = out->register_memory(sent.data(), sent.size());
  MemoryRegion recv_region = in->register_memory(received.data(), received.size());
  RecvBuffer target{received.data(), received.size(), 1, recv_region};
  Request receive;
  require(post_into(in->irecv({&target, 1}), receive) == Status::kOk, in->last_error());
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(3 * kShortTimeoutMs);
  while (std::chrono::steady_clock::now() < until) {
    bool done = false;
    require(test_once(*in, receive, done, {}) == Status::kOk,
            "a live peer taken as dead: " + in->last_error());
    require(!done, "a receive finished with nothing sent");
  }
  Request send;
  require(post_into(out->isend(sent.data(), sent.size(), 1, send_region), send) == Status::kOk,
          out->last_error());
  finish(*out, send);
  require(finish(*in, receive) == sent.size(), "wrong size");
  const std::string error = check_pattern(received, 43);
  require(error.empty(), error);
  out->deregister(send_region);
  in->deregister(recv_region);
  out->close();
  in->close();
}

TEST_CASE("p2p a listener killed before accepting fails the connect in bounds", "[peer-failure]") {
  auto failure = run_pair(
      [](Channel& channel) {
        Config config = failure_config();
        config.connect_timeout_ms = kPeerTimeoutMs;
        Context context(config);
        const Handle handle = recv_handle(channel);
        (void)channel.recv_value<int>();  // the listener is dead now
        const auto since = std::chrono::steady_clock::now();
        std::string error;
        try {
          connect_one(context, handle, 30s);
        } catch (const Error& e) {
          error = e.what();
        }
        std::fprintf(stderr, "connect to a dead listener: %s\n", error.c_str());
        require(!error.empty(), "connect to a dead listener succeeded");
        require(std::chrono::steady_clock::now() - since < kBound, "connect failed too late");
        still_works(context);
      },
      [](Channel& channel) {
        Context context(failure_config());
        Listener listener = context.listen();
        send_handle(channel, listener.handle());
        channel.send_value(1);
        die();
      });
  INFO(failure);
  CHECK(failure.find("killed by signal 9") != std::string::npos);
  CHECK(failure.find("parent failed") == std::string::npos);
}

}  // namespace loom::test
