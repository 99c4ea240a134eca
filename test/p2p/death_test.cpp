// A peer killed (SIGKILL) in the middle of a rendezvous: the survivor's request ends kOk only
// if every byte arrived (checked here, byte by byte, with the delivered size), else with an
// error within LOOM_PEER_TIMEOUT_MS. Never a hang, never kOk for bytes that did not arrive.
#include <chrono>
#include <cstdio>
#include <vector>

#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

constexpr unsigned kPeerTimeoutMs = 2000;
constexpr std::size_t kHuge = 64u << 20;
constexpr auto kBound = std::chrono::milliseconds(4 * kPeerTimeoutMs);

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
  Request* receive = nullptr;

  PostedReceive(Channel& channel, std::vector<std::byte>& buffer) {
    send_handle(channel, listener.handle());
    in = accept_one(listener);
    MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
    RecvBuffer target{buffer.data(), buffer.size(), 1, region};
    require(in->irecv({&target, 1}, receive) == Status::kOk, in->last_error());
  }
};

// Receives one 64 MiB message from a sender that kills itself once its writes are posted.
void surviving_receiver(Channel& channel) {
  std::vector<std::byte> buffer(kHuge);
  fill_pattern(buffer, 1);  // not the sender's pattern
  PostedReceive posted(channel, buffer);
  RecvComm* in = posted.in.get();
  Request* receive = posted.receive;
  channel.send_value(1);
  bool done = false;
  Status status = Status::kOk;
  std::size_t size = 0;
  std::chrono::steady_clock::time_point died{};
  poll_until([&] { return done; },
             [&] {
               status = in->test(receive, done, {&size, 1});
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
    require(status == Status::kPeerError || status == Status::kError,
            "the receive ended " + std::string(to_string(status)));
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
  Request* send = nullptr;
  require(out->isend(buffer.data(), buffer.size(), 1, region, send) == Status::kOk,
          out->last_error());
  bool done = false;
  poll_until([&] { return done || bytes_written(context) != 0; },
             [&] { (void)out->test(send, done, {}); }, "the writes to be posted", 60s);
  for (int i = 0; i < 20 && !done; ++i) (void)out->test(send, done, {});
  std::fflush(nullptr);
  ::raise(SIGKILL);
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
  bool done = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (!done && std::chrono::steady_clock::now() < until) {
    (void)posted.in->test(posted.receive, done, {});
  }
  std::fflush(nullptr);
  ::raise(SIGKILL);
}

// Sends one 64 MiB message to the peer behind `handle` and tests it until it ends: kOk or
// kPeerError, within kBound of the moment the channel showed the receiver gone (`what` it did).
void send_until_ended(Channel& channel, Context& context, const Handle& handle, const char* what) {
  std::vector<std::byte> buffer(kHuge);
  fill_pattern(buffer, 7);
  std::unique_ptr<SendComm> out = connect_one(context, handle);
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  Request* send = nullptr;
  require(out->isend(buffer.data(), buffer.size(), 1, region, send) == Status::kOk,
          out->last_error());
  bool done = false;
  Status status = Status::kOk;
  std::chrono::steady_clock::time_point ended{};
  poll_until([&] { return done; },
             [&] {
               status = out->test(send, done, {});
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
  bool done = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (!done && std::chrono::steady_clock::now() < until) {
    (void)posted.in->test(posted.receive, done, {});
  }
  posted.in->close();
  channel.send_value(1);
  std::unique_ptr<RecvComm> again = accept_one(posted.listener, 20s);
  std::vector<std::byte> small(4096);
  MemoryRegion region = again->register_memory(small.data(), small.size());
  RecvBuffer target{small.data(), small.size(), 2, region};
  Request* receive = nullptr;
  require(again->irecv({&target, 1}, receive) == Status::kOk, again->last_error());
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
  fill_pattern(small, 8);
  MemoryRegion small_region = again->register_memory(small.data(), small.size());
  Request* message = nullptr;
  require(again->isend(small.data(), small.size(), 2, small_region, message) == Status::kOk,
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

}  // namespace
}  // namespace loom::test
