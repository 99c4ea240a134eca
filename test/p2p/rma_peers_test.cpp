// One-sided connections between processes, on every provider of the matrix. The target checks
// every byte of a write batch the moment poll() hands out its notification, and that the
// notifications come exactly once, in post order (support/rma_stream.hpp).
// - [rma-stream]: 10^5 batches of small blocks, then batches with blocks up to 1 MiB, a window
//   of them in flight; then read batches, every byte checked.
// - [rma-regions]: context regions registered before and after the lane opened, and after
//   traffic began, each as local source, as exported target and read back.
// - [rma-failures]: a target killed (SIGKILL) mid-stream; a target that closes, an initiator
//   that closes (its target alive or stopped) with batches in flight.
// - [rma-shared]: 16 connections from 8 processes to one target context share its lane; one
//   process killed and one stopped mid-stream do not hold up the others.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include "loom/loom.hpp"
#include "support/p2p_pair.hpp"
#include "support/rma_stream.hpp"

namespace loom::test {
namespace {

// ---- [rma-stream] ----

constexpr std::uint64_t kSmallBatches = 100000;
constexpr std::uint64_t kMixedBatches = 1000;
constexpr std::uint64_t kReadBatches = 1000;
constexpr std::size_t kStreamWindow = 64;
constexpr Shape kSmall{.max_blocks = 16, .small_max = 256, .max_gap = 64};
// Mostly 1 B..16 KiB, one block in 32 up to 1 MiB.
constexpr Shape kMixed{.max_blocks = 16,
                       .small_max = 16 << 10,
                       .large_max = 1 << 20,
                       .large_one_in = 32,
                       .max_gap = 4096};
constexpr std::size_t kSmallRing = 8 << 20;
constexpr std::size_t kMixedRing = 48 << 20;
constexpr std::size_t kReadRegion = 8 << 20;
constexpr std::uint64_t kReadSeed = 77;
constexpr std::uint64_t kDone = ~std::uint64_t{0};

void stream_target(Channel& channel) {
  Context context(test_config(1));
  std::vector<std::byte> sink(kSmallRing + kMixedRing);
  std::vector<std::byte> readable(kReadRegion);
  fill_pattern(readable, kReadSeed);
  Region written = context.register_memory(sink.data(), sink.size());
  Region read = context.register_memory(readable.data(), readable.size());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RmaTarget> target = accept_rma_one(listener);
  channel.send_bytes(target->export_region(written));
  channel.send_bytes(target->export_region(read));

  const std::span<const std::byte> all(sink);
  NotificationCheck small(all.first(kSmallRing), 1, kSmall, 11);
  NotificationCheck mixed(all.subspan(kSmallRing), 2, kMixed, 12);
  // How many batches were checked, told to the initiator every 64 of them or once idle for a
  // millisecond: the space it may write again.
  std::uint64_t reported = 0;
  Clock::time_point last_report = Clock::now();
  const auto start = Clock::now();
  const std::uint64_t message = serve_until_message(
      *target, channel,
      [&](const Notification& n) {
        (small.seen() < kSmallBatches ? small : mixed).check(n);
        const std::uint64_t total = small.seen() + mixed.seen();
        if (total - reported >= 64 || Clock::now() - last_report > 1ms) {
          channel.send_value(total);
          reported = total;
          last_report = Clock::now();
        }
      },
      "the stream", 280s);
  require(message == kDone, "stream: out of step");
  require(small.seen() == kSmallBatches && mixed.seen() == kMixedBatches,
          "stream: " + std::to_string(small.seen()) + " + " + std::to_string(mixed.seen()) +
              " notifications when the initiator finished");
  // None comes twice or late.
  const auto quiet = Clock::now() + 200ms;
  while (Clock::now() < quiet) require(!target->poll(), "a notification after the last one");
  require(target->stats().notifications == kSmallBatches + kMixedBatches,
          "the target's notification count");
  std::fprintf(stderr,
               "rma stream: target saw %llu notifications, every byte checked, in %lld ms\n",
               static_cast<unsigned long long>(kSmallBatches + kMixedBatches),
               milliseconds(Clock::now() - start));
  channel.send_value(kDone);
  channel.barrier();
  target->close();
}

// Reads kReadBatches batches of kMixed blocks from random places of the target's patterned
// region, a window of them in flight, checking every byte as each batch completes. Reports the
// target sends meanwhile are dropped.
void read_batches(RmaInitiator& rma, const MemoryRegion& local, std::span<std::byte> bytes,
                  RemoteRegion remote, Channel& channel) {
  struct Pending {
    Request request;
    PlannedBatch batch;
    std::size_t at = 0;
    std::vector<std::size_t> from;  // each block's offset in the remote region
  };
  Ring ring(bytes.size());
  std::deque<Pending> pending;
  std::optional<Pending> staged;
  std::uint64_t next = 0;
  std::vector<RmaBlock> blocks;
  poll_until(
      [&] { return next == kReadBatches && pending.empty(); },
      [&] {
        while (channel.readable()) (void)channel.recv_value<std::uint64_t>();
        while (next < kReadBatches && pending.size() < kStreamWindow) {
          if (!staged) {
            staged = Pending{.batch = plan_batch(3, next, kMixed)};
            staged->at = ring.place(staged->batch.local_extent);
            Rng rng(next * 31 + 5);
            for (const PlannedBlock& b : staged->batch.blocks)
              staged->from.push_back(rng.below(kReadRegion - b.length + 1));
          }
          for (const Pending& p : pending) {
            if (overlap(staged->at, staged->batch.local_extent, p.at, p.batch.local_extent)) return;
          }
          blocks.clear();
          for (std::size_t i = 0; i < staged->batch.blocks.size(); ++i) {
            const PlannedBlock& b = staged->batch.blocks[i];
            std::memset(bytes.data() + staged->at + b.local, 0, b.length);  // never a pattern byte
            blocks.push_back({local, staged->at + b.local, remote, staged->from[i], b.length});
          }
          require(post_into(rma.read(blocks), staged->request) == Status::kOk,
                  "read: " + rma.last_error());
          pending.push_back(std::move(*staged));
          staged.reset();
          ++next;
        }
        if (pending.empty()) return;
        const Status status = rma.test(pending.front().request);
        if (status == Status::kInProgress) return;
        require(status == Status::kOk,
                "read batch ended " + status_text(status) + ": " + rma.last_error());
        const Pending& done = pending.front();
        for (std::size_t i = 0; i < done.batch.blocks.size(); ++i) {
          const PlannedBlock& b = done.batch.blocks[i];
          const std::string wrong =
              check_pattern_at(bytes.subspan(done.at + b.local, b.length), kReadSeed, done.from[i]);
          require(wrong.empty(), "read block " + std::to_string(i) + ": " + wrong);
        }
        pending.pop_front();
      },
      "the read batches", 120s);
}

void stream_initiator(Channel& channel) {
  Context context(test_config(1));
  std::vector<std::byte> staging(kSmallRing + kMixedRing);
  Region local = context.register_memory(staging.data(), staging.size());
  std::unique_ptr<RmaInitiator> rma = connect_rma_one(context, recv_handle(channel));
  const RemoteRegion written = rma->import_region(channel.recv_bytes());
  const RemoteRegion read = rma->import_region(channel.recv_bytes());

  auto run = [&](const WriteStream::Setup& setup, std::uint64_t before, const char* what) {
    WriteStream stream(setup);
    const auto start = Clock::now();
    unsigned turn = 0;
    poll_until([&] { return stream.done(); },
               [&] {
                 // The target's reports (a syscall to look for them: not every turn).
                 if (++turn % 32 == 0) {
                   while (channel.readable()) {
                     const auto checked = channel.recv_value<std::uint64_t>();
                     stream.checked(checked > before ? checked - before : 0);
                   }
                 }
                 const Status status = stream.post();
                 require(status == Status::kOk, std::string(what) + ": post " +
                                                    status_text(status) + ": " + stream.refusal());
                 const std::uint64_t ended = stream.ended();
                 stream.test();
                 if (stream.ended() == ended) std::this_thread::yield();
               },
               what, 240s);
    require(stream.count(Status::kOk) == setup.limit,
            std::string(what) + ": a batch failed: " + stream.error());
    std::fprintf(stderr, "rma stream: %llu %s batches in %lld ms\n",
                 static_cast<unsigned long long>(setup.limit), what,
                 milliseconds(Clock::now() - start));
  };
  const std::span<std::byte> all(staging);
  run({.rma = rma.get(),
       .local = local,
       .local_bytes = all.first(kSmallRing),
       .remote = written,
       .remote_size = kSmallRing,
       .stream = 1,
       .shape = kSmall,
       .tag = 11,
       .limit = kSmallBatches,
       .window = kStreamWindow},
      0, "small");
  run({.rma = rma.get(),
       .local = local,
       .local_bytes = all.subspan(kSmallRing),
       .local_offset = kSmallRing,
       .remote = written,
       .remote_offset = kSmallRing,
       .remote_size = kMixedRing,
       .stream = 2,
       .shape = kMixed,
       .tag = 12,
       .limit = kMixedBatches,
       .window = kStreamWindow},
      kSmallBatches, "mixed");
  const auto start = Clock::now();
  read_batches(*rma, local, all, read, channel);
  std::fprintf(stderr, "rma stream: %llu read batches in %lld ms\n",
               static_cast<unsigned long long>(kReadBatches), milliseconds(Clock::now() - start));
  const RmaStats stats = rma->stats();
  require(stats.notifications == kSmallBatches + kMixedBatches, "the initiator's notifications");
  require(stats.batches == kSmallBatches + kMixedBatches + kReadBatches, "the initiator's batches");
  channel.send_value(kDone);
  while (channel.recv_value<std::uint64_t>() != kDone) {
  }
  channel.barrier();
  rma->close();
}

TEST_CASE("rma peers: 10^5 write batches land whole, notified once each in post order, and reads",
          "[rma-stream]") {
  const std::string failure = run_pair(stream_initiator, stream_target, 300s);
  INFO(failure);
  CHECK(failure.empty());
}

// ---- [rma-regions] ----

// Region 0 is registered before the listener (target) or the connect (initiator), region 1
// after the connection (and so its lane) opened, region 2 after the first batches landed.
// Step i writes from the initiator's region `local` into the target's `remote`, in area i of
// both, then reads it back into area i of the next local region.
struct Step {
  int local;
  int remote;
};
constexpr Step kSteps[] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 2}, {0, 2}, {2, 0}};
constexpr std::size_t kStepsBeforeLater = 4;
constexpr std::size_t kArea = 2 << 20;
constexpr std::size_t kRegionBytes = std::size(kSteps) * kArea;
constexpr Shape kRegionShape{.max_blocks = 8,
                             .small_max = 16 << 10,
                             .large_max = 128 << 10,
                             .large_one_in = 4,
                             .max_gap = 512};
constexpr std::uint64_t kRegionStream = 5;

std::size_t context_regions(const Context& context) {
  std::size_t n = 0;
  for (const auto& lane : context.stats().lanes) n += lane.context_regions;
  return n;
}

void regions_target(Channel& channel) {
  Context context(test_config(1));
  std::vector<std::vector<std::byte>> bytes(3, std::vector<std::byte>(kRegionBytes));
  std::vector<Region> regions;
  regions.push_back(context.register_memory(bytes[0].data(), kRegionBytes));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::unique_ptr<RmaTarget> target = accept_rma_one(listener);
  regions.push_back(context.register_memory(bytes[1].data(), kRegionBytes));
  channel.send_bytes(target->export_region(regions[0]));
  channel.send_bytes(target->export_region(regions[1]));
  std::size_t seen = 0;
  auto check = [&](const Notification& n) {
    require(n.value == seen && n.tag == 3, "notification " + std::to_string(n.value) + " where " +
                                               std::to_string(seen) + " was next");
    const PlannedBatch batch = plan_batch(kRegionStream, seen, kRegionShape);
    const std::span<const std::byte> area =
        std::span<const std::byte>(bytes[kSteps[seen].remote]).subspan(seen * kArea, kArea);
    for (const PlannedBlock& b : batch.blocks) {
      const std::string wrong = check_pattern(area.subspan(b.remote, b.length), b.seed);
      require(wrong.empty(), "step " + std::to_string(seen) + ": " + wrong);
    }
    ++seen;
    if (seen == kStepsBeforeLater) {
      regions.push_back(context.register_memory(bytes[2].data(), kRegionBytes));
      channel.send_bytes(target->export_region(regions[2]));
    }
  };
  require(serve_until_message(*target, channel, check, "the steps") == kDone, "out of step");
  require(seen == std::size(kSteps), std::to_string(seen) + " notifications");
  require(context_regions(context) == 3, std::to_string(context_regions(context)) +
                                             " context regions on the target's lanes, expected 3");
  channel.barrier();
  target->close();
}

void regions_initiator(Channel& channel) {
  Context context(test_config(1));
  std::vector<std::vector<std::byte>> bytes(3, std::vector<std::byte>(kRegionBytes));
  std::vector<Region> regions;
  regions.push_back(context.register_memory(bytes[0].data(), kRegionBytes));
  std::unique_ptr<RmaInitiator> rma = connect_rma_one(context, recv_handle(channel));
  regions.push_back(context.register_memory(bytes[1].data(), kRegionBytes));
  std::vector<RemoteRegion> remote;
  remote.push_back(rma->import_region(channel.recv_bytes()));
  remote.push_back(rma->import_region(channel.recv_bytes()));
  auto finish_batch = [&](Posted posted, const std::string& what) {
    Request request;
    require(post_into(posted, request) == Status::kOk, what + ": " + rma->last_error());
    const Status status = rma->wait(request, 60s);
    require(status == Status::kOk,
            what + " ended " + status_text(status) + ": " + rma->last_error());
  };
  std::vector<RmaBlock> blocks;
  for (std::size_t i = 0; i < std::size(kSteps); ++i) {
    if (i == kStepsBeforeLater) {
      regions.push_back(context.register_memory(bytes[2].data(), kRegionBytes));
      remote.push_back(rma->import_region(channel.recv_bytes()));
    }
    const Step step = kSteps[i];
    const std::string what = "step " + std::to_string(i) + " (local region " +
                             std::to_string(step.local) + ", remote region " +
                             std::to_string(step.remote) + ")";
    const PlannedBatch batch = plan_batch(kRegionStream, i, kRegionShape);
    blocks.clear();
    for (const PlannedBlock& b : batch.blocks) {
      fill_pattern({bytes[step.local].data() + i * kArea + b.local, b.length}, b.seed);
      blocks.push_back({regions[step.local], i * kArea + b.local, remote[step.remote],
                        i * kArea + b.remote, b.length});
    }
    finish_batch(rma->write(blocks, Notification{.tag = 3, .value = i}), what + " write");
    // Back into another local region, at the written blocks' local places.
    const int into = (step.local + 1) % static_cast<int>(regions.size());
    for (RmaBlock& block : blocks) block.local = regions[into];
    for (const PlannedBlock& b : batch.blocks)
      std::memset(bytes[into].data() + i * kArea + b.local, 0, b.length);
    finish_batch(rma->read(blocks), what + " read into local region " + std::to_string(into));
    for (const PlannedBlock& b : batch.blocks) {
      const std::string wrong =
          check_pattern({bytes[into].data() + i * kArea + b.local, b.length}, b.seed);
      require(wrong.empty(), what + " read back: " + wrong);
    }
  }
  require(context_regions(context) == 3,
          std::to_string(context_regions(context)) +
              " context regions on the initiator's lanes, expected 3");
  channel.send_value(kDone);
  channel.barrier();
  rma->close();
}

TEST_CASE("rma peers: regions registered before and after the lane opened serve both ends",
          "[rma-regions]") {
  const std::string failure = run_pair(regions_initiator, regions_target);
  INFO(failure);
  CHECK(failure.empty());
}

// The error lines loom logs while it lives, in place of stderr.
class ErrorLines {
 public:
  ErrorLines() { set_log_sink(&ErrorLines::keep, this); }
  ~ErrorLines() { set_log_sink(nullptr, nullptr); }
  ErrorLines(const ErrorLines&) = delete;
  ErrorLines& operator=(const ErrorLines&) = delete;
  [[nodiscard]] std::vector<std::string> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 private:
  static void keep(LogLevel level, std::string_view message, void* user) {
    auto* self = static_cast<ErrorLines*>(user);
    if (level < LogLevel::kError) return;
    std::lock_guard lock(self->mutex_);
    self->lines_.emplace_back(message);
  }
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// The usual order (README): the connections close, the regions stay until later. Where
// registrations are bound to endpoints (FI_MR_ENDPOINT: epmr), a lane that closes must close
// the registrations of the context's regions it holds before its endpoints, or the provider
// refuses to close them.
TEST_CASE("rma peers: lanes close cleanly while the regions they used stay registered",
          "[rma-regions]") {
  ErrorLines errors;
  {
    Context a(test_config(1));
    Context b(test_config(1));
    std::vector<std::byte> source(1 << 20);
    std::vector<std::byte> sink(1 << 20);
    Region local = a.register_memory(source.data(), source.size());
    Region remote = b.register_memory(sink.data(), sink.size());
    Listener listener = b.listen();
    RmaConnector connector = a.connect_rma(listener.handle());
    std::unique_ptr<RmaInitiator> initiator;
    std::unique_ptr<RmaTarget> target;
    poll_until([&] { return initiator && target; },
               [&] {
                 if (!initiator) initiator = connector.poll();
                 if (!target) target = listener.accept_rma();
               },
               "rma connect", 30s);
    const std::vector<std::byte> descriptor = target->export_region(remote);
    const RmaBlock block{local, 0, initiator->import_region(descriptor), 0, 4096};
    fill_pattern({source.data(), 4096}, 3);
    Request request;
    REQUIRE(post_into(initiator->write({&block, 1}, Notification{.tag = 1}), request) ==
            Status::kOk);
    Status status = Status::kInProgress;
    std::optional<Notification> seen;
    poll_until([&] { return status != Status::kInProgress && seen; },
               [&] {
                 if (status == Status::kInProgress) status = initiator->test(request);
                 if (!seen) seen = target->poll();
               },
               "the batch and its notification", 30s);
    REQUIRE(status == Status::kOk);
    REQUIRE(check_pattern({sink.data(), 4096}, 3).empty());
    initiator->close();
    target->close();
    // Their lanes close (once their last control messages are out); the regions stay.
    auto open_lanes = [](const Context& context) {
      const ContextStats stats = context.stats();
      return stats.lanes.size() + stats.closing_lanes;
    };
    poll_until([&] { return open_lanes(a) + open_lanes(b) == 0; },
               [] { std::this_thread::sleep_for(1ms); }, "the lanes to close", 30s);
    REQUIRE(local.valid());
    REQUIRE(remote.valid());
  }
  std::string lines;
  for (const std::string& line : errors.lines()) lines += line + "\n";
  INFO(lines);
  CHECK(lines.empty());
}

// Two processes, each the other's target and initiator, deregister the regions the other writes
// into at the same moment. Each deregistration waits for the other's initiator to confirm the
// revocation; that answer needs the other process's lanes to make progress while its own thread
// waits in its deregistration. Both must return well within the peer timeout, and later writes
// through the revoked descriptors must be refused.
constexpr unsigned kMutualTimeoutMs = 6000;
// Background progress turns come every 100 ms (LOOM_PEER_TIMEOUT_MS / 8, at most 100 ms): 50
// imports answered only there take 2.5 s or more.
constexpr int kMutualImports = 50;
constexpr auto kMutualImportsBound = 1500ms;

void mutual_revocation_role(Channel& channel, std::uint64_t seed) {
  Config config = test_config(1);
  config.peer_timeout_ms = kMutualTimeoutMs;
  Context context(config);
  std::vector<std::byte> source(64 << 10);
  std::vector<std::byte> sink(64 << 10);
  Region local = context.register_memory(source.data(), source.size());
  Region exported = context.register_memory(sink.data(), sink.size());
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  RmaConnector connector = context.connect_rma(recv_handle(channel));
  std::unique_ptr<RmaInitiator> initiator;
  std::unique_ptr<RmaTarget> target;
  poll_until([&] { return initiator && target; },
             [&] {
               if (!initiator) initiator = connector.poll();
               if (!target) target = listener.accept_rma();
             },
             "the connections both ways", 30s);
  channel.send_bytes(target->export_region(exported));
  const std::vector<std::byte> descriptor = channel.recv_bytes();
  // Each import asks the target whether the region is live, and the target's thread is busy
  // importing too: the answers come from lanes its own import must progress.
  const auto imports_began = Clock::now();
  for (int i = 0; i < kMutualImports; ++i) (void)initiator->import_region(descriptor);
  const auto imports_took = Clock::now() - imports_began;
  std::fprintf(stderr, "mutual revocation: %d imports took %lld ms\n", kMutualImports,
               milliseconds(imports_took));
  require(imports_took < kMutualImportsBound,
          std::to_string(kMutualImports) + " imports took " +
              std::to_string(milliseconds(imports_took)) +
              " ms: each waited for the target's background progress");
  const RemoteRegion remote = initiator->import_region(descriptor);

  const RmaBlock block{local, 0, remote, 0, 16 << 10};
  fill_pattern({source.data(), block.length}, seed);
  Request request;
  require(
      post_into(initiator->write({&block, 1}, Notification{.tag = seed}), request) == Status::kOk,
      "write: " + initiator->last_error());
  Status status = Status::kInProgress;
  std::optional<Notification> seen;
  poll_until([&] { return status != Status::kInProgress && seen; },
             [&] {
               if (status == Status::kInProgress) status = initiator->test(request);
               if (!seen) seen = target->poll();
             },
             "the batch each way and its notification", 30s);
  require(status == Status::kOk, "write batch: " + status_text(status));
  const std::uint64_t peer_seed = seed == 1 ? 2 : 1;
  require(seen->tag == peer_seed, "notification of another batch");
  require(check_pattern({sink.data(), block.length}, peer_seed).empty(), "the peer's bytes");

  channel.barrier();
  const auto began = Clock::now();
  exported.reset();
  const auto took = Clock::now() - began;
  std::fprintf(stderr, "mutual revocation: deregistering took %lld ms\n", milliseconds(took));
  require(took < std::chrono::milliseconds(kMutualTimeoutMs / 2),
          "deregistering took " + std::to_string(milliseconds(took)) +
              " ms: the peer's answer waited for its own deregistration to give up");
  // The peer's revocation reached this initiator (it answered it): its writes are refused.
  channel.barrier();
  const Posted refused = initiator->write({&block, 1}, Notification{.tag = seed + 10});
  require(
      refused.status != Status::kOk && initiator->last_error().find("revoked") != std::string::npos,
      "a write into the revoked region: " + status_text(refused.status) + ": " +
          initiator->last_error());
  channel.barrier();
  initiator->close();
  target->close();
}

TEST_CASE("rma peers: two contexts deregister regions the other writes into at the same time",
          "[rma-regions]") {
  const std::string outcome = run_pair([](Channel& c) { mutual_revocation_role(c, 1); },
                                       [](Channel& c) { mutual_revocation_role(c, 2); }, 90s);
  INFO(outcome);
  CHECK(outcome.empty());
}

// ---- [rma-shared] ----

// 8 processes with 2 connections each to one hub context. The live peers land a third of their
// batches and wait; then peer kKilled is killed and peer kStopped stopped, both in the middle of
// their streams, and the live peers are told to go on. The hub resumes the stopped one after the
// live peers finished and at least 1.5 peer timeouts passed: so they must finish while it is
// stopped (else the case times out), and none may wait as long as a peer timeout for a
// notification meanwhile (as it would behind the dead peer's detection).
constexpr std::size_t kStarPeers = 8;
constexpr std::size_t kConnsPerPeer = 2;
constexpr std::size_t kStarConns = kStarPeers * kConnsPerPeer;
constexpr std::size_t kKilled = 6;
constexpr std::size_t kStopped = 7;
constexpr std::uint64_t kStarBatches = 150;    // per connection of a live peer
constexpr std::uint64_t kDoomedBatches = 300;  // still streaming when the events come
constexpr std::uint64_t kBeforeEvents = 20;    // landed on a doomed peer's connection before them
constexpr std::uint64_t kLiveFirst = kStarBatches / 3;  // a live peer's batches before them
// Long enough that a live connection held up until the dead peer is detected (or the stopped
// one resumes) is told from one slowed by a loaded machine.
constexpr unsigned kStarTimeoutMs = 3000;
constexpr Shape kStarShape{.max_blocks = 8, .small_max = 512, .max_gap = 64};
// Every batch of a connection has its own place in its window: the hub reports no progress.
constexpr std::size_t kStarWindowBytes = 3 << 20;
static_assert(kDoomedBatches * (8 * (512 + 64) + 64) <= kStarWindowBytes);

Config star_config() {
  Config config = test_config(1);
  config.peer_timeout_ms = kStarTimeoutMs;
  return config;
}

bool doomed_peer(std::size_t peer) {
  return peer == kKilled || peer == kStopped;
}

// What a peer's connection saw of its batches.
struct StarReport {
  std::uint64_t posted = 0;
  std::uint64_t ok = 0;
  std::uint64_t peer_error = 0;
  bool ok_first = false;
};

void star_peer(Channel& channel, std::size_t peer) {
  Context context(star_config());
  std::vector<std::byte> staging(kConnsPerPeer * kStarWindowBytes);
  Region local = context.register_memory(staging.data(), staging.size());
  channel.send_value<int>(static_cast<int>(::getpid()));
  const Handle handle = recv_handle(channel);
  std::vector<std::unique_ptr<RmaInitiator>> rmas;
  std::vector<WriteStream> streams;
  std::size_t first_endpoints = 0;
  for (std::size_t c = 0; c < kConnsPerPeer; ++c) {
    rmas.push_back(connect_rma_one(context, handle));
    const RemoteRegion remote = rmas.back()->import_region(channel.recv_bytes());
    channel.send_value<int>(static_cast<int>(c));
    if (c == 0) first_endpoints = endpoints(context.stats());
    const std::size_t t = peer * kConnsPerPeer + c;
    streams.emplace_back(WriteStream::Setup{
        .rma = rmas.back().get(),
        .local = local,
        .local_bytes = std::span(staging).subspan(c * kStarWindowBytes, kStarWindowBytes),
        .local_offset = c * kStarWindowBytes,
        .remote = remote,
        .remote_offset = t * kStarWindowBytes,
        .remote_size = kStarWindowBytes,
        .stream = 100 + t,
        .shape = kStarShape,
        .tag = 100 + t,
        .limit = doomed_peer(peer) ? kDoomedBatches : kLiveFirst,
        .window = 16});
  }
  require(endpoints(context.stats()) == first_endpoints,
          "the second connection added endpoints to the initiator's context");
  require(rmas[0]->stats().lane_id == rmas[1]->stats().lane_id,
          "one process's connections to one target are on different lanes");
  channel.barrier();
  // The live ones wait for the hub's word after kLiveFirst; the doomed ones for its order to
  // stop or die (two_process.hpp: between calls, with their batches in flight).
  bool told = false;
  std::uint64_t last_ended = 0;
  poll_until(
      [&] {
        return told &&
               std::all_of(streams.begin(), streams.end(), [](auto& s) { return s.done(); });
      },
      [&] {
        if (doomed_peer(peer) && !told) {
          told = obey_signal(channel);
        } else if (!told && channel.readable()) {
          require(channel.recv_value<std::uint64_t>() == kStarBatches, "hub out of step");
          for (WriteStream& stream : streams) stream.extend(kStarBatches);
          told = true;
        }
        std::uint64_t ended = 0;
        for (WriteStream& stream : streams) {
          const Status status = stream.post();
          require(status == Status::kOk || (peer == kStopped && status == Status::kPeerError),
                  "peer " + std::to_string(peer) + ": post " + status_text(status) + ": " +
                      stream.refusal());
          stream.test();
          ended += stream.ended();
        }
        // Nine processes share the machine's cores: one whose batches did not move lets the
        // others (the hub above all, whose progress carries shm's writes) have the CPU, as
        // RmaInitiator::wait would.
        if (ended == last_ended) std::this_thread::sleep_for(200us);
        last_ended = ended;
      },
      "peer " + std::to_string(peer) + "'s streams", 150s);
  for (const WriteStream& stream : streams) {
    channel.send_value(StarReport{.posted = stream.records().size(),
                                  .ok = stream.count(Status::kOk),
                                  .peer_error = stream.count(Status::kPeerError),
                                  .ok_first = stream.ok_is_prefix()});
  }
  channel.barrier();
  for (auto& rma : rmas) rma->close();
}

void star_hub(std::span<Channel> channels) {
  Context context(star_config());
  std::vector<std::byte> sink(kStarConns * kStarWindowBytes);
  Region region = context.register_memory(sink.data(), sink.size());
  Listener listener = context.listen();
  std::vector<std::unique_ptr<RmaTarget>> targets;
  std::vector<NotificationCheck> checks;
  std::vector<int> pids;
  auto poll_all = [&] {
    for (std::size_t t = 0; t < targets.size(); ++t)
      if (auto n = targets[t]->poll()) checks[t].check(*n);
  };
  std::size_t first_endpoints = 0;
  // One peer at a time, so that the listener's next connection is that peer's.
  for (std::size_t p = 0; p < kStarPeers; ++p) {
    pids.push_back(channels[p].recv_value<int>());
    send_handle(channels[p], listener.handle());
    for (std::size_t c = 0; c < kConnsPerPeer; ++c) {
      std::unique_ptr<RmaTarget> target;
      poll_until([&] { return target != nullptr; },
                 [&] {
                   target = listener.accept_rma();
                   poll_all();
                 },
                 "accept_rma", 30s);
      const std::size_t t = targets.size();
      checks.emplace_back(
          std::span<const std::byte>(sink).subspan(t * kStarWindowBytes, kStarWindowBytes), 100 + t,
          kStarShape, 100 + t);
      targets.push_back(std::move(target));
      channels[p].send_bytes(targets[t]->export_region(region));
      poll_until([&] { return channels[p].readable(); }, poll_all, "the import", 30s);
      require(channels[p].recv_value<int>() == static_cast<int>(c), "peer out of step");
      if (t == 0) first_endpoints = endpoints(context.stats());
    }
  }
  const std::size_t all_endpoints = endpoints(context.stats());
  std::fprintf(stderr,
               "rma shared: the target context has %zu endpoints for 1 connection, %zu for %zu\n",
               first_endpoints, all_endpoints, kStarConns);
  require(all_endpoints == first_endpoints,
          "the target context's endpoints grew with its connections");
  for (const auto& target : targets) {
    const RmaStats stats = target->stats();
    require(stats.lane_id == targets[0]->stats().lane_id, "the connections are on different lanes");
    require(stats.lane_comms == kStarConns, std::to_string(stats.lane_comms) +
                                                " connections share the lane, expected " +
                                                std::to_string(kStarConns));
  }
  for (Channel& channel : channels) channel.barrier();

  auto live = [](std::size_t t) { return !doomed_peer(t / kConnsPerPeer); };
  auto live_done = [&] {
    for (std::size_t t = 0; t < kStarConns; ++t)
      if (live(t) && checks[t].seen() < kStarBatches) return false;
    return true;
  };
  Clock::time_point events{}, resumed{};
  Clock::duration gap{};  // the longest a live connection waited for a notification after them
  poll_until(
      [&] {
        return live_done() && resumed != Clock::time_point{} && channels[kStopped].readable();
      },
      [&] {
        for (std::size_t t = 0; t < kStarConns; ++t) {
          const Clock::time_point before = checks[t].last();
          const auto n = targets[t]->poll();
          if (!n) continue;
          checks[t].check(*n);
          if (events != Clock::time_point{} && live(t) && checks[t].seen() <= kStarBatches)
            gap = std::max(gap, checks[t].last() - std::max(before, events));
        }
        const auto now = Clock::now();
        if (events == Clock::time_point{} && [&] {
              for (std::size_t t = 0; t < kStarConns; ++t)
                if (checks[t].seen() < (live(t) ? kLiveFirst : kBeforeEvents)) return false;
              return true;
            }()) {
          order_signal(channels[kKilled], SIGKILL);
          order_signal(channels[kStopped], SIGSTOP);
          events = now;
          for (std::size_t p = 0; p < kStarPeers; ++p)
            if (!doomed_peer(p)) channels[p].send_value(kStarBatches);
        }
        if (events != Clock::time_point{} && resumed == Clock::time_point{} && live_done() &&
            now - events > std::chrono::milliseconds(kStarTimeoutMs * 3 / 2)) {
          ::kill(pids[kStopped], SIGCONT);
          resumed = now;
        }
      },
      "the live peers' streams and the stopped peer's report", 180s);
  std::fprintf(stderr,
               "rma shared: after the kill and the stop, live connections waited at most %lld ms "
               "for a notification\n",
               milliseconds(gap));
  require(gap < std::chrono::milliseconds(kStarTimeoutMs),
          "a live connection waited " + std::to_string(milliseconds(gap)) +
              " ms: it was held up by the killed or stopped peer");
  for (std::size_t p = 0; p < kStarPeers; ++p) {
    if (p == kKilled) continue;
    for (std::size_t c = 0; c < kConnsPerPeer; ++c) {
      const std::size_t t = p * kConnsPerPeer + c;
      const auto report = channels[p].recv_value<StarReport>();
      const std::string what = "peer " + std::to_string(p) + " connection " + std::to_string(c);
      std::fprintf(stderr, "%s: %llu posted, %llu kOk, %llu kPeerError, %llu notified so far\n",
                   what.c_str(), static_cast<unsigned long long>(report.posted),
                   static_cast<unsigned long long>(report.ok),
                   static_cast<unsigned long long>(report.peer_error),
                   static_cast<unsigned long long>(checks[t].seen()));
      require(report.ok + report.peer_error == report.posted && report.ok_first,
              what + ": batches that did not end kOk then kPeerError");
      // Every batch that ended kOk was notified: what is still on its way arrives.
      poll_until([&] { return checks[t].seen() >= report.ok; },
                 [&] {
                   if (auto n = targets[t]->poll()) checks[t].check(*n);
                 },
                 what + "'s notifications of its kOk batches", 10s);
      require(checks[t].seen() <= report.ok, what + ": more notifications than kOk batches");
      if (p != kStopped) {
        require(report.ok == kStarBatches && checks[t].seen() == kStarBatches,
                what + ": not every batch landed");
      }
    }
  }
  for (auto& target : targets) target->close();
  for (std::size_t p = 0; p < kStarPeers; ++p)
    if (p != kKilled) channels[p].barrier();
}

// The other way round: one initiator context writes to 3 target processes, its connections on
// one send lane. Target kFanStopped is stopped and kFanKilled killed mid-stream (blocks up to
// 12 KiB: above shm's inject size, where shm completes a delivery-complete write only once the
// peer answered, in the order the endpoint posted them: such writes to a stopped target held up
// every other target's until the test timed out). The live target's batches must go on
// meanwhile (none waits as long as a peer timeout), the doomed ones end kOk then kPeerError,
// and no notification comes for a batch that did not end kOk.
constexpr std::size_t kFanPeers = 3;
constexpr std::size_t kFanLive = 0;
constexpr std::size_t kFanStopped = 1;
constexpr std::size_t kFanKilled = 2;
constexpr std::uint64_t kFanBatches = 240;  // per stream; the doomed ones never get there
constexpr std::uint64_t kFanBefore = 20;    // landed on every stream before the events
constexpr Shape kFanShape{.max_blocks = 4, .small_max = 12 << 10, .max_gap = 64};
constexpr std::size_t kFanWindowBytes = 12 << 20;  // every batch has its own place
static_assert(kFanBatches * (4 * ((12 << 10) + 64) + 64) <= kFanWindowBytes);

void fan_target(Channel& channel, std::size_t peer) {
  Context context(star_config());
  std::vector<std::byte> sink(kFanWindowBytes);
  Region region = context.register_memory(sink.data(), sink.size());
  Listener listener = context.listen();
  channel.send_value<int>(static_cast<int>(::getpid()));
  send_handle(channel, listener.handle());
  std::unique_ptr<RmaTarget> target = accept_rma_one(listener);
  channel.send_bytes(target->export_region(region));
  NotificationCheck check(std::span<const std::byte>(sink), 200 + peer, kFanShape, 200 + peer);
  // A doomed target first takes the hub's order to stop or die (two_process.hpp: between
  // calls). Until the hub's word (how many batches it saw end kOk); then what is still on its
  // way.
  bool obeyed = peer == kFanLive;
  poll_until([&] { return obeyed && channel.readable(); },
             [&] {
               if (!obeyed) obeyed = obey_signal(channel);
               if (auto n = target->poll()) {
                 check.check(*n);
               } else {
                 std::this_thread::sleep_for(100us);
               }
             },
             "the hub's word", 120s);
  const auto ok = channel.recv_value<std::uint64_t>();
  const auto until = Clock::now() + 5s;
  while (check.seen() < ok && Clock::now() < until) {
    if (auto n = target->poll()) check.check(*n);
  }
  channel.send_value<std::uint64_t>(check.seen());
  channel.barrier();
  target->close();
}

void fan_initiator(std::span<Channel> channels) {
  Context context(star_config());
  std::vector<std::byte> staging(kFanPeers * kFanWindowBytes);
  Region local = context.register_memory(staging.data(), staging.size());
  std::vector<int> pids;
  std::vector<std::unique_ptr<RmaInitiator>> rmas;
  std::vector<WriteStream> streams;
  for (std::size_t p = 0; p < kFanPeers; ++p) {
    pids.push_back(channels[p].recv_value<int>());
    rmas.push_back(connect_rma_one(context, recv_handle(channels[p])));
    const RemoteRegion remote = rmas.back()->import_region(channels[p].recv_bytes());
    streams.emplace_back(WriteStream::Setup{
        .rma = rmas.back().get(),
        .local = local,
        .local_bytes = std::span(staging).subspan(p * kFanWindowBytes, kFanWindowBytes),
        .local_offset = p * kFanWindowBytes,
        .remote = remote,
        .remote_offset = 0,
        .remote_size = kFanWindowBytes,
        .stream = 200 + p,
        .shape = kFanShape,
        .tag = 200 + p,
        .limit = kFanBatches,
        .window = 16,
        .test_all = true});
  }
  for (const auto& rma : rmas) {
    require(rma->stats().lane_id == rmas[0]->stats().lane_id,
            "the initiator's connections are on different lanes");
  }
  Clock::time_point events{};
  Clock::time_point last_live = Clock::now();
  Clock::duration gap{};  // the longest the live stream went without a batch ending, after them
  poll_until(
      [&] {
        return std::all_of(streams.begin(), streams.end(),
                           [](const WriteStream& s) { return s.done(); });
      },
      [&] {
        for (std::size_t p = 0; p < kFanPeers; ++p) {
          const Status status = streams[p].post();
          require(status == Status::kOk || (p != kFanLive && status == Status::kPeerError),
                  "stream " + std::to_string(p) + ": post " + status_text(status) + ": " +
                      streams[p].refusal());
          const std::uint64_t before = streams[p].ended();
          streams[p].test();
          if (p == kFanLive && streams[p].ended() != before) {
            const auto now = Clock::now();
            if (events != Clock::time_point{})
              gap = std::max(gap, now - std::max(last_live, events));
            last_live = now;
          }
        }
        if (events == Clock::time_point{} &&
            std::all_of(streams.begin(), streams.end(),
                        [](const WriteStream& s) { return s.ended() >= kFanBefore; })) {
          // On shm they may all be done: its writes complete in the call where it copies them.
          std::fprintf(stderr,
                       "rma fan-out: %zu and %zu batches in flight to the stopped and the killed "
                       "target\n",
                       streams[kFanStopped].in_flight(), streams[kFanKilled].in_flight());
          order_signal(channels[kFanStopped], SIGSTOP);
          order_signal(channels[kFanKilled], SIGKILL);
          events = Clock::now();
        }
      },
      "the streams", 150s);
  std::fprintf(stderr,
               "rma fan-out: after the stop and the kill the live target's batches waited at "
               "most %lld ms\n",
               milliseconds(gap));
  ::kill(pids[kFanStopped], SIGCONT);
  require(gap < std::chrono::milliseconds(kStarTimeoutMs),
          "the live target's batches waited " + std::to_string(milliseconds(gap)) +
              " ms: held up by the stopped or killed target");
  for (std::size_t p = 0; p < kFanPeers; ++p) {
    const WriteStream& stream = streams[p];
    const std::string what = "stream " + std::to_string(p);
    std::fprintf(stderr, "%s: %zu posted, %zu kOk, %zu kPeerError\n", what.c_str(),
                 stream.records().size(), stream.count(Status::kOk),
                 stream.count(Status::kPeerError));
    require(stream.ok_is_prefix(), what + ": a batch ended kOk after one failed");
    if (p == kFanLive) {
      require(stream.count(Status::kOk) == kFanBatches, what + ": " + stream.error());
    } else {
      require(
          stream.count(Status::kOk) + stream.count(Status::kPeerError) == stream.records().size(),
          what + ": a batch ended neither kOk nor kPeerError: " + stream.error());
      require(stream.count(Status::kPeerError) > 0, what + ": no batch failed");
    }
    if (p == kFanKilled) continue;
    channels[p].send_value<std::uint64_t>(stream.count(Status::kOk));
    const auto seen = channels[p].recv_value<std::uint64_t>();
    // The stopped target's connection failed while it was stopped: notifications of its last
    // kOk batches may have failed with it, but none may come for a batch that did not end kOk.
    require(p == kFanLive ? seen == kFanBatches : seen <= stream.count(Status::kOk),
            what + ": " + std::to_string(seen) + " notified of " +
                std::to_string(stream.count(Status::kOk)) + " kOk batches");
  }
  for (std::size_t p = 0; p < kFanPeers; ++p)
    if (p != kFanKilled) channels[p].barrier();
  for (auto& rma : rmas) rma->close();
}

TEST_CASE(
    "rma peers: one initiator's connections to 3 targets share its lane; a stopped and a killed "
    "target hold up none of the others",
    "[rma-shared]") {
  const StarOutcome outcome = run_star(fan_initiator, fan_target, kFanPeers, 180s);
  INFO(outcome.hub);
  CHECK(outcome.hub.empty());
  for (std::size_t p = 0; p < kFanPeers; ++p) {
    INFO("target " << p);
    CHECK(outcome.peers[p] == (p == kFanKilled ? "child killed by signal 9" : ""));
  }
}

TEST_CASE(
    "rma peers: 16 connections share the target's lane; a killed and a stopped peer hold "
    "up none of the others",
    "[rma-shared]") {
  const StarOutcome outcome = run_star(star_hub, star_peer, kStarPeers, 180s);
  INFO(outcome.hub);
  CHECK(outcome.hub.empty());
  for (std::size_t p = 0; p < kStarPeers; ++p) {
    INFO("peer " << p);
    CHECK(outcome.peers[p] == (p == kKilled ? "child killed by signal 9" : ""));
  }
}

}  // namespace
}  // namespace loom::test
