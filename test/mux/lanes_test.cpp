// N:m grouping across two processes: 64 communicators share exactly m = 4 lanes on each side,
// all move verified data at once, and closing them in random order while the others keep
// sending frees each lane's endpoints when its last communicator leaves.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "support/endpoints.hpp"
#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

constexpr std::size_t kComms = 64;
constexpr unsigned kGroups = 4;
constexpr std::size_t kSlot = 200000;

std::size_t size_of(std::size_t comm, std::size_t round) {
  // Interleaves eager (< 16 KiB) and rendezvous sizes across communicators and rounds.
  return (comm + round) % 3 == 0 ? 40000 + comm * 97 : 1 + (comm * 7919 + round * 104729) % 9000;
}

std::uint64_t seed_of(std::size_t comm, std::size_t round) {
  return comm * 100000 + round;
}

Config grouped_config() {
  Config config = test_config(1);
  config.ngroups = kGroups;
  return config;
}

std::string provider_family(const Context& context) {
  const std::string name = context.nics().front().provider;
  return name.substr(0, name.find(';'));
}

// Lanes with communicators of one direction (each side of this test has only one).
std::size_t lanes(const Context& context, bool send) {
  const auto stats = context.stats();
  return static_cast<std::size_t>(
      std::count_if(stats.lanes.begin(), stats.lanes.end(),
                    [&](const auto& l) { return (send ? l.send_comms : l.recv_comms) != 0; }));
}

// Endpoints loom reports for its lanes.
std::size_t lane_endpoints(const Context& context) {
  std::size_t total = 0;
  for (const auto& lane : context.stats().lanes) total += lane.endpoints;
  return total;
}

// The order both sides close communicators in, and which stay open after each step.
std::vector<std::size_t> close_order() {
  std::vector<std::size_t> order(kComms);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(64));
  return order;
}

// Lanes still needed once `closed` communicators are gone: comm i is in group i % m.
std::size_t groups_alive(const std::vector<bool>& open) {
  std::vector<bool> alive(kGroups, false);
  for (std::size_t i = 0; i < kComms; ++i)
    if (open[i]) alive[i % kGroups] = true;
  return static_cast<std::size_t>(std::count(alive.begin(), alive.end(), true));
}

template <typename Comm>
void check_lanes(const Context& context, bool send, const std::vector<bool>& open,
                 std::size_t endpoints_before) {
  const std::size_t expected = groups_alive(open);
  require(lanes(context, send) == expected, "lanes " + std::to_string(lanes(context, send)) +
                                                ", expected " + std::to_string(expected));
  const std::size_t endpoints = lane_endpoints(context);
  require(endpoints == expected * 2, "loom reports " + std::to_string(endpoints) + " endpoints");
  // A lane left by its last communicator closes once its close notice is out.
  poll_until([&] { return context.stats().closing_lanes == 0; }, [] {}, "closing lanes to close",
             10s);
  const std::size_t held = provider_endpoints(provider_family(context));
  require(held == endpoints_before + endpoints, "the provider holds " + std::to_string(held) +
                                                    " endpoints, loom accounts for " +
                                                    std::to_string(endpoints_before + endpoints));
}

void receiver(Channel& channel) {
  Context context(grouped_config());
  const std::size_t base = provider_endpoints(provider_family(context));  // bootstrap endpoint
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  std::vector<std::unique_ptr<RecvComm>> comms;
  for (std::size_t i = 0; i < kComms; ++i) {
    comms.push_back(accept_one(listener));  // the sender connects one at a time: same order
    channel.barrier();
  }
  std::vector<bool> open(kComms, true);
  check_lanes<RecvComm>(context, false, open, base);
  std::vector<std::byte> slab(kComms * kSlot);
  const CloseOnUnwind guard{comms};  // before the slab is freed
  std::vector<MemoryRegion> regions(kComms);
  for (std::size_t i = 0; i < kComms; ++i) {
    regions[i] = comms[i]->register_memory(slab.data() + i * kSlot, kSlot);
  }
  const auto order = close_order();
  // Round r: every open communicator but the one closing this round gets a message; the
  // closing one closes while the others' messages are in flight.
  for (std::size_t round = 0; round <= kComms; ++round) {
    const std::size_t closing = round < kComms ? order[round] : kComms;
    std::vector<std::pair<std::size_t, Request>> pending;
    for (std::size_t i = 0; i < kComms; ++i) {
      if (!open[i] || i == closing) continue;
      RecvBuffer b{slab.data() + i * kSlot, kSlot, static_cast<Tag>(round), regions[i]};
      Request r;
      require(post_into(comms[i]->irecv({&b, 1}), r) == Status::kOk, comms[i]->last_error());
      pending.emplace_back(i, r);
    }
    channel.barrier();
    if (closing < kComms) {
      comms[closing]->close();
      open[closing] = false;
    }
    for (auto [i, r] : pending) {
      const std::size_t got = finish(*comms[i], r);
      require(got == size_of(i, round), "comm " + std::to_string(i) + " round " +
                                            std::to_string(round) + ": size " +
                                            std::to_string(got));
      auto error = check_pattern({slab.data() + i * kSlot, got}, seed_of(i, round));
      require(error.empty(),
              "comm " + std::to_string(i) + " round " + std::to_string(round) + ": " + error);
    }
    channel.barrier();
    check_lanes<RecvComm>(context, false, open, base);
  }
  require(context.stats().lanes.empty(), "lanes left after every communicator closed");
}

void sender(Channel& channel) {
  Context context(grouped_config());
  const std::size_t base = provider_endpoints(provider_family(context));
  const Handle handle = recv_handle(channel);
  std::vector<std::unique_ptr<SendComm>> comms;
  for (std::size_t i = 0; i < kComms; ++i) {
    comms.push_back(connect_one(context, handle));
    channel.barrier();
  }
  std::vector<bool> open(kComms, true);
  check_lanes<SendComm>(context, true, open, base);
  std::vector<std::byte> slab(kComms * kSlot);
  const CloseOnUnwind guard{comms};  // before the slab is freed
  std::vector<MemoryRegion> regions(kComms);
  for (std::size_t i = 0; i < kComms; ++i) {
    regions[i] = comms[i]->register_memory(slab.data() + i * kSlot, kSlot);
  }
  const auto order = close_order();
  for (std::size_t round = 0; round <= kComms; ++round) {
    const std::size_t closing = round < kComms ? order[round] : kComms;
    channel.barrier();
    std::vector<std::pair<std::size_t, Request>> pending;
    for (std::size_t i = 0; i < kComms; ++i) {
      if (!open[i] || i == closing) continue;
      std::byte* data = slab.data() + i * kSlot;
      fill_pattern({data, size_of(i, round)}, seed_of(i, round));
      Request r;
      require(
          post_into(comms[i]->isend(data, size_of(i, round), static_cast<Tag>(round), regions[i]),
                    r) == Status::kOk,
          comms[i]->last_error());
      pending.emplace_back(i, r);
    }
    if (closing < kComms) {
      comms[closing]->close();
      open[closing] = false;
    }
    for (auto [i, r] : pending) finish(*comms[i], r);
    channel.barrier();
    check_lanes<SendComm>(context, true, open, base);
  }
  require(context.stats().lanes.empty(), "lanes left after every communicator closed");
}

}  // namespace

TEST_CASE("mux 64 communicators share 4 lanes and close in random order", "[pair]") {
  auto failure = run_pair(receiver, sender, 600s);
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("mux without grouping gives every communicator its own lane", "[pair]") {
  constexpr std::size_t kUngrouped = 8;
  auto side = [&](Channel& channel, bool listen_side) {
    Config config = test_config(1);
    config.ngroups = 0;
    Context context(config);
    std::vector<std::unique_ptr<Communicator>> comms;
    if (listen_side) {
      Listener listener = context.listen();
      send_handle(channel, listener.handle());
      for (std::size_t i = 0; i < kUngrouped; ++i) comms.push_back(accept_one(listener));
    } else {
      const Handle handle = recv_handle(channel);
      for (std::size_t i = 0; i < kUngrouped; ++i) comms.push_back(connect_one(context, handle));
    }
    require(context.stats().lanes.size() == kUngrouped,
            std::to_string(context.stats().lanes.size()) + " lanes for " +
                std::to_string(kUngrouped) + " ungrouped communicators");
    channel.barrier();
  };
  auto failure = run_pair([&](Channel& c) { side(c, true); }, [&](Channel& c) { side(c, false); });
  INFO(failure);
  REQUIRE(failure.empty());
}

}  // namespace loom::test
