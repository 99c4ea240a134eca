// A peer killed (SIGKILL), from the survivor's side. Its requests end kOk only if every byte
// arrived (checked here, byte by byte, with the delivered size), else with kPeerError within
// LOOM_PEER_TIMEOUT_MS (short here): never a hang, never kOk for bytes that did not arrive, and
// nothing that had arrived reported failed.
// - [peer-failure]: the peer dies during connect, an eager receive, a rendezvous receive or a
//   rendezvous send; every pending request fails, the survivor closes cleanly and its context
//   carries verified bytes on new communicators. And the other side of the bound: a live peer
//   is never taken as dead.
// - [death]: a sender or receiver killed in the middle of a 64 MiB rendezvous, and the death
//   table (README, Failures) cell by cell.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

// The doomed process's end, once what it printed went out.
[[noreturn]] void die() {
  std::fflush(nullptr);
  ::raise(SIGKILL);
  std::abort();
}

// ---- A peer killed while the survivor waits on it ([peer-failure]) ----
//
// Two data rails and a shorter peer timeout than the [death] cases below.
namespace waiting {

constexpr unsigned kPeerTimeoutMs = 1500;
constexpr std::size_t kLarge = 4u << 20;  // rendezvous, several stripes
// Detection takes at most the timeout plus a ping interval; the rest is slack for sanitizers.
constexpr auto kBound = std::chrono::milliseconds(3 * kPeerTimeoutMs);

Config failure_config() {
  Config config = test_config(2);
  config.peer_timeout_ms = kPeerTimeoutMs;
  return config;
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
// from) must count as of the next check, not as of the last one; and a spell in which this side
// made no checks (it pinged nobody) does not count as the peer's silence.
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
  // The application does other work for three timeouts with the receive pending (or this
  // process gets no CPU): its own silence sent no pings, so the peer's proves nothing yet.
  // (512 tests: at least one liveness check, which runs every 256th.)
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kShortTimeoutMs));
  for (int i = 0; i < 512; ++i) {
    bool done = false;
    require(test_once(*in, receive, done, {}) == Status::kOk,
            "a live peer taken as dead after this side's own silence: " + in->last_error());
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

}  // namespace waiting

// ---- A sender or receiver killed during a 64 MiB rendezvous ([death]) ----

constexpr unsigned kPeerTimeoutMs = 2000;
constexpr std::size_t kHuge = 64u << 20;
// A failure comes at most LOOM_PEER_TIMEOUT_MS after the peer's last sign of life, which
// came before its death; the margin covers a sanitized build on two busy cores.
constexpr auto kBound = std::chrono::milliseconds(kPeerTimeoutMs + 1500);

Config death_config() {
  Config config = test_config(1);
  config.peer_timeout_ms = kPeerTimeoutMs;
  return config;
}

std::uint64_t bytes_written(const Context& context) {
  std::uint64_t bytes = 0;
  for (const auto& lane : context.stats().lanes)
    for (const auto& rail : lane.rails) bytes += rail.bytes_written;
  return bytes;
}

// The receiving side of a connection from the peer, with one receive posted into `buffer`.
struct PostedReceive {
  Context context{death_config()};
  Listener listener = context.listen();
  std::unique_ptr<RecvComm> in;
  Request receive;

  PostedReceive(Channel& channel, std::vector<std::byte>& buffer) {
    send_handle(channel, listener.handle());
    in = accept_one(listener);
    MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
    RecvBuffer target{buffer.data(), buffer.size(), 1, region};
    require(post_into(in->irecv({&target, 1}), receive) == Status::kOk, in->last_error());
  }
  // Tests the receive for `how_long`, or until it finished, while the data flows.
  void test_for(std::chrono::milliseconds how_long) {
    bool done = false;
    const auto until = std::chrono::steady_clock::now() + how_long;
    while (!done && std::chrono::steady_clock::now() < until)
      (void)test_once(*in, receive, done, {});
  }
};

// Receives one 64 MiB message from a sender that kills itself once its writes are posted.
void surviving_receiver(Channel& channel) {
  std::vector<std::byte> buffer(kHuge);
  fill_pattern(buffer, 1);  // not the sender's pattern
  PostedReceive posted(channel, buffer);
  RecvComm* in = posted.in.get();
  Request receive = posted.receive;
  channel.send_value(1);
  bool done = false;
  Status status = Status::kOk;
  std::size_t size = 0;
  std::chrono::steady_clock::time_point died{};
  poll_until([&] { return done; },
             [&] {
               status = test_once(*in, receive, done, {&size, 1});
               if (died == std::chrono::steady_clock::time_point{} && channel.readable()) {
                 died = std::chrono::steady_clock::now();
               }
             },
             "the receive", 60s);
  const std::string error = status == Status::kOk ? check_pattern(buffer, 7) : "";
  std::fprintf(stderr, "receive from a killed sender: %s, %zu bytes, %s%s\n",
               std::string(to_string(status)).c_str(), size, in->last_error().c_str(),
               error.c_str());
  if (status == Status::kOk) {
    require(size == kHuge, "kOk with " + std::to_string(size) + " bytes delivered");
    require(error.empty(), "kOk for bytes that did not arrive: " + error);
  } else {
    require(status == Status::kPeerError,
            "the receive ended " + std::string(to_string(status)) + ": " + in->last_error());
    require(died == std::chrono::steady_clock::time_point{} ||
                std::chrono::steady_clock::now() - died < kBound,
            "the failure took longer than the bound");
  }
}

void dying_sender(Channel& channel) {
  std::vector<std::byte> buffer(kHuge);
  fill_pattern(buffer, 7);
  Context context(death_config());
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  require(channel.recv_value<int>() == 1, "receiver out of step");
  Request send;
  require(post_into(out->isend(buffer.data(), buffer.size(), 1, region), send) == Status::kOk,
          out->last_error());
  bool done = false;
  poll_until([&] { return done || bytes_written(context) != 0; },
             [&] { (void)test_once(*out, send, done, {}); }, "the writes to be posted", 60s);
  for (int i = 0; i < 20 && !done; ++i) (void)test_once(*out, send, done, {});
  die();
}

TEST_CASE("p2p a sender killed during a 64 MiB rendezvous never yields kOk for missing bytes",
          "[death]") {
  auto failure = run_pair(surviving_receiver, dying_sender);
  INFO(failure);
  REQUIRE(failure == "child killed by signal 9");
}

// The receiver of a 64 MiB message dies once it announced its buffer and the data started to
// flow; the sender's isend ends within the bound: kOk only where the provider completed the
// writes, else kPeerError.
void dying_receiver(Channel& channel) {
  std::vector<std::byte> buffer(kHuge);
  PostedReceive posted(channel, buffer);
  posted.test_for(std::chrono::milliseconds(200));
  die();
}

// Sends one 64 MiB message to the peer behind `handle` and tests it until it ends: kOk or
// kPeerError, within kBound of the moment the channel showed the receiver gone (`what` it did).
void send_until_ended(Channel& channel, Context& context, const Handle& handle, const char* what) {
  std::vector<std::byte> buffer(kHuge);
  fill_pattern(buffer, 7);
  std::unique_ptr<SendComm> out = connect_one(context, handle);
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  Request send;
  require(post_into(out->isend(buffer.data(), buffer.size(), 1, region), send) == Status::kOk,
          out->last_error());
  bool done = false;
  Status status = Status::kOk;
  std::chrono::steady_clock::time_point ended{};
  poll_until([&] { return done; },
             [&] {
               status = test_once(*out, send, done, {});
               if (ended == std::chrono::steady_clock::time_point{} && channel.readable()) {
                 ended = std::chrono::steady_clock::now();
               }
             },
             "the send", 60s);
  std::fprintf(stderr, "send to a receiver that %s: %s %s\n", what,
               std::string(to_string(status)).c_str(), out->last_error().c_str());
  require(status == Status::kOk || status == Status::kPeerError,
          "the send ended " + std::string(to_string(status)) + ": " + out->last_error());
  require(ended == std::chrono::steady_clock::time_point{} ||
              std::chrono::steady_clock::now() - ended < kBound,
          "the send's end took longer than the bound");
  out->close();
}

void pending_sender(Channel& channel) {
  Context context(death_config());
  send_until_ended(channel, context, recv_handle(channel), "was killed");
}

TEST_CASE("p2p a receiver killed with a 64 MiB send in flight ends the send within bounds",
          "[death]") {
  auto failure = run_pair(pending_sender, dying_receiver);
  INFO(failure);
  REQUIRE(failure == "child killed by signal 9");
}

// The receiver of a 64 MiB message closes once the data started to flow: close() waits for the
// writes the sender had posted (rxm over tcp crashed closing the endpoint under one), the send
// ends within the bound, and the same listener accepts the sender's next connection.
void closing_receiver(Channel& channel) {
  std::vector<std::byte> buffer(kHuge);
  PostedReceive posted(channel, buffer);
  posted.test_for(std::chrono::milliseconds(200));
  posted.in->close();
  channel.send_value(1);
  std::unique_ptr<RecvComm> again = accept_one(posted.listener, 20s);
  std::vector<std::byte> small(4096);
  const CloseOnUnwind guard{again.get()};
  MemoryRegion region = again->register_memory(small.data(), small.size());
  RecvBuffer target{small.data(), small.size(), 2, region};
  Request receive;
  require(post_into(again->irecv({&target, 1}), receive) == Status::kOk, again->last_error());
  require(finish(*again, receive) == small.size(), "the second connection's message");
  require(check_pattern(small, 8).empty(), check_pattern(small, 8));
  channel.send_value(2);
}

void sender_then_reconnect(Channel& channel) {
  Context context(death_config());
  const Handle handle = recv_handle(channel);
  send_until_ended(channel, context, handle, "closed");
  require(channel.recv_value<int>() == 1, "receiver out of step");
  std::unique_ptr<SendComm> again = connect_one(context, handle, 20s);
  std::vector<std::byte> small(4096);
  const CloseOnUnwind guard{again.get()};
  fill_pattern(small, 8);
  MemoryRegion small_region = again->register_memory(small.data(), small.size());
  Request message;
  require(
      post_into(again->isend(small.data(), small.size(), 2, small_region), message) == Status::kOk,
      again->last_error());
  finish(*again, message);
  require(channel.recv_value<int>() == 2, "receiver out of step");
}

TEST_CASE("p2p a receiver that closes with a 64 MiB send in flight, then accepts again",
          "[death]") {
  auto failure = run_pair(sender_then_reconnect, closing_receiver);
  INFO(failure);
  REQUIRE(failure.empty());
}

// ---- The death table (README, Failures) ----
//
// One process pair drives every cell: the child sends to the survivor on one communicator and
// receives from it on another, so its death is a sender's death for the survivor's receives
// and a receiver's death for its sends. Each direction carries six messages, in this order:
// two that arrived before the death (the survivor has not tested them yet), two in flight when
// it came, two never sent (sender dies) or never received (receiver dies).
namespace table {

enum class Moment { kAfter, kDuring, kBefore };

struct Message {
  std::size_t size;
  std::size_t capacity;  // the receive buffer
  bool eager;
  Moment moment;
};

constexpr std::size_t kMessages = 6;
constexpr std::size_t kRendezvous = 1u << 20;
constexpr std::size_t kLongRendezvous = 16u << 20;

// "During": handed to the provider, not yet taken by the receiver. The child posts its two
// (their clear-to-sends are there), progresses a little and dies while the survivor makes no
// progress: shm has copied nothing yet, tcp has part of the 16 MiB write on the wire and the
// eager message queued behind it. The survivor posts its two and stops progressing; the child
// progresses its receives until told they left, then dies: they got as far as the provider
// moved them by then (all the way on shm). An eager message is one provider operation and
// cannot be cut in the middle from outside: posted and not yet completed is the nearest honest
// thing.
std::array<Message, kMessages> messages(std::size_t eager_max) {
  return {{{1000, 1024, true, Moment::kAfter},
           {kRendezvous, kRendezvous, false, Moment::kAfter},
           {kLongRendezvous, kLongRendezvous, false, Moment::kDuring},
           {eager_max, eager_max, true, Moment::kDuring},
           {4000, 4000, true, Moment::kBefore},
           {kRendezvous, kRendezvous, false, Moment::kBefore}}};
}

std::array<std::size_t, kMessages> offsets(const std::array<Message, kMessages>& table) {
  std::array<std::size_t, kMessages> at{};
  for (std::size_t i = 1; i < kMessages; ++i) at[i] = at[i - 1] + table[i - 1].capacity;
  return at;
}

std::size_t total(const std::array<Message, kMessages>& table) {
  return offsets(table).back() + table.back().capacity;
}

// Patterns differ per message and per direction.
std::uint64_t seed_to_survivor(std::size_t i) {
  return 200 + i;
}
std::uint64_t seed_to_doomed(std::size_t i) {
  return 100 + i;
}
constexpr std::uint64_t kUnwritten = 999;

const char* name(Moment moment) {
  return moment == Moment::kAfter ? "after" : moment == Moment::kDuring ? "during" : "before";
}

// What the data rails of the context's sending lanes handed to the provider: tagged sends and
// RMA writes.
struct Traffic {
  std::uint64_t sent = 0;
  std::uint64_t written = 0;
};

Traffic traffic(const Context& context) {
  Traffic t;
  for (const auto& lane : context.stats().lanes) {
    if (lane.send_comms == 0) continue;
    for (const auto& rail : lane.rails) {
      if (!rail.data) continue;
      t.sent += rail.bytes_sent;
      t.written += rail.bytes_written;
    }
  }
  return t;
}

// One of the survivor's requests and, once test() reported it, its outcome.
struct Cell {
  Communicator* comm = nullptr;
  Request request;
  std::size_t index = 0;
  bool receive = false;  // the survivor receives: the sender died
  bool done = false;
  Status status = Status::kOk;
  std::size_t size = 0;
  std::string error;
  std::chrono::steady_clock::time_point ended{};
};

void step(Cell& cell) {
  if (cell.done) return;
  const Status status = test_once(*cell.comm, cell.request, cell.done, {&cell.size, 1});
  require(cell.done || status == Status::kOk, "test: " + cell.comm->last_error());
  if (!cell.done) return;
  cell.status = status;
  if (status != Status::kOk) cell.error = cell.comm->last_error();
  cell.ended = std::chrono::steady_clock::now();
}

std::string describe(const Cell& cell, const Message& m) {
  return std::string(cell.receive ? "sender" : "receiver") + " dies, " +
         (m.eager ? "eager " : "rendezvous ") + std::to_string(m.size) + " B, " + name(m.moment) +
         " the data arrived: the survivor's " + (cell.receive ? "receive" : "send");
}

long long milliseconds_between(std::chrono::steady_clock::time_point from,
                               std::chrono::steady_clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

// The table's rule for one cell (see the README). `received` is the survivor's receive buffer.
void judge(const Cell& cell, const Message& m, std::span<const std::byte> received,
           std::size_t offset, std::chrono::steady_clock::time_point death) {
  const long long took = milliseconds_between(death, cell.ended);
  const std::string what = describe(cell, m);
  const bool ok = cell.status == Status::kOk;
  // A send that went ahead on a credit is done once it left, whatever became of its receiver.
  const bool sent_ahead = !cell.receive && m.eager;
  if (sent_ahead) {
    require(ok || cell.status == Status::kPeerError,
            what + " ended " + std::string(to_string(cell.status)) + ": " + cell.error);
  } else if (m.moment == Moment::kAfter) {
    require(ok, what + " failed, but the message had arrived: " + cell.error);
  } else if (m.moment == Moment::kBefore) {
    require(cell.status == Status::kPeerError,
            what + " ended " + std::string(to_string(cell.status)) + ", not kPeerError");
  } else {
    require(ok || cell.status == Status::kPeerError,
            what + " ended " + std::string(to_string(cell.status)) + ": " + cell.error);
  }
  if (ok) {
    require(cell.size == m.size, what + ": kOk with " + std::to_string(cell.size) + " of " +
                                     std::to_string(m.size) + " bytes");
    if (cell.receive) {
      const std::string wrong =
          check_pattern(received.subspan(offset, m.size), seed_to_survivor(cell.index));
      require(wrong.empty(), what + ": kOk for bytes that did not arrive: " + wrong);
      // The receive buffer was filled with kUnwritten's pattern from its first byte.
      for (std::size_t i = offset + m.size; i < offset + m.capacity; ++i) {
        require(received[i] == pattern_byte(kUnwritten, i),
                what + ": byte " + std::to_string(i - offset) + " written past the message");
      }
    }
  } else {
    require(std::chrono::milliseconds(took) < kBound,
            what + ": the error came " + std::to_string(took) + " ms after the death");
  }
}

// The parent: posts six receives from the child and six sends to it, and tests none of them
// but the last two of each (never sent, never received) until the child is dead.
void survivor(Channel& channel) {
  const Config config = death_config();
  Context context(config);
  const std::size_t eager_max = context.nics().front().eager_max;
  const auto table = messages(eager_max);
  const auto at = offsets(table);
  for (const Message& m : table) {
    require(m.eager == (m.capacity <= eager_max),
            "the eager limit must lie between 4000 B and 1 MiB for this test's sizes");
  }
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  std::vector<std::byte> sending(total(table)), receiving(total(table));
  const CloseOnUnwind guard{in.get(), out.get()};
  fill_pattern(receiving, kUnwritten);
  for (std::size_t i = 0; i < kMessages; ++i) {
    fill_pattern({sending.data() + at[i], table[i].size}, seed_to_doomed(i));
  }
  MemoryRegion send_region = out->register_memory(sending.data(), sending.size());
  MemoryRegion recv_region = in->register_memory(receiving.data(), receiving.size());

  std::vector<Cell> cells;
  for (std::size_t i = 0; i < kMessages; ++i) {
    RecvBuffer buffer{receiving.data() + at[i], table[i].capacity, Tag(i + 1), recv_region};
    Cell cell{.comm = in.get(), .index = i, .receive = true};
    require(post_into(in->irecv({&buffer, 1}), cell.request) == Status::kOk, in->last_error());
    cells.push_back(cell);
  }
  for (std::size_t i = 0; i < kMessages; ++i) {
    Cell cell{.comm = out.get(), .index = i, .receive = false};
    require(post_into(out->isend(sending.data() + at[i], table[i].size, Tag(i + 1), send_region),
                      cell.request) == Status::kOk,
            out->last_error());
    cells.push_back(cell);
  }
  // Progress goes through the requests that stay pending until the death.
  bool alive = true;
  const auto progress = [&] {
    for (Cell& cell : cells) {
      if (table[cell.index].moment != Moment::kBefore) continue;
      step(cell);
      // An eager send never received may have gone ahead on a credit: done once it left.
      if (!cell.receive && table[cell.index].eager && cell.status == Status::kOk) continue;
      require(!alive || !cell.done,
              "a request for a message never sent ended while the peer lived: " + cell.error);
    }
  };
  channel.send_value(1);  // posted

  // After: the first two messages of each direction arrive; the survivor leaves them untested.
  bool peer_received = false;
  poll_until(
      [&] {
        if (!peer_received && channel.readable()) {
          require(channel.recv_value<int>() == 2, "peer out of step");
          peer_received = true;
        }
        const CommStats stats = in->stats();
        return peer_received && stats.eager >= 1 && stats.rendezvous >= 1;
      },
      progress, "the first two messages each way", 30s);
  const Traffic before = traffic(context);
  channel.send_value(3);

  // During, first this side's messages: once both are with the provider the child hears so.
  // The eager ones (0, 3 and 4) may have gone ahead on credits already, all at once.
  poll_until(
      [&] {
        const Traffic now = traffic(context);
        return (now.sent > before.sent || out->stats().eager >= 3) && now.written > before.written;
      },
      progress, "this side's messages to the peer to leave", 30s);
  channel.send_value(4);
  // Then the child's: it hands its two to the provider and dies. This side makes no progress
  // meanwhile, so they are still in flight when it dies (shm, for one, copies a message only
  // when its receiver progresses), and its own are as far as they got.
  poll_until([&] { return channel.peer_closed(); },
             [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }, "the peer's death",
             30s);
  const auto death = std::chrono::steady_clock::now();
  alive = false;

  // The requests for messages never sent end once the death is detected; only then are the
  // others tested, so that what had arrived must keep its outcome past the failure.
  const auto ended = [&](bool all) {
    return std::all_of(cells.begin(), cells.end(), [&](const Cell& c) {
      return c.done || (!all && table[c.index].moment != Moment::kBefore);
    });
  };
  poll_until([&] { return ended(false); }, progress, "the death to be detected", 30s);
  poll_until([&] { return ended(true); },
             [&] {
               for (Cell& cell : cells) step(cell);
             },
             "every request to end", 30s);
  for (const Cell& cell : cells) {
    std::fprintf(stderr, "death table: %s ended %s after %lld ms%s%s\n",
                 describe(cell, table[cell.index]).c_str(),
                 std::string(to_string(cell.status)).c_str(),
                 milliseconds_between(death, cell.ended), cell.error.empty() ? "" : ": ",
                 cell.error.c_str());
  }
  for (const Cell& cell : cells) {
    judge(cell, table[cell.index], receiving, at[cell.index], death);
  }
  Request late;
  require(post_into(out->isend(sending.data(), 10, 1, send_region), late) == Status::kPeerError,
          "isend to a dead peer: " + out->last_error());
  RecvBuffer buffer{receiving.data(), 10, 1, recv_region};
  require(post_into(in->irecv({&buffer, 1}), late) == Status::kPeerError,
          "irecv from a dead peer: " + in->last_error());
  out->close();
  in->close();
}

// The child: sends and receives the first two messages, starts the next two and dies.
void doomed(Channel& channel) {
  const Config config = death_config();
  Context context(config);
  const auto table = messages(context.nics().front().eager_max);
  const auto at = offsets(table);
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  std::vector<std::byte> sending(total(table)), receiving(total(table));
  const CloseOnUnwind guard{out.get(), in.get()};
  for (std::size_t i = 0; i < kMessages; ++i) {
    fill_pattern({sending.data() + at[i], table[i].size}, seed_to_survivor(i));
  }
  MemoryRegion send_region = out->register_memory(sending.data(), sending.size());
  MemoryRegion recv_region = in->register_memory(receiving.data(), receiving.size());
  std::array<Request, kMessages> sends{}, receives{};
  const auto post_send = [&](std::size_t i) {
    require(post_into(out->isend(sending.data() + at[i], table[i].size, Tag(i + 1), send_region),
                      sends[i]) == Status::kOk,
            out->last_error());
  };
  const auto post_receive = [&](std::size_t i) {
    RecvBuffer buffer{receiving.data() + at[i], table[i].capacity, Tag(i + 1), recv_region};
    require(post_into(in->irecv({&buffer, 1}), receives[i]) == Status::kOk, in->last_error());
  };
  require(channel.recv_value<int>() == 1, "survivor out of step");

  for (std::size_t i = 0; i < 2; ++i) {
    post_send(i);
    post_receive(i);
  }
  for (std::size_t i = 0; i < 2; ++i) {
    finish(*out, sends[i]);
    require(finish(*in, receives[i]) == table[i].size, "message " + std::to_string(i) + " size");
    const std::string wrong =
        check_pattern({receiving.data() + at[i], table[i].size}, seed_to_doomed(i));
    require(wrong.empty(), wrong);
  }
  channel.send_value(2);
  require(channel.recv_value<int>() == 3, "survivor out of step");

  for (std::size_t i = 2; i < 4; ++i) post_receive(i);
  std::array<bool, kMessages> sent{}, received{};
  poll_until([&] { return channel.readable(); },
             [&] {
               for (std::size_t i = 2; i < 4; ++i)
                 if (!received[i]) (void)test_once(*in, receives[i], received[i], {});
             },
             "the survivor's messages to leave", 30s);
  require(channel.recv_value<int>() == 4, "survivor out of step");
  const Traffic before = traffic(context);
  for (std::size_t i = 2; i < 4; ++i) post_send(i);
  const auto progress = [&] {
    for (std::size_t i = 2; i < 4; ++i)
      if (!sent[i]) (void)test_once(*out, sends[i], sent[i], {});
  };
  poll_until(
      [&] {
        const Traffic now = traffic(context);
        return now.sent > before.sent && now.written > before.written;
      },
      progress, "this side's messages to leave", 30s);
  // Some progress puts part of them on the wire where the provider needs it for that (tcp).
  for (int i = 0; i < 20; ++i) progress();
  die();
}

}  // namespace table

TEST_CASE("p2p death table: every pending request when the sender or receiver is killed",
          "[death]") {
  auto failure = run_pair(table::survivor, table::doomed);
  INFO(failure);
  REQUIRE(failure == "child killed by signal 9");
}

}  // namespace
}  // namespace loom::test
