// One-sided connections within one process (two contexts): batches of writes and reads with
// every byte checked, notifications in post order seen only once their batch landed,
// descriptors refused when corrupt, foreign or stale, blocks refused out of range, writes into a
// deregistered region failing at the initiator and landing nowhere.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "loom/loom.hpp"
#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

struct RmaPair {
  std::unique_ptr<RmaInitiator> initiator;
  std::unique_ptr<RmaTarget> target;
};

RmaPair connect_rma(Context& from, Context& to, Listener& listener) {
  RmaConnector connector = from.connect_rma(listener.handle());
  RmaPair pair;
  poll_until([&] { return pair.initiator && pair.target; },
             [&] {
               if (!pair.initiator) pair.initiator = connector.poll();
               if (!pair.target) pair.target = listener.accept_rma();
             },
             "rma connect", 30s);
  (void)to;
  return pair;
}

// Both contexts live in this process: the target's lane progresses when the target polls (its
// context's background thread is slow), and shm's writes and reads need the target's progress.
// Only call it with no notification pending.
Status finish_batch(RmaInitiator& initiator, Request request, RmaTarget* target = nullptr) {
  Status status = Status::kInProgress;
  poll_until([&] { return status != Status::kInProgress; },
             [&] {
               status = initiator.test(request);
               if (target != nullptr) REQUIRE(!target->poll().has_value());
             },
             "batch", 60s);
  return status;
}

// Polls the target for the notification while the initiator tests its batch (the notification
// leaves once the initiator's progress saw the batch's last completion). Returns the batch's
// status and the notification; `on_notification` runs the moment it is seen.
template <typename OnNotification>
std::pair<Status, Notification> land(RmaInitiator& initiator, Request request, RmaTarget& target,
                                     OnNotification&& on_notification) {
  Status status = Status::kInProgress;
  std::optional<Notification> notification;
  poll_until([&] { return status != Status::kInProgress && notification.has_value(); },
             [&] {
               if (status == Status::kInProgress) status = initiator.test(request);
               if (!notification) {
                 notification = target.poll();
                 if (notification) on_notification(*notification);
               }
             },
             "batch and its notification", 60s);
  return {status, *notification};
}

// TEST_EXPECT_DELIVERY_WAITS (test/meson.build): which writes of a batch wait for delivery on
// this provider: "last" (the last per rail: it declares FI_ORDER_WAW for writes of any size) or
// "none" (it completes writes only once the peer took them: shm).
std::string expect_delivery_waits() {
  const char* value = std::getenv("TEST_EXPECT_DELIVERY_WAITS");
  REQUIRE(value != nullptr);
  return value;
}

TEST_CASE("rma write and read batches land whole, notified in post order", "[rma]") {
  // loom's protocol, and NIXL's (remote CQ data counted per block) that the bench compares.
  const NotifyProtocol protocol =
      GENERATE(NotifyProtocol::kAfterCompletion, NotifyProtocol::kCountedCqData);
  Context a(test_config(1));
  Context b(test_config(1));
  constexpr std::size_t kSlab = 8 << 20;
  std::vector<std::byte> source(kSlab);
  std::vector<std::byte> sink(kSlab);
  Region local = a.register_memory(source.data(), source.size());
  Region remote = b.register_memory(sink.data(), sink.size());
  Listener listener = b.listen();
  RmaPair pair = connect_rma(a, b, listener);
  const std::vector<std::byte> descriptor = pair.target->export_region(remote);
  const RemoteRegion imported = pair.initiator->import_region(descriptor);

  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    // Blocks of random sizes at random disjoint places, each its own pattern.
    const std::size_t count = 1 + rng() % 64;
    std::vector<RmaBlock> blocks;
    std::size_t cursor = rng() % 4096;
    for (std::size_t i = 0; i < count && cursor < kSlab / 2; ++i) {
      const std::size_t length = 1 + rng() % (i % 8 == 0 ? 300000 : 9000);
      if (cursor + length > kSlab / 2) break;
      blocks.push_back({.local = local,
                        .local_offset = cursor,
                        .remote = imported,
                        .remote_offset = kSlab / 2 + cursor,
                        .length = length});
      fill_pattern({source.data() + cursor, length}, round * 1000 + i);
      cursor += length + rng() % 512;
    }
    Request request;
    const std::uint64_t waits_before = pair.initiator->stats().delivery_waits;
    REQUIRE(post_into(pair.initiator->write(blocks, Notification{.tag = 42, .value = 1000u + round},
                                            protocol),
                      request) == Status::kOk);
    const auto [status, seen] = land(*pair.initiator, request, *pair.target, [&](auto&) {
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        const RmaBlock& block = blocks[i];
        REQUIRE(check_pattern({sink.data() + block.remote_offset, block.length}, round * 1000 + i)
                    .empty());
      }
    });
    REQUIRE(status == Status::kOk);
    // Where the provider places writes in post order (tcp;ofi_rxm, and epmr forwarding to it)
    // only the batch's last write on the one data rail waits for delivery; on shm none does
    // (the bytes were checked above, the moment the notification came); counted CQ data none.
    const std::uint64_t waits = pair.initiator->stats().delivery_waits - waits_before;
    const std::string expected = expect_delivery_waits();
    REQUIRE((expected == "last" || expected == "none"));
    CHECK(waits == (protocol == NotifyProtocol::kCountedCqData || expected == "none" ? 0 : 1));
    CHECK(seen.tag == 42);
    CHECK(seen.value == 1000u + round);
    CHECK(seen.blocks == blocks.size());
    // Read them back into the other half of the source slab.
    std::vector<RmaBlock> reads = blocks;
    for (RmaBlock& block : reads) block.local_offset += kSlab / 2;
    REQUIRE(post_into(pair.initiator->read(reads), request) == Status::kOk);
    REQUIRE(finish_batch(*pair.initiator, request, pair.target.get()) == Status::kOk);
    for (std::size_t i = 0; i < reads.size(); ++i) {
      REQUIRE(
          check_pattern({source.data() + reads[i].local_offset, reads[i].length}, round * 1000 + i)
              .empty());
    }
  }
  pair.initiator->close();
  pair.target->close();
}

TEST_CASE("rma bad descriptors and blocks are refused before anything is posted", "[rma]") {
  Context a(test_config(1));
  Context b(test_config(1));
  std::vector<std::byte> source(1 << 20);
  std::vector<std::byte> sink(1 << 20);
  Region local = a.register_memory(source.data(), source.size());
  Region remote = b.register_memory(sink.data(), sink.size());
  Listener listener = b.listen();
  RmaPair pair = connect_rma(a, b, listener);
  std::vector<std::byte> descriptor = pair.target->export_region(remote);

  auto import_error = [&](std::vector<std::byte> bytes) {
    try {
      (void)pair.initiator->import_region(bytes);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("imported");
  };
  {
    auto bad = descriptor;
    bad[0] = std::byte{0};
    CHECK_THAT(import_error(bad), Catch::Contains("bad magic"));
    bad = descriptor;
    bad[4] = std::byte{99};
    CHECK_THAT(import_error(bad), Catch::Contains("another version"));
    bad = descriptor;
    bad.pop_back();
    CHECK_THAT(import_error(bad), Catch::Contains("truncated"));
    bad = descriptor;
    bad.push_back(std::byte{0});
    CHECK_THAT(import_error(bad), Catch::Contains("trailing"));
    bad = descriptor;
    bad[8] = static_cast<std::byte>(static_cast<unsigned>(bad[8]) ^ 1u);  // the context id
    CHECK_THAT(import_error(bad), Catch::Contains("another context"));
    CHECK_THAT(import_error({}), Catch::Contains("too short"));
  }
  const RemoteRegion imported = pair.initiator->import_region(descriptor);

  auto refused = [&](RmaBlock block, const char* why) {
    Request request;
    CHECK(post_into(pair.initiator->write({&block, 1}), request) == Status::kInvalid);
    CHECK_THAT(pair.initiator->last_error(), Catch::Contains(why));
  };
  refused({local, 0, imported, sink.size() - 10, 11}, "outside the remote region");
  refused({local, source.size() - 10, imported, 0, 11}, "outside the local region");
  refused({local, 0, imported, 0, 0}, "empty block");
  refused({local, 0, RemoteRegion{}, 0, 8}, "empty remote region");
  refused({MemoryRegion{}, 0, imported, 0, 8}, "empty local region");
  CHECK(pair.initiator->write({}).status == Status::kInvalid);
  pair.initiator->close();
  pair.target->close();
}

TEST_CASE("rma a region the target deregistered is unreachable before deregistration returns",
          "[rma]") {
  Context a(test_config(1));
  Context b(test_config(1));
  std::vector<std::byte> source(1 << 20);
  std::vector<std::byte> sink(1 << 20);
  Region local = a.register_memory(source.data(), source.size());
  Region remote = b.register_memory(sink.data(), sink.size());
  Listener listener = b.listen();
  RmaPair pair = connect_rma(a, b, listener);
  const std::vector<std::byte> descriptor = pair.target->export_region(remote);
  const RemoteRegion imported = pair.initiator->import_region(descriptor);

  // The initiator is in this process but another context: its lane answers the revocation from
  // its context's background progress while reset() waits.
  fill_pattern({source.data(), 4096}, 5);
  remote.reset();
  RmaBlock block{local, 0, imported, 0, 4096};
  Request request;
  CHECK(post_into(pair.initiator->write({&block, 1}), request) == Status::kInvalid);
  CHECK_THAT(pair.initiator->last_error(), Catch::Contains("deregistered the remote region"));
  CHECK(std::all_of(sink.begin(), sink.end(), [](std::byte b) { return b == std::byte{0}; }));
  // The stale descriptor is refused at import; the connection stays usable with a live region.
  try {
    (void)pair.initiator->import_region(descriptor);
    FAIL("a stale descriptor was imported");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("stale"));
  }
  Region again = b.register_memory(sink.data(), sink.size());
  block.remote = pair.initiator->import_region(pair.target->export_region(again));
  REQUIRE(post_into(pair.initiator->write({&block, 1}, Notification{.tag = 1}), request) ==
          Status::kOk);
  const auto [status, seen] = land(*pair.initiator, request, *pair.target, [](auto&) {});
  CHECK(status == Status::kOk);
  CHECK(seen.bytes == 4096);
  CHECK(check_pattern({sink.data(), 4096}, 5).empty());

  pair.initiator->close();
  pair.target->close();
}

TEST_CASE("rma one-sided and two-sided connects to one listener each reach their own accept",
          "[rma]") {
  Context a(test_config(1));
  Context b(test_config(1));
  Listener listener = b.listen();
  // The one-sided connect is first in the listener's queue: accept() must pass over it. Each
  // connect's label reaches its own accept.
  RmaConnector rma_connector = a.connect_rma(listener.handle(), 0xA11CE);
  std::unique_ptr<RmaInitiator> initiator;
  std::unique_ptr<RmaTarget> target;
  poll_until([&] { return initiator != nullptr; },
             [&] {
               initiator = rma_connector.poll();
               if (!target) target = listener.accept_rma();
             },
             "rma connect", 30s);
  Connector connector = a.connect(listener.handle(), 0xB0B);
  CommPair pair = connect_both(connector, listener, "two-sided connect");
  const CloseOnUnwind guard{pair.out.get(), pair.in.get()};
  CHECK(initiator->label() == 0xA11CE);
  CHECK(target->label() == 0xA11CE);
  CHECK(pair.out->label() == 0xB0B);
  CHECK(pair.in->label() == 0xB0B);
  CHECK(listener.accept_rma() == nullptr);
  CHECK(listener.accept() == nullptr);
  // Both kinds share the lanes between the two contexts.
  CHECK(initiator->stats().lane_id == pair.out->stats().lane_id);
  CHECK(target->stats().lane_id == pair.in->stats().lane_id);
  CHECK(listener.stats().accepted == 2);
  initiator->close();
  target->close();
  CHECK(target->label() == 0);
}

}  // namespace
}  // namespace loom::test
