// Data movement through the p2p API between two processes: every size class over 1, 2 and 4
// data rails, a 1000-message window, multi-buffer receives and forced flushes.
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "mux/control_channel.hpp"
#include "p2p/messages.hpp"
#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

std::vector<std::size_t> size_sweep() {
  std::vector<std::size_t> sizes = {0, 1, 3, 4095, 4097, 65537, (4u << 20) + 3};
  for (std::size_t s = 2; s <= (64u << 20); s *= 2) sizes.push_back(s);
  return sizes;
}

void sweep_receiver(Channel& channel, unsigned rails) {
  Context context(test_config(rails));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  auto comm = accept_one(listener);
  const auto sizes = size_sweep();
  std::vector<std::byte> buffer((64u << 20) + 4096);
  const CloseOnUnwind guard{comm.get()};
  MemoryRegion region = comm->register_memory(buffer.data(), buffer.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    // Odd messages get a buffer larger than the message: the delivered size must say so.
    const std::size_t capacity = sizes[i] + (i % 2 ? 1000 : 0);
    Request request;
    RecvBuffer target{buffer.data(), capacity, static_cast<Tag>(i + 7), region};
    require(post_into(comm->irecv({&target, 1}), request) == Status::kOk,
            "irecv: " + comm->last_error());
    const std::size_t delivered = finish(*comm, request);
    require(delivered == sizes[i],
            "size " + std::to_string(sizes[i]) + " delivered as " + std::to_string(delivered));
    auto error = check_pattern({buffer.data(), sizes[i]}, rails * 1000 + i);
    require(error.empty(), "message of " + std::to_string(sizes[i]) + " bytes: " + error);
  }
  auto stats = comm->stats();
  require(stats.eager > 0 && stats.rendezvous > 0, "both protocols should have run");
  channel.barrier();
}

void sweep_sender(Channel& channel, unsigned rails) {
  Context context(test_config(rails));
  auto comm = connect_one(context, recv_handle(channel));
  const auto sizes = size_sweep();
  std::vector<std::byte> buffer(64u << 20);
  const CloseOnUnwind guard{comm.get()};
  MemoryRegion region = comm->register_memory(buffer.data(), buffer.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    fill_pattern({buffer.data(), sizes[i]}, rails * 1000 + i);
    Request request;
    const auto start = std::chrono::steady_clock::now();
    require(post_into(comm->isend(buffer.data(), sizes[i], static_cast<Tag>(i + 7), region),
                      request) == Status::kOk,
            "isend: " + comm->last_error());
    finish(*comm, request);
    if (sizes[i] == (64u << 20)) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "largest message: 64 MiB over %u data rail(s) in %.1f ms (%.2f GB/s)\n",
                   rails, seconds * 1e3, (64u << 20) / seconds / 1e9);
    }
  }
  channel.barrier();
}

}  // namespace

TEST_CASE("p2p sizes 0 B to 64 MiB over 1 and 2 and 4 data rails", "[pair]") {
  for (unsigned rails : {1u, 2u, 4u}) {
    INFO("data rails: " << rails);
    auto failure = run_pair([&](Channel& c) { sweep_receiver(c, rails); },
                            [&](Channel& c) { sweep_sender(c, rails); });
    REQUIRE(failure.empty());
  }
}

TEST_CASE("p2p 1000 messages of random sizes and tags in a window of 64 keep order", "[pair]") {
  constexpr std::size_t kMessages = 1000;
  constexpr std::size_t kWindow = 64;
  constexpr std::size_t kMaxSize = 256 * 1024;
  struct Plan {
    std::size_t size;
    Tag tag;
  };
  auto plan = [] {
    std::mt19937 rng(20261122);
    std::vector<Plan> p(kMessages);
    for (auto& m : p) {
      // Mostly small, some large: both protocols interleaved.
      m.size = rng() % 4 == 0 ? rng() % kMaxSize : rng() % 4096;
      m.tag = static_cast<Tag>(rng());
    }
    return p;
  }();
  auto receiver = [&](Channel& channel) {
    Context context(test_config(2));
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto comm = accept_one(listener);
    std::vector<std::byte> slab(kWindow * (kMaxSize + 64));
    const CloseOnUnwind guard{comm.get()};
    MemoryRegion region = comm->register_memory(slab.data(), slab.size());
    std::vector<Request> inflight(kWindow);
    std::size_t posted = 0, completed = 0;
    while (completed < kMessages) {
      while (posted < kMessages && posted - completed < kWindow) {
        const std::size_t slot = posted % kWindow;
        RecvBuffer b{slab.data() + slot * (kMaxSize + 64), plan[posted].size + 64, plan[posted].tag,
                     region};
        require(post_into(comm->irecv({&b, 1}), inflight[slot]) == Status::kOk, comm->last_error());
        ++posted;
      }
      const std::size_t slot = completed % kWindow;
      const std::size_t delivered = finish(*comm, inflight[slot]);
      require(delivered == plan[completed].size, "message " + std::to_string(completed) +
                                                     " delivered " + std::to_string(delivered) +
                                                     " of " + std::to_string(plan[completed].size));
      auto error = check_pattern({slab.data() + slot * (kMaxSize + 64), delivered}, completed);
      require(error.empty(), "message " + std::to_string(completed) + ": " + error);
      ++completed;
    }
    channel.barrier();
  };
  auto sender = [&](Channel& channel) {
    Context context(test_config(2));
    auto comm = connect_one(context, recv_handle(channel));
    std::vector<std::byte> slab(kWindow * kMaxSize);
    const CloseOnUnwind guard{comm.get()};
    MemoryRegion region = comm->register_memory(slab.data(), slab.size());
    std::vector<Request> inflight(kWindow);
    std::size_t posted = 0, completed = 0;
    while (completed < kMessages) {
      while (posted < kMessages && posted - completed < kWindow) {
        const std::size_t slot = posted % kWindow;
        std::byte* data = slab.data() + slot * kMaxSize;
        fill_pattern({data, plan[posted].size}, posted);
        require(post_into(comm->isend(data, plan[posted].size, plan[posted].tag, region),
                          inflight[slot]) == Status::kOk,
                comm->last_error());
        ++posted;
      }
      finish(*comm, inflight[completed % kWindow]);
      ++completed;
    }
    channel.barrier();
  };
  auto failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

// Bytes the context's sending lanes put on their control rails (ready-to-sends, asks for
// clearance, pings, closes).
std::uint64_t control_bytes_sent(const Context& context) {
  std::uint64_t bytes = 0;
  for (const auto& lane : context.stats().lanes) {
    if (lane.send_comms == 0) continue;
    for (const auto& rail : lane.rails)
      if (!rail.data) bytes += rail.bytes_sent;
  }
  return bytes;
}

// Whether a message goes eagerly is the receiver's call as much as the sender's: a buffer above
// the receiver's eager limit gets no eager receive, so even a one-byte message to it is written
// (an empty one rides on its ready-to-send); a message above the sender's limit is written even
// where an eager receive waits (it is cancelled). The two sides' limits differ, both ways round.
// A written message that fills its buffer needs no ready-to-send; any other written one does.
// One eager buffer per message (LOOM_EAGER_FRAGMENTS=1): a larger one in several is
// fragments_test.cpp's.
TEST_CASE("p2p messages into buffers above either side's eager limit", "[pair]") {
  struct Case {
    std::size_t message;
    std::size_t buffer;
  };
  const std::vector<Case> cases = {{0, 1u << 20},
                                   {1, 1u << 20},
                                   {4095, 8192},
                                   {32768, 32768},
                                   {65536, 1u << 20},
                                   {4096, 4096},
                                   {100, 200},
                                   {0, 0},
                                   {(1u << 20) + 7, 2u << 20},
                                   {8192, 65536},
                                   {65536, 65536}};
  for (const auto& limits : {std::pair<std::size_t, std::size_t>{4096, 65536}, {65536, 4096}}) {
    const std::size_t receiver_limit = limits.first;
    const std::size_t sender_limit = limits.second;
    INFO("eager limits: receiver " << receiver_limit << ", sender " << sender_limit);
    auto receiver = [&](Channel& channel) {
      Config config = test_config(1);
      config.eager_max = receiver_limit;
      config.eager_fragments = 1;
      Context context(config);
      Listener listener = context.listen();
      send_handle(channel, listener.handle());
      auto comm = accept_one(listener);
      std::vector<std::byte> buffer(2u << 20);
      const CloseOnUnwind guard{comm.get()};
      MemoryRegion region = comm->register_memory(buffer.data(), buffer.size());
      std::uint64_t written = 0;
      for (std::size_t i = 0; i < cases.size(); ++i) {
        Request request;
        RecvBuffer target{buffer.data(), cases[i].buffer, static_cast<Tag>(i + 40), region};
        require(post_into(comm->irecv({&target, 1}), request) == Status::kOk,
                "irecv: " + comm->last_error());
        const std::size_t delivered = finish(*comm, request);
        require(delivered == cases[i].message, "case " + std::to_string(i) + ": delivered " +
                                                   std::to_string(delivered) + " of " +
                                                   std::to_string(cases[i].message) + " bytes");
        auto error = check_pattern({buffer.data(), delivered}, 500 + i);
        require(error.empty(), "case " + std::to_string(i) + ": " + error);
        if (cases[i].message > receiver_limit || cases[i].message > sender_limit) ++written;
        const auto stats = comm->stats();
        require(stats.rendezvous == written,
                "case " + std::to_string(i) + ": " + std::to_string(stats.rendezvous) +
                    " messages came by write, expected " + std::to_string(written));
      }
      channel.barrier();
    };
    auto sender = [&](Channel& channel) {
      Config config = test_config(1);
      config.eager_max = sender_limit;
      config.eager_fragments = 1;
      config.peer_timeout_ms = 3600000;  // no liveness pings among the counted control bytes
      Context context(config);
      auto comm = connect_one(context, recv_handle(channel));
      std::vector<std::byte> buffer(2u << 20);
      const CloseOnUnwind guard{comm.get()};
      MemoryRegion region = comm->register_memory(buffer.data(), buffer.size());
      for (std::size_t i = 0; i < cases.size(); ++i) {
        fill_pattern({buffer.data(), cases[i].message}, 500 + i);
        const std::uint64_t control_before = control_bytes_sent(context);
        const std::uint64_t asks_before = comm->stats().asks_sent;
        Request request;
        require(post_into(
                    comm->isend(buffer.data(), cases[i].message, static_cast<Tag>(i + 40), region),
                    request) == Status::kOk,
                "isend: " + comm->last_error());
        finish(*comm, request);
        const Case& c = cases[i];
        // Eager (on a credit) up to both limits, whatever the buffer's size; written above.
        const bool written = c.message > receiver_limit || c.message > sender_limit;
        const bool fills = c.message == c.buffer && c.message != 0;
        // Beside the asks for an announcement a message that waited may have sent.
        const std::uint64_t asks = comm->stats().asks_sent - asks_before;
        const bool told = control_bytes_sent(context) - control_before !=
                          asks * (mux::kControlHeaderBytes + p2p::kAskClearanceBytes);
        require(told == (written && !fills),
                "case " + std::to_string(i) + ": a ready-to-send was " + (told ? "" : "not ") +
                    "sent for a " + (written ? "written" : "eager") + " message of " +
                    std::to_string(c.message) + " bytes into a buffer of " +
                    std::to_string(c.buffer));
      }
      channel.barrier();
    };
    auto failure = run_pair(receiver, sender);
    INFO(failure);
    REQUIRE(failure.empty());
  }
}

TEST_CASE("p2p multi-buffer receive and forced flush", "[pair]") {
  constexpr std::size_t kParts = 8;
  auto receiver = [&](Channel& channel) {
    Config config = test_config(2);
    config.force_flush = true;
    Context context(config);
    Listener listener = context.listen();
    send_handle(channel, listener.handle());
    auto comm = accept_one(listener);
    std::vector<std::byte> slab(kParts * 300000);
    const CloseOnUnwind guard{comm.get()};
    MemoryRegion region = comm->register_memory(slab.data(), slab.size());
    RecvBuffer buffers[kParts];
    for (std::size_t i = 0; i < kParts; ++i) {
      buffers[i] = {slab.data() + i * 300000, 300000, static_cast<Tag>(100 + i), region};
    }
    Request request;
    require(post_into(comm->irecv(buffers), request) == Status::kOk, comm->last_error());
    std::size_t sizes[kParts] = {};
    bool done = false;
    Status status = Status::kOk;
    poll_until([&] { return done; }, [&] { status = test_once(*comm, request, done, sizes); },
               "multi-buffer receive");
    require(status == Status::kOk, comm->last_error());
    for (std::size_t i = 0; i < kParts; ++i) {
      const std::size_t expected = i * 37000 + 1;  // eager and rendezvous mixed
      require(sizes[i] == expected,
              "buffer " + std::to_string(i) + " got " + std::to_string(sizes[i]) + " bytes");
      auto error = check_pattern({slab.data() + i * 300000, expected}, 500 + i);
      require(error.empty(), "buffer " + std::to_string(i) + ": " + error);
    }
    Request flush;
    require(post_into(comm->iflush(buffers), flush) == Status::kOk, comm->last_error());
    finish(*comm, flush);
    channel.barrier();
  };
  auto sender = [&](Channel& channel) {
    Context context(test_config(2));
    auto comm = connect_one(context, recv_handle(channel));
    std::vector<std::byte> slab(kParts * 300000);
    const CloseOnUnwind guard{comm.get()};
    MemoryRegion region = comm->register_memory(slab.data(), slab.size());
    Request requests[kParts];
    for (std::size_t i = 0; i < kParts; ++i) {
      std::byte* data = slab.data() + i * 300000;
      fill_pattern({data, i * 37000 + 1}, 500 + i);
      require(post_into(comm->isend(data, i * 37000 + 1, static_cast<Tag>(100 + i), region),
                        requests[i]) == Status::kOk,
              comm->last_error());
    }
    for (Request r : requests) finish(*comm, r);
    channel.barrier();
  };
  auto failure = run_pair(receiver, sender);
  INFO(failure);
  REQUIRE(failure.empty());
}

}  // namespace loom::test
