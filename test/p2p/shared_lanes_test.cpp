// Lanes shared across peers: a hub process and several peer processes. The hub's communicators
// to all of them share one send and one receive lane (LOOM_NGROUPS=1), so its endpoints do not
// grow with its peers; traffic to each peer stays its own, a dead peer fails only its own
// requests, and a peer that leaves makes room in the lane for the next one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <signal.h>

#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

constexpr int kPeerTimeoutMs = 2000;
// How much later than the peer timeout a dead peer's requests may fail: slack for this VM.
constexpr auto kBound = std::chrono::milliseconds(kPeerTimeoutMs + 1500);

Config hub_config() {
  Config config = test_config(1);
  config.ngroups = 1;
  config.peer_timeout_ms = kPeerTimeoutMs;
  return config;
}

// A peer's two communicators with the hub: one each way. Declared after the transfers that use
// them, so that a failure closes them before it frees buffers their receives may still write.
struct HubLink {
  std::unique_ptr<SendComm> out;
  std::unique_ptr<RecvComm> in;
};

// The peer's half of the setup: its listener's handle to the hub, the hub's back, then a
// connect to the hub and an accept from it at once.
HubLink join_hub(Context& context, Listener& listener, Channel& channel) {
  send_handle(channel, listener.handle());
  Connector connector = context.connect(recv_handle(channel));
  CommPair pair = connect_both(connector, listener, "the hub's communicators");
  return HubLink{std::move(pair.out), std::move(pair.in)};
}

// The hub's half, one peer at a time, so that the communicator its listener accepts is that
// peer's.
HubLink link_peer(Context& context, Listener& listener, Channel& channel) {
  const Handle theirs = recv_handle(channel);
  send_handle(channel, listener.handle());
  Connector connector = context.connect(theirs);
  CommPair pair = connect_both(connector, listener, "a peer's communicators");
  return HubLink{std::move(pair.out), std::move(pair.in)};
}

// A message in flight with its buffer; the seed says what it must hold.
struct Transfer {
  Communicator* comm = nullptr;
  Request* request = nullptr;
  std::vector<std::byte> buffer;
  MemoryRegion region;
  std::uint64_t seed = 0;  // receives: the pattern expected
  bool receive = false;
  bool done = false;
  Status status = Status::kOk;
  std::chrono::steady_clock::time_point ended;
};

std::uint64_t seed_of(std::size_t peer, bool to_hub, std::size_t message) {
  return 1000 * (peer + 1) + (to_hub ? 500 : 0) + message;
}

// The message's bytes, before the communicators exist where filling takes long: a peer
// busy with anything but loom for LOOM_PEER_TIMEOUT_MS is taken as dead.
void fill(Transfer& t, std::size_t size, std::uint64_t seed) {
  t.buffer.resize(size);
  fill_pattern(t.buffer, seed);
  t.seed = seed;
}

void post_send(Transfer& t, SendComm& out, std::size_t size, std::uint64_t seed) {
  t.comm = &out;
  if (t.buffer.size() != size || t.seed != seed) fill(t, size, seed);
  t.region = out.register_memory(t.buffer.data(), size);
  require(out.isend(t.buffer.data(), size, 7, t.region, t.request) == Status::kOk,
          out.last_error());
}

void post_receive(Transfer& t, RecvComm& in, std::size_t size, std::uint64_t seed) {
  t.comm = &in;
  t.receive = true;
  t.seed = seed;
  t.buffer.assign(size, std::byte{0});
  t.region = in.register_memory(t.buffer.data(), size);
  RecvBuffer target{t.buffer.data(), size, 7, t.region};
  require(in.irecv({&target, 1}, t.request) == Status::kOk, in.last_error());
}

// One test() of `t` if it is pending; true once it ended (ok or not).
bool step(Transfer& t) {
  if (t.done) return true;
  std::size_t size = 0;
  t.status = t.comm->test(t.request, t.done, {&size, 1});
  if (t.status != Status::kOk) t.done = true;
  if (!t.done) return false;
  t.ended = std::chrono::steady_clock::now();
  t.comm->deregister(t.region);  // before the buffer is freed: a registration pins it
  if (t.status == Status::kOk && t.receive) {
    require(size == t.buffer.size(), "received " + std::to_string(size) + " bytes, expected " +
                                         std::to_string(t.buffer.size()));
    const std::string error = check_pattern(t.buffer, t.seed);
    require(error.empty(), "message " + std::to_string(t.seed) + ": " + error);
  }
  return true;
}

void finish_all(std::vector<Transfer>& transfers, const std::string& what) {
  poll_until([&] { return std::all_of(transfers.begin(), transfers.end(), step); }, [] {}, what,
             60s);
  for (const Transfer& t : transfers) {
    require(t.status == Status::kOk, what + ": message " + std::to_string(t.seed) + " ended " +
                                         std::string(to_string(t.status)) + ": " +
                                         t.comm->last_error());
  }
}

// Eager, rendezvous and a size that is neither a power of two nor stripe-aligned.
constexpr std::size_t kSizes[] = {1000, 64 * 1024 + 5, 1 << 20};

// Every message of kSizes each way between this side and its peer, all in flight at once.
void post_exchange(std::vector<Transfer>& transfers, HubLink& link, std::size_t peer, bool hub) {
  for (std::size_t m = 0; m < std::size(kSizes); ++m) {
    post_receive(transfers.emplace_back(), *link.in, kSizes[m], seed_of(peer, hub, m));
    post_send(transfers.emplace_back(), *link.out, kSizes[m], seed_of(peer, !hub, m));
  }
}

const LaneDescription& only_lane(const ContextStats& stats, bool send) {
  const auto count = std::count_if(stats.lanes.begin(), stats.lanes.end(),
                                   [&](const LaneDescription& l) { return l.send == send; });
  require(count == 1, std::to_string(count) + (send ? " send" : " receive") +
                          " lanes, expected one shared by every peer");
  return *std::find_if(stats.lanes.begin(), stats.lanes.end(),
                       [&](const LaneDescription& l) { return l.send == send; });
}

std::uint64_t bytes_written(const Context& context) {
  std::uint64_t total = 0;
  for (const auto& lane : context.stats().lanes)
    for (const auto& rail : lane.rails) total += rail.bytes_written;
  return total;
}

std::size_t endpoints(const ContextStats& stats) {
  std::size_t total = 0;
  for (const auto& [nic, count] : stats.endpoints_per_nic) total += count;
  return total;
}

// Hub and peers start their traffic together: the hub progresses no lane while it links
// the other peers, so a peer that waited on it meanwhile could take it for dead.
void start_together(std::span<Channel> channels) {
  for (Channel& channel : channels) channel.barrier();
}

void peer_exchanges(Channel& channel, std::size_t index) {
  Context context(hub_config());
  Listener listener = context.listen();
  std::vector<Transfer> transfers;
  HubLink link = join_hub(context, listener, channel);
  start_together({&channel, 1});
  post_exchange(transfers, link, index, false);
  finish_all(transfers, "peer " + std::to_string(index) + "'s messages");
  channel.barrier();
}

TEST_CASE("p2p shared lanes: the hub's communicators to 4 peers share one lane each way",
          "[shared-lanes]") {
  constexpr std::size_t kPeers = 4;
  const auto hub = [&](std::span<Channel> channels) {
    Context context(hub_config());
    Listener listener = context.listen();
    std::vector<Transfer> transfers;
    std::vector<HubLink> links;
    for (Channel& channel : channels) links.push_back(link_peer(context, listener, channel));
    start_together(channels);
    const ContextStats stats = context.stats();
    require(only_lane(stats, true).peers == kPeers, "the send lane does not hold every peer");
    require(only_lane(stats, false).peers == kPeers, "the receive lane does not hold every peer");
    require(only_lane(stats, true).comms == kPeers, "send lane communicators");
    require(endpoints(stats) == 4,
            std::to_string(endpoints(stats)) + " endpoints, expected 4 (data + control, each way)");
    for (std::size_t p = 0; p < kPeers; ++p) post_exchange(transfers, links[p], p, true);
    finish_all(transfers, "the hub's messages");
    for (Channel& channel : channels) channel.barrier();
  };
  const StarOutcome outcome = run_star(hub, peer_exchanges, kPeers);
  INFO(outcome.hub);
  CHECK(outcome.hub.empty());
  for (const std::string& peer : outcome.peers) CHECK(peer.empty());
}

// Peer 0 dies while its 64 MiB message to the hub is being written, with the hub's to it
// waiting for a receive; peers 1 and 2 exchange messages with
// the hub in rounds meanwhile, and must neither fail nor stall until the death is detected.
TEST_CASE("p2p shared lanes: a peer killed mid-transfer fails only its own requests",
          "[shared-lanes]") {
  constexpr std::size_t kPeers = 3;
  constexpr std::size_t kHuge = std::size_t{64} << 20;
  constexpr std::size_t kRounds = 30;
  const auto hub = [&](std::span<Channel> channels) {
    std::vector<Transfer> doomed(2);
    fill(doomed[1], kHuge, seed_of(0, false, 0));
    Context context(hub_config());
    Listener listener = context.listen();
    std::vector<Transfer> round;
    std::vector<HubLink> links;
    for (Channel& channel : channels) links.push_back(link_peer(context, listener, channel));
    start_together(channels);
    // Peer 0 dies while its message is being written; it never posts a receive for ours.
    post_receive(doomed[0], *links[0].in, kHuge, seed_of(0, true, 0));
    post_send(doomed[1], *links[0].out, kHuge, seed_of(0, false, 0));
    std::chrono::steady_clock::time_point died;
    std::vector<std::chrono::steady_clock::time_point> round_ends;
    std::size_t rounds = 0;
    auto start_round = [&] {
      round.clear();
      for (std::size_t p = 1; p < kPeers; ++p) {
        post_receive(round.emplace_back(), *links[p].in, 256 * 1024, seed_of(p, true, rounds));
        post_send(round.emplace_back(), *links[p].out, 256 * 1024, seed_of(p, false, rounds));
      }
    };
    start_round();
    poll_until([&] { return rounds == kRounds && doomed[0].done && doomed[1].done; },
               [&] {
                 if (died == std::chrono::steady_clock::time_point{} && channels[0].peer_closed()) {
                   died = std::chrono::steady_clock::now();
                 }
                 step(doomed[0]);
                 step(doomed[1]);
                 if (rounds < kRounds && std::all_of(round.begin(), round.end(), step)) {
                   for (const Transfer& t : round) {
                     require(t.status == Status::kOk, "a live peer's message ended " +
                                                          std::string(to_string(t.status)) + ": " +
                                                          t.comm->last_error());
                   }
                   round_ends.push_back(std::chrono::steady_clock::now());
                   if (++rounds < kRounds) start_round();
                 }
               },
               "the live peers' rounds and the dead peer's failures", 90s);
    require(died != std::chrono::steady_clock::time_point{}, "peer 0 did not die");
    // Its message may have been written whole before it died (shm copies fast): then it is
    // delivered, every byte checked by step(); else it fails within the bound. Ours it never
    // took must fail.
    require(
        doomed[0].status == Status::kOk || doomed[0].status == Status::kPeerError,
        std::string("the dead peer's message ended ") + std::string(to_string(doomed[0].status)));
    require(doomed[1].status == Status::kPeerError,
            std::string("our message to the dead peer ended ") +
                std::string(to_string(doomed[1].status)));
    for (const Transfer& t : doomed) {
      require(t.status == Status::kOk || t.ended - died < kBound,
              "the dead peer's request failed later than the bound");
    }
    // The live peers kept going: no round waited for the death to be detected.
    for (std::size_t r = 1; r < round_ends.size(); ++r) {
      require(round_ends[r] - round_ends[r - 1] < std::chrono::milliseconds(kPeerTimeoutMs),
              "round " + std::to_string(r) + " of the live peers stalled");
    }
    for (std::size_t p = 1; p < kPeers; ++p) channels[p].barrier();
  };
  const auto peer = [&](Channel& channel, std::size_t index) {
    Transfer doomed;
    if (index == 0) fill(doomed, kHuge, seed_of(0, true, 0));
    Context context(hub_config());
    Listener listener = context.listen();
    std::vector<Transfer> round;
    HubLink link = join_hub(context, listener, channel);
    start_together({&channel, 1});
    if (index == 0) {
      post_send(doomed, *link.out, kHuge, seed_of(0, true, 0));
      poll_until([&] { return doomed.done || bytes_written(context) != 0; }, [&] { step(doomed); },
                 "the writes to be posted", 60s);
      for (int i = 0; i < 20 && !doomed.done; ++i) step(doomed);
      std::fflush(nullptr);
      ::raise(SIGKILL);
    }
    for (std::size_t r = 0; r < kRounds; ++r) {
      round.assign(2, Transfer{});
      post_receive(round[0], *link.in, 256 * 1024, seed_of(index, false, r));
      post_send(round[1], *link.out, 256 * 1024, seed_of(index, true, r));
      finish_all(round, "peer " + std::to_string(index) + "'s round " + std::to_string(r));
    }
    channel.barrier();
  };
  const StarOutcome outcome = run_star(hub, peer, kPeers);
  INFO(outcome.hub);
  CHECK(outcome.hub.empty());
  CHECK(outcome.peers[0] == "child killed by signal 9");
  CHECK(outcome.peers[1].empty());
  CHECK(outcome.peers[2].empty());
}

// Peer 0 stays connected throughout (so the hub's lanes stay open); peer 1 exchanges, closes
// and exits; peer 2 then connects: it joins the same lanes, and peer 1 is out of their AVs.
TEST_CASE("p2p shared lanes: a peer that leaves makes room, the next one reuses the lane",
          "[shared-lanes]") {
  const auto hub = [&](std::span<Channel> channels) {
    Context context(hub_config());
    Listener listener = context.listen();
    std::vector<Transfer> transfers;
    HubLink first = link_peer(context, listener, channels[0]);
    const ContextStats before = context.stats();
    {
      HubLink leaving = link_peer(context, listener, channels[1]);
      post_exchange(transfers, leaving, 1, true);
      finish_all(transfers, "the leaving peer's messages");
      require(only_lane(context.stats(), true).peers == 2, "two peers on the send lane");
      channels[1].barrier();  // it closes its end
      leaving.out->close();
      leaving.in->close();
    }
    // The leaving peer's addresses go once nothing to it is in flight; exchanges with peer 0
    // progress the lanes meanwhile.
    std::size_t round = 0;
    poll_until(
        [&] {
          const ContextStats now = context.stats();
          return only_lane(now, true).peers == 1 && only_lane(now, false).peers == 1;
        },
        [&] {
          channels[0].send_value<int>(1);
          transfers.clear();
          post_exchange(transfers, first, 0, true);
          finish_all(transfers, "peer 0's messages, round " + std::to_string(round++));
        },
        "the leaving peer to leave the lanes' AVs", 10s);
    HubLink next = link_peer(context, listener, channels[2]);
    const ContextStats after = context.stats();
    require(after.lanes_opened == before.lanes_opened, "a new lane opened for the next peer");
    require(only_lane(after, true).id == only_lane(before, true).id, "send lane replaced");
    require(only_lane(after, false).id == only_lane(before, false).id, "receive lane replaced");
    require(only_lane(after, true).peers == 2, "the next peer is not on the send lane");
    transfers.clear();
    post_exchange(transfers, next, 2, true);
    finish_all(transfers, "the next peer's messages");
    channels[0].send_value<int>(0);  // done
    channels[2].barrier();
  };
  const auto peer = [&](Channel& channel, std::size_t index) {
    Context context(hub_config());
    Listener listener = context.listen();
    std::vector<Transfer> transfers;
    HubLink link = join_hub(context, listener, channel);
    if (index == 0) {
      for (std::size_t r = 0; channel.recv_value<int>() == 1; ++r) {
        transfers.clear();
        post_exchange(transfers, link, 0, false);
        finish_all(transfers, "peer 0's messages, round " + std::to_string(r));
      }
      return;
    }
    post_exchange(transfers, link, index, false);
    finish_all(transfers, "peer " + std::to_string(index) + "'s messages");
    if (index == 1) {
      link.out->close();
      link.in->close();
    }
    channel.barrier();
  };
  const StarOutcome outcome = run_star(hub, peer, 3);
  INFO(outcome.hub);
  CHECK(outcome.hub.empty());
  for (const std::string& p : outcome.peers) CHECK(p.empty());
}

// Peer 0 is slow: the hub posts 320 small receives for it (40 requests of 8 buffers, more than
// the lane's whole receive allowance) long before it sends. Peer 1's messages on the same
// receive lane must still get receives posted and arrive: a communicator holds only its share
// of the lane's posted receives.
TEST_CASE("p2p shared lanes: a slow peer's posted receives leave room for the others",
          "[shared-lanes]") {
  constexpr std::size_t kRequests = 40;
  constexpr std::size_t kSmall = 1024;
  constexpr std::size_t kRounds = 50;
  // Generous: the slow peer does nothing but wait meanwhile, and must not be taken as dead.
  const auto config = [] {
    Config c = hub_config();
    c.peer_timeout_ms = 60000;
    return c;
  };
  const auto hub = [&](std::span<Channel> channels) {
    Context context(config());
    Listener listener = context.listen();
    std::vector<std::vector<std::byte>> buffers(kRequests * kMaxRecvBuffers,
                                                std::vector<std::byte>(kSmall));
    std::vector<Transfer> transfers(1);
    HubLink slow = link_peer(context, listener, channels[0]);
    HubLink fast = link_peer(context, listener, channels[1]);
    std::vector<MemoryRegion> regions;
    std::vector<Request*> pending(kRequests);
    for (std::size_t r = 0; r < kRequests; ++r) {
      RecvBuffer targets[kMaxRecvBuffers];
      for (std::size_t k = 0; k < kMaxRecvBuffers; ++k) {
        std::vector<std::byte>& buffer = buffers[r * kMaxRecvBuffers + k];
        regions.push_back(slow.in->register_memory(buffer.data(), kSmall));
        targets[k] = RecvBuffer{buffer.data(), kSmall, static_cast<Tag>(100 + k), regions.back()};
      }
      require(slow.in->irecv(targets, pending[r]) == Status::kOk, slow.in->last_error());
    }
    // Peer 1's messages, one at a time: each needs a receive posted on the shared lane.
    for (std::size_t round = 0; round < kRounds; ++round) {
      transfers.assign(1, Transfer{});
      post_receive(transfers[0], *fast.in, kSmall, seed_of(1, true, round));
      finish_all(transfers, "peer 1's message " + std::to_string(round) +
                                " beside the slow peer's posted receives");
    }
    channels[0].send_value<int>(1);  // now the slow peer sends
    for (std::size_t r = 0; r < kRequests; ++r) {
      std::size_t sizes[kMaxRecvBuffers] = {};
      bool done = false;
      Status status = Status::kOk;
      poll_until([&] { return done || status != Status::kOk; },
                 [&] { status = slow.in->test(pending[r], done, sizes); },
                 "the slow peer's "
                 "messages",
                 60s);
      require(status == Status::kOk, slow.in->last_error());
      for (std::size_t k = 0; k < kMaxRecvBuffers; ++k) {
        require(sizes[k] == kSmall, "a slow peer's message has the wrong size");
        const std::string error =
            check_pattern(buffers[r * kMaxRecvBuffers + k], seed_of(0, true, r * 8 + k));
        require(error.empty(), error);
      }
    }
    for (Channel& channel : channels) channel.barrier();
  };
  const auto peer = [&](Channel& channel, std::size_t index) {
    Context context(config());
    Listener listener = context.listen();
    std::vector<Transfer> transfers;
    HubLink link = join_hub(context, listener, channel);
    if (index == 1) {
      for (std::size_t round = 0; round < kRounds; ++round) {
        transfers.assign(1, Transfer{});
        post_send(transfers[0], *link.out, kSmall, seed_of(1, true, round));
        finish_all(transfers, "a message to the hub");
      }
    } else {
      require(channel.recv_value<int>() == 1, "hub out of step");
      transfers.resize(kRequests * kMaxRecvBuffers);
      for (std::size_t m = 0; m < transfers.size(); ++m) {
        Transfer& t = transfers[m];
        t.comm = link.out.get();
        fill(t, kSmall, seed_of(0, true, m));
        t.region = link.out->register_memory(t.buffer.data(), kSmall);
        const Tag tag = static_cast<Tag>(100 + m % kMaxRecvBuffers);
        Status status = Status::kRetry;
        poll_until([&] { return status != Status::kRetry; },
                   [&] {
                     status = link.out->isend(t.buffer.data(), kSmall, tag, t.region, t.request);
                     for (Transfer& earlier : transfers) {
                       if (earlier.request != nullptr && &earlier != &t) step(earlier);
                     }
                   },
                   "room to send", 60s);
        require(status == Status::kOk, link.out->last_error());
      }
      finish_all(transfers, "the slow peer's messages");
    }
    channel.barrier();
  };
  const StarOutcome outcome = run_star(hub, peer, 2);
  INFO(outcome.hub);
  CHECK(outcome.hub.empty());
  for (const std::string& p : outcome.peers) CHECK(p.empty());
}

}  // namespace
}  // namespace loom::test
