// What one peer does must not reach another peer's traffic, nor crash or stall its own: a
// receiver that closes under a rendezvous its sender is not progressing, a close right after
// setup towards a peer busy elsewhere, a receive posted once the peer has closed, an empty
// message whose sender goes quiet, a region deregistered under a pending send, a peer that is
// idle (alive) for longer than the peer timeout, and a peer stopped with a write to it in
// flight on a lane other peers share. Each case failed before the mechanism it names.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
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

using Clock = std::chrono::steady_clock;
constexpr unsigned kPeerTimeoutMs = 2000;
constexpr std::size_t kHuge = 64u << 20;

Config isolation_config(unsigned peer_timeout_ms = kPeerTimeoutMs) {
  Config config = test_config(1);
  config.peer_timeout_ms = peer_timeout_ms;
  return config;
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::uint64_t bytes_written(const Context& context) {
  std::uint64_t bytes = 0;
  for (const auto& lane : context.stats().lanes)
    for (const auto& rail : lane.rails) bytes += rail.bytes_written;
  return bytes;
}

// Both roles in two processes; the test fails with what went wrong on either side.
void expect_pair(const std::function<void(Channel&)>& parent,
                 const std::function<void(Channel&)>& child) {
  const std::string failure = run_pair(parent, child);
  INFO(failure);
  REQUIRE(failure.empty());
}

// A request's end: test() until done, bounded; the status and the error text.
struct Ending {
  Status status = Status::kOk;
  std::string error;
  double ms = 0;  // from the start of the wait
};

Ending wait_end(Communicator& comm, Request request, std::chrono::seconds bound = 30s,
                std::span<std::size_t> sizes = {}) {
  const auto start = Clock::now();
  bool done = false;
  Ending end;
  poll_until([&] { return done; }, [&] { end.status = test_once(comm, request, done, sizes); },
             "the request to end", bound);
  end.error = comm.last_error();
  end.ms = ms_since(start);
  return end;
}

// ---- A receiver closes under a 64 MiB rendezvous; its sender does something else ----
// rxm over tcp crashed (SIGSEGV in fi_close of the lane's endpoint) when the receiver's close
// gave up waiting for the writes after LOOM_PEER_TIMEOUT_MS and closed the endpoint under one
// still arriving: the sender, not calling in, never pushed it out. Now the sender's lanes are
// progressed in the background, and the close waits for the writes while the sender lives.

void closing_receiver(Channel& channel) {
  std::vector<std::byte> buffer(kHuge);
  Context context(isolation_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  RecvBuffer target{buffer.data(), buffer.size(), 1, region};
  Request receive;
  require(post_into(in->irecv({&target, 1}), receive) == Status::kOk, in->last_error());
  require(channel.recv_value<int>() == 1, "sender out of step");  // its writes are posted
  const auto until = Clock::now() + std::chrono::milliseconds(50);
  bool done = false;
  while (!done && Clock::now() < until) (void)test_once(*in, receive, done, {});
  const auto start = Clock::now();
  in->close();
  const double took = ms_since(start);
  std::fprintf(stderr, "close under a 64 MiB rendezvous (the message %s): %.0f ms\n",
               done ? "had arrived" : "was arriving", took);
  require(took < 2.0 * kPeerTimeoutMs, "close took " + std::to_string(took) + " ms");
  in.reset();  // the buffer stays until nothing can write into it
  channel.send_value(2);
  channel.barrier();
}

void idle_sender(Channel& channel) {
  std::vector<std::byte> buffer(kHuge);
  fill_pattern(buffer, 31);
  Context context(isolation_config());
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  Request send;
  require(post_into(out->isend(buffer.data(), buffer.size(), 1, region), send) == Status::kOk,
          out->last_error());
  bool done = false;
  Ending end;
  poll_until([&] { return done || bytes_written(context) != 0; },
             [&] { end.status = test_once(*out, send, done, {}); }, "the writes to be posted", 30s);
  channel.send_value(1);
  // Busy elsewhere: no loom call until the receiver closed.
  require(channel.recv_value<int>() == 2, "receiver out of step");
  if (!done) end = wait_end(*out, send);  // shm may have written it whole already
  std::fprintf(stderr, "the idle sender's 64 MiB send: %s %s\n",
               std::string(to_string(end.status)).c_str(), end.error.c_str());
  require(end.status == Status::kOk || end.status == Status::kPeerError,
          "the send ended " + std::string(to_string(end.status)) + ": " + end.error);
  channel.barrier();
  out->close();
}

TEST_CASE("p2p isolation: a receiver closes under a 64 MiB rendezvous its sender is not driving",
          "[isolation]") {
  expect_pair(closing_receiver, idle_sender);
}

// ---- A close right after setup reaches a peer that is busy elsewhere ----
// The first control message between two lanes waits until the provider reached the peer (rxm
// connects, shm exchanges names), which takes the peer's progress: a close notice retried for
// 200 ms while the peer did something else was dropped, and the peer's requests failed only
// after LOOM_PEER_TIMEOUT_MS, without the close's reason. The notice now waits in the lane's
// outbox, the lane stays open for it, and the peer's lanes progress in the background.

constexpr unsigned kLongTimeoutMs = 30000;  // a failure by timeout would show as slow
constexpr auto kBusy = std::chrono::milliseconds(600);
constexpr double kPromptMs = 2000;

enum class Closer { kSender, kReceiver };

void close_early_listener(Channel& channel, Closer closer) {
  std::vector<std::byte> buffer(4096);
  Context context(isolation_config(kLongTimeoutMs));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  const CloseOnUnwind guard{in.get()};
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  if (closer == Closer::kReceiver) {
    in->close();
    channel.barrier();
    channel.barrier();
    return;
  }
  channel.barrier();                   // the sender closes meanwhile
  std::this_thread::sleep_for(kBusy);  // no loom call here
  RecvBuffer target{buffer.data(), buffer.size(), 3, region};
  Request receive;
  const Status posted = post_into(in->irecv({&target, 1}), receive);
  Ending end{posted, in->last_error(), 0};
  if (posted == Status::kOk) end = wait_end(*in, receive);
  std::fprintf(stderr, "receive after the sender's early close: %s in %.0f ms: %s\n",
               std::string(to_string(end.status)).c_str(), end.ms, end.error.c_str());
  require(end.status == Status::kPeerError && end.error.find("closed") != std::string::npos,
          "the receive ended " + std::string(to_string(end.status)) + ": " + end.error);
  require(end.ms < kPromptMs, "the close was learned after " + std::to_string(end.ms) + " ms");
  in->deregister(region);
  channel.barrier();
}

void close_early_connector(Channel& channel, Closer closer) {
  std::vector<std::byte> buffer(4096);
  fill_pattern(buffer, 5);
  Context context(isolation_config(kLongTimeoutMs));
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  const CloseOnUnwind guard{out.get()};
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  if (closer == Closer::kSender) {
    out->close();
    channel.barrier();
    channel.barrier();
    return;
  }
  channel.barrier();  // the receiver closed
  std::this_thread::sleep_for(kBusy);
  Request send;
  const Status posted = post_into(out->isend(buffer.data(), buffer.size(), 3, region), send);
  Ending end{posted, out->last_error(), 0};
  if (posted == Status::kOk) end = wait_end(*out, send);
  std::fprintf(stderr, "send after the receiver's early close: %s in %.0f ms: %s\n",
               std::string(to_string(end.status)).c_str(), end.ms, end.error.c_str());
  require(end.status == Status::kPeerError && end.error.find("closed") != std::string::npos,
          "the send ended " + std::string(to_string(end.status)) + ": " + end.error);
  require(end.ms < kPromptMs, "the close was learned after " + std::to_string(end.ms) + " ms");
  out->deregister(region);
  channel.barrier();
}

TEST_CASE("p2p isolation: a close right after setup reaches a peer busy elsewhere", "[isolation]") {
  for (const Closer closer : {Closer::kSender, Closer::kReceiver}) {
    INFO((closer == Closer::kSender ? "the sender closes" : "the receiver closes"));
    const std::string failure = run_pair([&](Channel& c) { close_early_listener(c, closer); },
                                         [&](Channel& c) { close_early_connector(c, closer); });
    INFO(failure);
    CHECK(failure.empty());
  }
}

// ---- A receive waits while its peer closes: the close's reason, not a provider error ----
// sockets refuses a message for an endpoint that closed (fi_inject: ENOENT), and the receive
// failed with that text (kError) although the peer's close notice waited in the queue. A
// control message the provider refuses now waits until the queues were read.

void waiting_receiver(Channel& channel) {
  std::vector<std::byte> buffer(256 * 1024);
  Context context(isolation_config(kLongTimeoutMs));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  const CloseOnUnwind guard{in.get()};
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  // Two receives: the first announced before the close, the second after it.
  RecvBuffer first{buffer.data(), 1024, 1, region};
  Request before;
  require(post_into(in->irecv({&first, 1}), before) == Status::kOk, in->last_error());
  channel.barrier();
  channel.barrier();  // the sender has closed
  RecvBuffer second{buffer.data() + 1024, buffer.size() - 1024, 2, region};
  Request after;
  const Status posted = post_into(in->irecv({&second, 1}), after);
  for (Request request : {before, after}) {
    if (request == after && posted != Status::kOk) {
      require(posted == Status::kPeerError, "irecv after the close: " + in->last_error());
      continue;
    }
    const Ending end = wait_end(*in, request);
    std::fprintf(stderr, "receive %s the close: %s in %.0f ms: %s\n",
                 request == before ? "before" : "after", std::string(to_string(end.status)).c_str(),
                 end.ms, end.error.c_str());
    require(end.status == Status::kPeerError && end.error.find("closed") != std::string::npos,
            "the receive ended " + std::string(to_string(end.status)) + ": " + end.error);
    require(end.ms < kPromptMs, "learned after " + std::to_string(end.ms) + " ms");
  }
  in->deregister(region);
  channel.barrier();
}

void closing_sender(Channel& channel) {
  Context context(isolation_config(kLongTimeoutMs));
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  channel.barrier();
  // The first receive's announcement comes meanwhile (background progress on both sides).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  out->close();
  channel.barrier();
  channel.barrier();
}

TEST_CASE("p2p isolation: receives fail with the peer's close, never a provider error",
          "[isolation]") {
  expect_pair(waiting_receiver, closing_sender);
}

// ---- An empty message whose sender goes quiet ----
// udp;ofi_rxd delivers an injected message only while its sender calls in, and loom injected
// empty messages where the provider's profile forbids injects. The message now goes with a
// completion, and the sender's lanes progress in the background besides.

void quiet_sender(Channel& channel) {
  Context context(isolation_config());
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  const CloseOnUnwind guard{out.get()};
  Request send;
  require(post_into(out->isend(nullptr, 0, 9, MemoryRegion{}), send) == Status::kOk,
          out->last_error());
  const Ending end = wait_end(*out, send);
  require(end.status == Status::kOk, "the empty send: " + end.error);
  channel.send_value(1);
  // Quiet: no loom call until the receiver has its message.
  require(channel.recv_value<int>() == 2, "receiver out of step");
  channel.barrier();
}

void receiver_of_empty(Channel& channel) {
  std::vector<std::byte> buffer(64);
  fill_pattern(buffer, 77);
  Context context(isolation_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  const CloseOnUnwind guard{in.get()};
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  RecvBuffer target{buffer.data(), buffer.size(), 9, region};
  Request receive;
  require(post_into(in->irecv({&target, 1}), receive) == Status::kOk, in->last_error());
  require(channel.recv_value<int>() == 1, "sender out of step");
  std::size_t size = 99;
  const Ending end = wait_end(*in, receive, 30s, {&size, 1});
  std::fprintf(stderr, "an empty message from a quiet sender: %s in %.0f ms\n",
               std::string(to_string(end.status)).c_str(), end.ms);
  require(end.status == Status::kOk, "the empty receive: " + end.error);
  require(size == 0, "delivered " + std::to_string(size) + " bytes of an empty message");
  require(check_pattern(buffer, 77).empty(), "an empty message wrote into its buffer");
  require(end.ms < kPeerTimeoutMs / 2.0, "it took " + std::to_string(end.ms) + " ms");
  channel.send_value(2);
  in->deregister(region);
  channel.barrier();
}

TEST_CASE("p2p isolation: an empty message arrives although its sender goes quiet",
          "[isolation][empty]") {
  expect_pair(receiver_of_empty, quiet_sender);
}

// ---- A region deregistered under a pending send ----
// The rendezvous write, posted once the clear-to-send came, read the registration that
// deregister() had freed (AddressSanitizer: heap-use-after-free in post_stripes). The release
// now waits for the requests that use the region; the handle is dead at once.

void late_receiver(Channel& channel) {
  constexpr std::size_t kSize = 8u << 20;
  std::vector<std::byte> buffer(kSize);
  Context context(isolation_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  const CloseOnUnwind guard{in.get()};
  require(channel.recv_value<int>() == 1, "sender out of step");  // it deregistered
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  RecvBuffer target{buffer.data(), buffer.size(), 4, region};
  Request receive;
  require(post_into(in->irecv({&target, 1}), receive) == Status::kOk, in->last_error());
  std::size_t size = 0;
  const Ending end = wait_end(*in, receive, 30s, {&size, 1});
  require(end.status == Status::kOk, "the receive: " + end.error);
  require(size == kSize, "delivered " + std::to_string(size) + " bytes");
  const std::string wrong = check_pattern(buffer, 404);
  require(wrong.empty(), wrong);
  in->deregister(region);
  channel.barrier();
}

void deregistering_sender(Channel& channel) {
  constexpr std::size_t kSize = 8u << 20;
  std::vector<std::byte> buffer(kSize);
  fill_pattern(buffer, 404);
  Context context(isolation_config());
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  const CloseOnUnwind guard{out.get()};
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  Request send;
  require(post_into(out->isend(buffer.data(), buffer.size(), 4, region), send) == Status::kOk,
          out->last_error());
  out->deregister(region);  // a misuse: the send waits for its clear-to-send
  Request again;
  require(post_into(out->isend(buffer.data(), 1024, 4, region), again) == Status::kInvalid,
          "a send through a deregistered region was taken");
  require(out->last_error().find("deregistered") != std::string::npos,
          "unclear refusal: " + out->last_error());
  channel.send_value(1);
  const Ending end = wait_end(*out, send);
  require(end.status == Status::kOk, "the send: " + end.error);
  channel.barrier();
}

TEST_CASE("p2p isolation: a region deregistered under a pending send is released after it",
          "[isolation]") {
  expect_pair(late_receiver, deregistering_sender);
}

// ---- A live peer that makes no loom call for three peer timeouts ----
// Its lanes answer pings in the background: nothing fails on either side, and the waiting
// side's request completes once the idle one posts.

void waiting_side(Channel& channel) {
  std::vector<std::byte> buffer(100000);
  Context context(isolation_config());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  const CloseOnUnwind guard{in.get()};
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  RecvBuffer target{buffer.data(), buffer.size(), 6, region};
  Request receive;
  require(post_into(in->irecv({&target, 1}), receive) == Status::kOk, in->last_error());
  channel.send_value(1);
  std::size_t size = 0;
  const Ending end = wait_end(*in, receive, 30s, {&size, 1});
  require(end.status == Status::kOk, "the receive from an idle peer: " + end.error);
  require(end.ms > 3.0 * kPeerTimeoutMs, "the idle peer sent early");
  require(size == buffer.size() && check_pattern(buffer, 66).empty(), "wrong bytes");
  in->deregister(region);
  channel.barrier();
}

void idle_side(Channel& channel) {
  std::vector<std::byte> buffer(100000);
  fill_pattern(buffer, 66);
  Context context(isolation_config());
  std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel));
  const CloseOnUnwind guard{out.get()};
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  require(channel.recv_value<int>() == 1, "receiver out of step");
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kPeerTimeoutMs + 500));
  Request send;
  require(post_into(out->isend(buffer.data(), buffer.size(), 6, region), send) == Status::kOk,
          "the idle side's send: " + out->last_error());
  const Ending end = wait_end(*out, send);
  require(end.status == Status::kOk, "the idle side's send: " + end.error);
  out->deregister(region);
  channel.barrier();
}

TEST_CASE("p2p isolation: a live peer idle for three peer timeouts is not taken for dead",
          "[isolation]") {
  expect_pair(waiting_side, idle_side);
}

// ---- The eager limit follows LOOM_PEER_ISOLATION where the provider paces sends ----
// shm completes sends above its 4 KiB inject size only once the peer took them, in order per
// endpoint: with isolation (the default) eager messages stay within it; without, the
// configured LOOM_EAGER_MAX applies. Elsewhere the two agree.
TEST_CASE("p2p isolation: the eager limit with and without LOOM_PEER_ISOLATION", "[local]") {
  Config isolated = isolation_config();
  Config shared = isolation_config();
  shared.peer_isolation = false;
  const NicDescription with = Context(isolated).nics().front();
  const NicDescription without = Context(shared).nics().front();
  INFO(with.provider);
  CHECK(without.eager_max == std::min(isolated.eager_max, without.max_message_size));
  if (with.provider == "shm") {
    CHECK(with.eager_max == 4096);
  } else {
    CHECK(with.eager_max == without.eager_max);
  }
}

}  // namespace
}  // namespace loom::test
