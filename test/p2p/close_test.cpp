// What each side's pending requests become when the other side closes (README, Failures):
// a message the receiver had received, or the sender had handed over whole, completes with its
// own outcome on the other side; every other pending request fails with kPeerError at once,
// not after LOOM_PEER_TIMEOUT_MS. Every combination: the sender or the receiver closes, before
// or after the data arrived, for eager and rendezvous messages.
#include <chrono>
#include <cstdio>
#include <vector>

#include <catch2/catch.hpp>

#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

// Long, so that a failure that comes from liveness instead of the close notice shows.
constexpr unsigned kPeerTimeoutMs = 30000;
constexpr auto kPrompt = std::chrono::seconds(8);

enum class Closer { kReceiver, kSender };
enum class When { kAfterArrival, kBeforeArrival };

struct Case {
  std::size_t size;
  Closer closer;
  When when;
};

Config close_config() {
  Config config = test_config(1);
  config.peer_timeout_ms = kPeerTimeoutMs;
  return config;
}

// A request's outcome, once test() reported it done.
struct Outcome {
  bool done = false;
  Status status = Status::kOk;
  std::string error;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};

void step(Communicator& comm, Request request, Outcome& outcome) {
  if (outcome.done) return;
  outcome.status = test_once(comm, request, outcome.done, {});
  if (outcome.done) outcome.error = comm.last_error();
}

// Tests `request` until it ends; requires `expect`, reached within kPrompt of outcome.since.
void expect_outcome(Communicator& comm, Request request, Outcome& outcome, Status expect,
                    const char* what) {
  poll_until([&] { return outcome.done; }, [&] { step(comm, request, outcome); }, what, 40s);
  const auto took = std::chrono::steady_clock::now() - outcome.since;
  require(outcome.status == expect, std::string(what) + ": " +
                                        std::string(to_string(outcome.status)) + ", expected " +
                                        std::string(to_string(expect)) + ": " + outcome.error);
  require(took < kPrompt, std::string(what) + ": took until the peer timeout");
}

// Makes progress through `probe` (whose outcome it records) until the peer's next signal.
int progress_until_signal(Communicator& comm, Request probe, Outcome& outcome, Channel& channel) {
  poll_until([&] { return channel.readable(); }, [&] { step(comm, probe, outcome); },
             "the peer's signal", 40s);
  return channel.recv_value<int>();
}

// Parent: receives message 0 into buffer A (tag 1). Where the sender closes, buffer B (tag 2)
// waits for a message 1 that is never sent.
void receiver(Channel& channel, const Case& c) {
  Context context(close_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  std::vector<std::byte> buffer(2 * c.size);
  const CloseOnUnwind guard{in.get()};
  fill_pattern(buffer, 99);
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  RecvBuffer a{buffer.data(), c.size, 1, region};
  Request first;
  require(post_into(in->irecv({&a, 1}), first) == Status::kOk, in->last_error());

  if (c.closer == Closer::kReceiver) {
    channel.send_value(1);  // posted
    if (c.when == When::kAfterArrival) {
      finish(*in, first);
      const std::string error = check_pattern({buffer.data(), c.size}, 7);
      require(error.empty(), error);
    }
    in->close();
    channel.send_value(2);  // closed
    require(channel.recv_value<int>() == 4, "sender out of step");
    return;
  }
  RecvBuffer b{buffer.data() + c.size, c.size, 2, region};
  Request second;
  require(post_into(in->irecv({&b, 1}), second) == Status::kOk, in->last_error());
  channel.send_value(1);  // posted
  // Progress through the second receive only: the first one's outcome stays untested until
  // the sender has closed.
  Outcome first_outcome, second_outcome;
  require(progress_until_signal(*in, second, second_outcome, channel) == 2, "sender out of step");
  first_outcome.since = second_outcome.since = std::chrono::steady_clock::now();
  if (c.when == When::kAfterArrival) {
    expect_outcome(*in, first, first_outcome, Status::kOk,
                   "the receive of a message sent before the close");
    const std::string error = check_pattern({buffer.data(), c.size}, 7);
    require(error.empty(), error);
  } else {
    // Sent right before the close: it may still have left first (the sender's lane progresses
    // in the background, and the clear-to-send was on its way), and then it is delivered;
    // else it fails. Never in between.
    poll_until([&] { return first_outcome.done; }, [&] { step(*in, first, first_outcome); },
               "the receive of a message sent right before the close", 40s);
    if (first_outcome.status == Status::kOk) {
      const std::string error = check_pattern({buffer.data(), c.size}, 7);
      require(error.empty(), "a message that left before the close: " + error);
    } else {
      require(first_outcome.status == Status::kPeerError,
              "a receive the closed sender never sent: " +
                  std::string(to_string(first_outcome.status)) + ": " + first_outcome.error);
      require(std::chrono::steady_clock::now() - first_outcome.since < kPrompt,
              "a receive the closed sender never sent: took until the peer timeout");
    }
  }
  expect_outcome(*in, second, second_outcome, Status::kPeerError, "a receive nothing was sent for");
  RecvBuffer late{buffer.data(), 10, 3, region};
  Request refused;
  require(post_into(in->irecv({&late, 1}), refused) == Status::kPeerError,
          "irecv after the peer closed: " + in->last_error());
  in->close();
  channel.send_value(3);
}

// Child: sends message 0, of c.size bytes, pattern 7.
void sender(Channel& channel, const Case& c) {
  Context context(close_config());
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  std::vector<std::byte> buffer(c.size);
  const CloseOnUnwind guard{out.get()};
  fill_pattern(buffer, 7);
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  require(channel.recv_value<int>() == 1, "receiver out of step");

  Request message;
  if (c.closer == Closer::kReceiver) {
    if (c.when == When::kAfterArrival) {
      const CommStats before = out->stats();
      require(post_into(out->isend(buffer.data(), c.size, 1, region), message) == Status::kOk,
              out->last_error());
      // Progress through a second send that has no buffer over there, leaving the first one's
      // outcome untested until the receiver has closed. Sent ahead on a credit it is done once
      // it left, the receiver alone judging it; waiting for its buffer's announcement it fails
      // with the close.
      Request unmatched;
      require(post_into(out->isend(buffer.data(), 10, 2, region), unmatched) == Status::kOk,
              out->last_error());
      Outcome message_outcome, unmatched_outcome;
      require(progress_until_signal(*out, unmatched, unmatched_outcome, channel) == 2,
              "receiver out of step");
      message_outcome.since = unmatched_outcome.since = std::chrono::steady_clock::now();
      // Each message that left counts once, eager or written.
      const CommStats after = out->stats();
      const bool ahead = after.eager + after.rendezvous - before.eager - before.rendezvous == 2;
      expect_outcome(*out, unmatched, unmatched_outcome, ahead ? Status::kOk : Status::kPeerError,
                     ahead ? "a send ahead the receiver had no buffer for"
                           : "a send the receiver had no buffer for");
      expect_outcome(*out, message, message_outcome, Status::kOk,
                     "a send the receiver took before closing");
    } else {
      // The receiver closes before its clear-to-send left: nothing goes. Its close notice may
      // even beat the isend here (our lane progresses in the background): refused at once then.
      const Status posted = post_into(out->isend(buffer.data(), c.size, 1, region), message);
      if (posted == Status::kPeerError) {
        require(out->last_error().find("the peer closed the communicator") != std::string::npos,
                "isend refused for the wrong reason: " + out->last_error());
        require(channel.recv_value<int>() == 2, "receiver out of step");
      } else {
        require(posted == Status::kOk, out->last_error());
        Outcome outcome;
        require(progress_until_signal(*out, message, outcome, channel) == 2,
                "receiver out of step");
        outcome.since = std::chrono::steady_clock::now();
        expect_outcome(*out, message, outcome, Status::kPeerError, "a send to a closed receiver");
      }
      Request late;
      require(post_into(out->isend(buffer.data(), c.size, 3, region), late) == Status::kPeerError,
              "isend after the receiver closed: " + out->last_error());
    }
    out->close();
    channel.send_value(4);
    return;
  }
  require(post_into(out->isend(buffer.data(), c.size, 1, region), message) == Status::kOk,
          out->last_error());
  if (c.when == When::kAfterArrival) finish(*out, message);
  out->close();  // before the data left: close() sends nothing more
  channel.send_value(2);
  require(channel.recv_value<int>() == 3, "receiver out of step");
}

void run(const Case& c) {
  auto failure = run_pair([&](Channel& channel) { receiver(channel, c); },
                          [&](Channel& channel) { sender(channel, c); });
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("p2p close: every pending request's outcome when either side closes", "[close]") {
  for (std::size_t size : {std::size_t{1000}, std::size_t{300000}}) {
    for (Closer closer : {Closer::kReceiver, Closer::kSender}) {
      for (When when : {When::kAfterArrival, When::kBeforeArrival}) {
        std::fprintf(stderr, "close case: %zu bytes, %s closes %s the data arrived\n", size,
                     closer == Closer::kReceiver ? "receiver" : "sender",
                     when == When::kAfterArrival ? "after" : "before");
        run({size, closer, when});
      }
    }
  }
}

}  // namespace
}  // namespace loom::test
