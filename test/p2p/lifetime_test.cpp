// Lifetimes at the edges: a connect that fails after its communicator joined a lane, wait()
// with a live peer that never posts, open/close churn with requests in flight, and closed
// communicators whose operations outlive close().
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <dirent.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

std::size_t open_descriptors() {
  std::size_t count = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir) != nullptr) ++count;
    ::closedir(dir);
  }
  return count;
}

std::size_t rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  }
  return 0;
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::size_t lane_comms(const Context& context) {
  std::size_t comms = 0;
  for (const auto& lane : context.stats().lanes) comms += lane.comms + lane.retired;
  return comms;
}

std::size_t retired(const Context& context) {
  std::size_t count = 0;
  for (const auto& lane : context.stats().lanes) count += lane.retired;
  return count;
}

TEST_CASE("p2p a connect that fails after joining its lane leaves nothing behind", "[lifetime]") {
  Config config = test_config(1);
  config.connect_timeout_ms = 3000;
  Context context(config);
  Listener listener = context.listen();
  // The listener's bootstrap address with its bytes after the first two zeroed: a sockaddr of
  // the right family with no port and no host, which rxm refuses to insert once the
  // communicator has joined its lane (on shm the name is accepted and nothing answers).
  Handle bad = listener.handle();
  constexpr std::size_t kFirstAddressByte = 27;
  REQUIRE(bad.size > kFirstAddressByte);
  const std::size_t length = std::to_integer<std::size_t>(bad.bytes[kFirstAddressByte - 1]);
  for (std::size_t i = 2; i < length; ++i) bad.bytes[kFirstAddressByte + i] = std::byte{0};
  std::string first_error;
  {
    Connector connector = context.connect(bad);
    poll_until([&] { return !first_error.empty(); },
               [&] {
                 try {
                   (void)connector.poll();
                 } catch (const Error& e) {
                   first_error = e.what();
                 }
               },
               "the failed connect", 20s);
    INFO(first_error);
    CHECK(lane_comms(context) == 0);
    // A later poll says the same and builds nothing.
    CHECK_THROWS_WITH(connector.poll(), first_error);
    CHECK_THROWS_WITH(connector.poll(), first_error);
    CHECK(lane_comms(context) == 0);
  }
  CHECK(lane_comms(context) == 0);
  // The context still connects.
  Connector genuine = context.connect(listener.handle());
  auto [out, in] = connect_both(genuine, listener, "the connect after a failed one");
  exchange(*out, *in, 41, 41, 5000);
}

TEST_CASE("p2p a handle whose address is shorter than the provider's is refused clearly",
          "[lifetime]") {
  Context context(test_config(1));
  Listener listener = context.listen();
  // The first address cut to 4 bytes, the handle ending with it: the provider would read a
  // whole endpoint name (16 bytes of sockaddr_in, or a shm name up to its NUL) from it.
  Handle short_address = listener.handle();
  constexpr std::size_t kLengthByte = 26;
  short_address.bytes[kLengthByte - 1] = std::byte{1};  // one address
  short_address.bytes[kLengthByte] = std::byte{4};
  short_address.size = kLengthByte + 1 + 4;
  std::string error;
  Connector connector = context.connect(short_address);
  poll_until([&] { return !error.empty(); },
             [&] {
               try {
                 (void)connector.poll();
               } catch (const Error& e) {
                 error = e.what();
               }
             },
             "the refused connect", 20s);
  INFO(error);
  CHECK_THAT(error, Catch::Contains("4-byte address is not a"));
  CHECK(lane_comms(context) == 0);
}

TEST_CASE("p2p wait with a timeout returns while the peer never posts, and sleeps meanwhile",
          "[lifetime]") {
  Context context(test_config(1));
  Listener listener = context.listen();
  Connector connector = context.connect(listener.handle());
  auto [out, in] = connect_both(connector, listener, "connect to self");
  // Above the eager size: it waits for its buffer (a small message would go ahead on a credit,
  // done once it left).
  std::vector<std::byte> sent(300000), received(300000);
  fill_pattern(sent, 12);
  MemoryRegion send_region = out->register_memory(sent.data(), sent.size());
  MemoryRegion recv_region = in->register_memory(received.data(), received.size());
  Request send;
  REQUIRE(post_into(out->isend(sent.data(), sent.size(), 4, send_region), send) == Status::kOk);

  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  const Status status = out->wait(send, {}, std::chrono::milliseconds(1500));
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = thread_cpu_seconds() - cpu_start;
  std::fprintf(stderr, "wait with nobody receiving: %s after %.3f s, %.3f s of CPU\n",
               std::string(to_string(status)).c_str(), wall, cpu);
  REQUIRE(status == Status::kInProgress);
  CHECK_THAT(out->last_error(), Catch::Contains("still pending"));
  CHECK(wall >= 1.5);
  CHECK(wall < 6.0);
  CHECK(cpu < 0.5 * wall);

  // The request is still live: a receive completes it.
  RecvBuffer target{received.data(), received.size(), 4, recv_region};
  Request receive;
  REQUIRE(post_into(in->irecv({&target, 1}), receive) == Status::kOk);
  REQUIRE(in->wait(receive, {}, std::chrono::milliseconds(20000)) == Status::kOk);
  REQUIRE(out->wait(send, {}, std::chrono::milliseconds(20000)) == Status::kOk);
  REQUIRE(check_pattern(received, 12).empty());
}

TEST_CASE("p2p 10000 open/close cycles with requests in flight keep memory and descriptors flat",
          "[lifetime]") {
  Context context(test_config(1));
  Listener listener = context.listen();
  // A pair that stays open keeps the lanes alive across the churn.
  Connector resident_connector = context.connect(listener.handle());
  auto resident = connect_both(resident_connector, listener, "the resident pair");
  std::vector<std::byte> buffer(64 * 1024);
  fill_pattern(buffer, 5);

  constexpr int kCycles = 10000;
  constexpr int kWarmup = 1000;
  std::size_t rss_after_warmup = 0;
  std::size_t fds_after_warmup = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int cycle = 1; cycle <= kCycles; ++cycle) {
    Connector connector = context.connect(listener.handle());
    auto [out, in] = connect_both(connector, listener, "cycle " + std::to_string(cycle));
    MemoryRegion send_region = out->register_memory(buffer.data(), buffer.size());
    MemoryRegion recv_region = in->register_memory(buffer.data(), buffer.size());
    // Left in flight: an eager receive, a message for it, and a rendezvous send with no
    // buffer for it.
    RecvBuffer target{buffer.data(), 1000, 1, recv_region};
    Request receive;
    Request small;
    Request large;
    REQUIRE(post_into(in->irecv({&target, 1}), receive) == Status::kOk);
    REQUIRE(post_into(out->isend(buffer.data(), 1000, 1, send_region), small) == Status::kOk);
    REQUIRE(post_into(out->isend(buffer.data(), buffer.size(), 2, send_region), large) ==
            Status::kOk);
    bool done = false;
    (void)test_once(*out, small, done, {});
    if (cycle % 2 == 0) {
      out->close();
      in->close();
    } else {
      in->close();
      out->close();
    }
    if (cycle == kWarmup) {
      rss_after_warmup = rss_kib();
      fds_after_warmup = open_descriptors();
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::size_t rss = rss_kib();
  const std::size_t fds = open_descriptors();
  std::fprintf(stderr,
               "%d cycles in %.1f s: RSS %zu KiB after %d, %zu KiB after all; descriptors %zu, "
               "%zu\n",
               kCycles, seconds, rss_after_warmup, kWarmup, rss, fds_after_warmup, fds);
  CHECK(fds <= fds_after_warmup);
  // Each communicator kept would hold over 60 KiB: 9000 of them over half a gigabyte.
  CHECK(rss < rss_after_warmup + 48 * 1024);
  CHECK(lane_comms(context) == 2);
  exchange(*resident.out, *resident.in, 8, 8, 100000);
}

// A rendezvous send whose receiver is stopped (SIGSTOP): the sender's writes stay with the
// provider past close()'s drain, so the closed communicator is retired; once the receiver runs
// again and the writes complete, the lane frees it while its other communicator goes on.
constexpr std::size_t kStalledBytes = 64u << 20;

void stalled_receiver(Channel& channel) {
  std::vector<std::byte> buffer(kStalledBytes);  // outlives the communicators
  Context context(test_config(1));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RecvComm> in = accept_one(listener);
  std::unique_ptr<RecvComm> resident = accept_one(listener);
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  RecvBuffer target{buffer.data(), buffer.size(), 1, region};
  Request receive;
  require(post_into(in->irecv({&target, 1}), receive) == Status::kOk, in->last_error());
  bool done = false;
  Status status = Status::kOk;
  // Once done, the request is back in the pool: testing it again is an error.
  auto test_receive = [&] {
    if (!done) status = test_once(*in, receive, done, {});
  };
  channel.send_value(static_cast<int>(::getpid()));
  // The sender has this process stop while the data flows (it stops itself, between calls:
  // two_process.hpp), and says when it closed. On a fast run the whole message arrived before
  // the stop: the receive may finish here.
  bool stopped = false;
  poll_until([&] { return stopped; },
             [&] {
               test_receive();
               stopped = obey_signal(channel);
             },
             "the sender's order to stop", 60s);
  poll_until([&] { return channel.readable(); }, test_receive, "the sender's close", 60s);
  require(channel.recv_value<int>() == 1, "sender out of step");
  // Every byte was handed over before the close: the receive completes.
  poll_until([&] { return done; }, test_receive, "the receive", 60s);
  // Every byte was handed to the provider before the close notice: it all arrives.
  require(status == Status::kOk, "the receive: " + in->last_error());
  require(check_pattern(buffer, 3).empty(), check_pattern(buffer, 3));
  channel.send_value(2);
  require(channel.recv_value<int>() == 3, "sender out of step");
}

void closing_sender(Channel& channel) {
  std::vector<std::byte> buffer(kStalledBytes);  // these outlive the communicators
  std::vector<std::byte> small(64);
  Context context(test_config(1));
  const Handle handle = recv_handle(channel);
  std::unique_ptr<SendComm> out = connect_one(context, handle);
  std::unique_ptr<SendComm> resident = connect_one(context, handle);
  fill_pattern(buffer, 3);
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  Request send;
  require(post_into(out->isend(buffer.data(), buffer.size(), 1, region), send) == Status::kOk,
          out->last_error());
  const pid_t receiver = channel.recv_value<int>();
  bool done = false;
  auto written = [&] {
    std::uint64_t bytes = 0;
    for (const auto& lane : context.stats().lanes)
      for (const auto& rail : lane.rails) bytes += rail.bytes_written;
    return bytes;
  };
  poll_until([&] { return done || written() != 0; }, [&] { (void)test_once(*out, send, done, {}); },
             "the writes to be posted", 60s);
  order_signal(channel, SIGSTOP);
  wait_until_stopped(receiver);
  auto test_for = [&](std::chrono::milliseconds how_long) {
    const auto until = std::chrono::steady_clock::now() + how_long;
    while (!done && std::chrono::steady_clock::now() < until) (void)test_once(*out, send, done, {});
  };
  test_for(std::chrono::milliseconds(200));
  out->close();
  const std::size_t held = retired(context);
  ::kill(receiver, SIGCONT);
  std::fprintf(stderr, "closed with the send %s; retired communicators: %zu\n",
               done ? "done" : "in flight", held);
  // The resident communicator's progress runs the lane: the writes finish, and the lane frees
  // the communicator they belonged to.
  MemoryRegion small_region = resident->register_memory(small.data(), small.size());
  Request probe;
  require(
      post_into(resident->isend(small.data(), small.size(), 9, small_region), probe) == Status::kOk,
      resident->last_error());
  bool probe_done = false;
  channel.send_value(1);
  poll_until([&] { return retired(context) == 0 && channel.readable(); },
             [&] { (void)test_once(*resident, probe, probe_done, {}); },
             "the retired communicator to be freed", 30s);
  require(channel.recv_value<int>() == 2, "receiver out of step");
  channel.send_value(3);
}

TEST_CASE("p2p a communicator closed with writes in flight is freed once they complete",
          "[lifetime]") {
  auto failure = run_pair(closing_sender, stalled_receiver);
  INFO(failure);
  REQUIRE(failure.empty());
}

}  // namespace
}  // namespace loom::test
