// The thread rule of include/loom/p2p.hpp under load: one Context per process shared by four
// threads, each of which connects, accepts, moves data and closes on its own communicators at
// the same time as the others, while the main thread reads the context's statistics. Built under
// ThreadSanitizer by scripts/tsan.sh; in the ordinary suite it checks every byte.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

constexpr std::size_t kThreads = 4;
constexpr std::size_t kMessages = 200;  // each way, per thread
constexpr std::size_t kWindow = 8;      // in flight per direction, per thread
constexpr std::size_t kEagerMax = 16 * 1024;
constexpr std::size_t kMaxSize = 1 << 20;
constexpr auto kExchangeTimeout = 90s;

// Message n of thread `thread` of rank `rank`: seeds never repeat across ranks, threads and
// messages, so a message in the wrong communicator, slot or order cannot pass.
std::uint64_t seed_of(std::uint64_t rank, std::size_t thread, std::size_t n) {
  return rank * 1'000'000 + thread * 10'000 + n + 1;
}

// Mostly eager (the boundary included), a third rendezvous up to 1 MiB, log-uniform. Which of
// the two message n is depends on n alone, so the receiver can post a buffer of the eager limit
// for it (a larger buffer gets no eager receive: every message to it is written); the size
// within the class depends on the seed.
bool eager_message(std::size_t n) {
  return n % 50 == 7 || (n % 3 != 0 && n % 50 != 8 && n % 50 != 9);
}

std::size_t size_of(std::uint64_t seed, std::size_t n) {
  switch (n % 50) {
    case 7:
      return kEagerMax;
    case 8:
      return kEagerMax + 1;
    case 9:
      return kMaxSize;
    default:
      break;
  }
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  if (eager_message(n)) return 1 + (x >> 8) % kEagerMax;
  const unsigned shift = 14 + static_cast<unsigned>((x >> 4) % 7);  // 16 KiB .. 1 MiB
  return std::clamp<std::size_t>((std::size_t{1} << shift) + (x >> 16) % (std::size_t{1} << shift),
                                 kEagerMax + 1, kMaxSize);
}

Tag tag_of(std::size_t n) {
  return static_cast<Tag>(n * 7919 + 3);
}

// What all threads of one process share besides the context.
struct Shared {
  std::uint64_t me = 0;
  std::uint64_t peer = 0;
  Context* context = nullptr;
  Listener* listener = nullptr;
  Handle peer_handle;
  std::atomic<bool> abort{false};
  std::array<std::atomic<bool>, kThreads> senders_seen{};  // peer threads identified so far
  std::latch exchanged{kThreads};
  std::latch release{1};
};

class Worker {
 public:
  Worker(Shared& shared, std::size_t index) : shared_(shared), index_(index) {}

  // Connect, accept, exchange, wait for the main thread's word, close: all on this thread.
  void run() {
    bool counted = false;
    try {
      set_up();
      exchange();
      counted = true;
      shared_.exchanged.count_down();
      shared_.release.wait();
      if (!shared_.abort) {
        out_->close();
        in_->close();
      }
    } catch (const std::exception& e) {
      error_ = "thread " + std::to_string(index_) + ": " + e.what();
      shared_.abort = true;
      if (!counted) shared_.exchanged.count_down();
    }
  }

  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  // Each thread connects on its own while all of them accept on the shared listener: which
  // peer thread's communicator a thread accepts is arbitrary (exchange() finds out).
  void set_up() {
    Connector connector = shared_.context->connect(shared_.peer_handle);
    poll_until([&] { return (out_ && in_) || shared_.abort; },
               [&] {
                 if (!out_) out_ = connector.poll();
                 if (!in_) in_ = shared_.listener->accept();
               },
               "connect and accept", 60s);
    require(!shared_.abort, "another thread failed");
  }

  void exchange() {
    std::vector<std::byte> send_slab(kWindow * kMaxSize), recv_slab(kWindow * kMaxSize);
    const CloseOnUnwind guard{out_.get(), in_.get()};
    const MemoryRegion send_region = out_->register_memory(send_slab.data(), send_slab.size());
    const MemoryRegion recv_region = in_->register_memory(recv_slab.data(), recv_slab.size());
    std::array<Request, kWindow> sends{}, receives{};
    std::size_t sent = 0, send_done = 0, posted = 0, received = 0;
    std::size_t bytes_sent = 0, bytes_received = 0;
    const auto deadline = std::chrono::steady_clock::now() + kExchangeTimeout;
    while (send_done < kMessages || received < kMessages) {
      require(!shared_.abort, "another thread failed");
      require(std::chrono::steady_clock::now() < deadline,
              "exchange timed out: sent " + std::to_string(send_done) + ", received " +
                  std::to_string(received));
      // Receives first, so the peer's sends find buffers.
      while (posted < kMessages && posted - received < kWindow) {
        const std::size_t slot = posted % kWindow;
        RecvBuffer buffer{recv_slab.data() + slot * kMaxSize,
                          eager_message(posted) ? kEagerMax : kMaxSize, tag_of(posted),
                          recv_region};
        require(post_into(in_->irecv({&buffer, 1}), receives[slot]) == Status::kOk,
                in_->last_error());
        ++posted;
      }
      while (sent < kMessages && sent - send_done < kWindow) {
        const std::size_t slot = sent % kWindow;
        const std::uint64_t seed = seed_of(shared_.me, index_, sent);
        std::byte* data = send_slab.data() + slot * kMaxSize;
        fill_pattern({data, size_of(seed, sent)}, seed);
        require(post_into(out_->isend(data, size_of(seed, sent), tag_of(sent), send_region),
                          sends[slot]) == Status::kOk,
                out_->last_error());
        bytes_sent += size_of(seed, sent);
        ++sent;
      }
      bool done = false;
      if (send_done < sent) {
        require(test_once(*out_, sends[send_done % kWindow], done) == Status::kOk,
                out_->last_error());
        if (done) ++send_done;
      }
      if (received < posted) {
        std::size_t delivered = 0;
        const std::size_t slot = received % kWindow;
        require(test_once(*in_, receives[slot], done, {&delivered, 1}) == Status::kOk,
                in_->last_error());
        if (done) {
          verify(received, {recv_slab.data() + slot * kMaxSize, delivered});
          bytes_received += delivered;
          ++received;
          // Statistics read by the owner while other threads complete work on the shared lanes.
          // A send done at its post counts from then, before its test reports it.
          if (received % 32 == 0) {
            require(in_->stats().messages == received, "receive statistics");
            const std::uint64_t sends = out_->stats().messages;
            require(sends >= send_done && sends <= sent,
                    "send statistics: " + std::to_string(sends) + " with " +
                        std::to_string(send_done) + " reported done of " + std::to_string(sent));
          }
        }
      }
    }
    const CommStats out_stats = out_->stats(), in_stats = in_->stats();
    require(out_stats.messages == kMessages && out_stats.bytes == bytes_sent,
            "send statistics: " + std::to_string(out_stats.messages) + " messages");
    require(in_stats.messages == kMessages && in_stats.bytes == bytes_received,
            "receive statistics: " + std::to_string(in_stats.messages) + " messages");
    require(out_stats.eager + out_stats.rendezvous == kMessages && out_stats.eager > 0 &&
                out_stats.rendezvous > 0,
            "both protocols");
    out_->deregister(send_region);
    in_->deregister(recv_region);
  }

  // The first message names the peer thread whose send communicator this thread accepted.
  void verify(std::size_t n, std::span<const std::byte> bytes) {
    if (n == 0) {
      for (std::size_t t = 0; t < kThreads && sender_ == kThreads; ++t) {
        const std::uint64_t seed = seed_of(shared_.peer, t, 0);
        if (bytes.size() == size_of(seed, 0) && check_pattern(bytes, seed).empty()) sender_ = t;
      }
      require(sender_ < kThreads, "the first message matches no peer thread");
      require(!shared_.senders_seen[sender_].exchange(true),
              "two communicators carry peer thread " + std::to_string(sender_) + "'s messages");
    }
    const std::uint64_t seed = seed_of(shared_.peer, sender_, n);
    require(bytes.size() == size_of(seed, n), "message " + std::to_string(n) + " delivered " +
                                                  std::to_string(bytes.size()) + " bytes of " +
                                                  std::to_string(size_of(seed, n)));
    const std::string error = check_pattern(bytes, seed);
    require(error.empty(), "message " + std::to_string(n) + ": " + error);
  }

  Shared& shared_;
  std::size_t index_;
  std::size_t sender_ = kThreads;  // the peer thread sending to us, once known
  std::unique_ptr<SendComm> out_;
  std::unique_ptr<RecvComm> in_;
  std::string error_;
};

void rank(Channel& channel, std::uint64_t me, std::uint64_t peer, unsigned ngroups) {
  Config config = test_config(1);
  config.ngroups = ngroups;
  Context context(config);
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  Shared shared;
  shared.me = me;
  shared.peer = peer;
  shared.context = &context;
  shared.listener = &listener;
  shared.peer_handle = recv_handle(channel);

  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < kThreads; ++i) {
    workers.push_back(std::make_unique<Worker>(shared, i));
    threads.emplace_back([worker = workers.back().get()] { worker->run(); });
  }
  // The context is shared: its statistics are read while the workers drive their lanes.
  while (!shared.exchanged.try_wait()) {
    (void)context.stats();
    (void)listener.stats();
    std::this_thread::sleep_for(20ms);
  }
  // Every lane is open until the workers close: ngroups, each shared by communicators to the
  // peer and from it (twice that where lanes are per direction, shm).
  const std::size_t lanes = context.stats().lanes.size();
  const std::size_t expected = ngroups * (context.nics().front().lanes_per_direction ? 2 : 1);
  // Nobody closes before both processes got every message.
  std::string failure;
  if (!shared.abort) {
    try {
      channel.barrier();
    } catch (const std::exception& e) {
      failure = e.what();
      shared.abort = true;
    }
  }
  shared.release.count_down();
  for (auto& thread : threads) thread.join();
  for (const auto& worker : workers) {
    if (!worker->error().empty()) failure += (failure.empty() ? "" : "; ") + worker->error();
  }
  require(failure.empty(), failure);
  require(listener.stats().accepted == kThreads, "accepted");
  require(lanes == expected, "lanes: " + std::to_string(lanes));
  channel.barrier();
}

}  // namespace

TEST_CASE("p2p four threads each drive their own communicators concurrently", "[threads]") {
  // One lane shared by all four threads (the default grouping), then two lanes shared by two
  // threads each, which other threads' test() calls also progress.
  const unsigned ngroups = GENERATE(1u, 2u);
  INFO("LOOM_NGROUPS " << ngroups);
  auto failure = run_pair([&](Channel& c) { rank(c, 1, 2, ngroups); },
                          [&](Channel& c) { rank(c, 2, 1, ngroups); }, 240s);
  INFO(failure);
  REQUIRE(failure.empty());
}

}  // namespace loom::test
