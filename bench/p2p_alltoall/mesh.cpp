#include "p2p_alltoall/mesh.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <thread>

#include "common/memory.hpp"
#include "p2p_alltoall/traffic.hpp"

namespace loom::bench {
namespace {

// A handle as every rank ships it: its length, then its bytes.
constexpr std::size_t kHandleRecord = sizeof(std::uint32_t) + kMaxHandleBytes;

// Time in loom calls: wall clock, and this thread's CPU time, which a rank descheduled in
// the middle of a call (more ranks than cores) does not inflate.
struct Spent {
  double wall_us = 0;
  double cpu_us = 0;
  Spent& operator+=(const Spent& other) {
    wall_us += other.wall_us;
    cpu_us += other.cpu_us;
    return *this;
  }
};

double thread_cpu_us() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e6 + static_cast<double>(now.tv_nsec) / 1e3;
}

// A loom call's time added to `into`; returns what the call returned.
template <typename Call>
auto timed(Spent& into, Call&& call) {
  const auto start = Clock::now();
  const double cpu = thread_cpu_us();
  auto result = call();
  into.cpu_us += thread_cpu_us() - cpu;
  into.wall_us += micros_between(start, Clock::now());
  return result;
}

// How setup calls' time splits over the peers. The dearest connect and the dearest accept
// opened the lanes: the first peer's share. Of the others, the median (a connect's calls, then
// an accept) and the mean, (total - first) / (N - 2), which also carries whatever else was done
// once inside some peer's call (on tcp a later poll finishing the new lane's setup).
struct PeerShares {
  double first = 0;
  double median = 0;
  double mean = 0;
};

PeerShares shares(const std::vector<Spent>& connects, const std::vector<Spent>& accepts,
                  double Spent::*field) {
  auto sorted = [field](const std::vector<Spent>& spent) {
    std::vector<double> values;
    for (const Spent& s : spent) values.push_back(s.*field);
    std::sort(values.begin(), values.end());
    return values;
  };
  const std::vector<double> c = sorted(connects), a = sorted(accepts);
  PeerShares out;
  if (c.empty()) return out;
  double total = 0;
  for (double v : c) total += v;
  for (double v : a) total += v;
  out.first = c.back() + (a.empty() ? 0.0 : a.back());
  const std::size_t rest = c.size() - 1;  // the peers after the first
  if (rest == 0) return out;
  auto median_below_top = [](const std::vector<double>& v) {
    return v.size() < 2 ? 0.0 : v[(v.size() - 1) / 2];
  };
  out.median = median_below_top(c) + median_below_top(a);
  out.mean = (total - out.first) / static_cast<double>(rest);
  return out;
}

}  // namespace

Mesh::Mesh(const AlltoallOptions& options, const World& world, bool yield)
    : options_(options),
      world_(world),
      yield_(yield),
      context_(std::make_unique<Context>(alltoall_config(options))) {
  listener_.emplace(context_->listen());
  std::vector<std::byte> record(kHandleRecord);
  const Handle& mine = listener_->handle();
  const auto length = static_cast<std::uint32_t>(mine.size);
  std::memcpy(record.data(), &length, sizeof length);
  std::memcpy(record.data() + sizeof length, mine.bytes.data(), mine.size);
  const std::vector<std::byte> all = world_.allgather(record);
  for (int r = 0; r < world_.size(); ++r) {
    const std::byte* at = all.data() + static_cast<std::size_t>(r) * kHandleRecord;
    std::uint32_t size = 0;
    std::memcpy(&size, at, sizeof size);
    handles_.push_back(Handle::from_bytes({at + sizeof size, size}));
  }
}

Mesh::~Mesh() = default;

void Mesh::connect(bool two_sided, bool one_sided) {
  const int n = size();
  const int me = rank();
  const auto peers = static_cast<std::size_t>(n);
  send_.resize(peers);
  recv_.resize(peers);
  initiators_.resize(peers);
  std::vector<std::optional<Connector>> connectors(peers);
  std::vector<std::optional<RmaConnector>> rma_connectors(peers);
  std::vector<bool> polled(peers, false), rma_polled(peers, false);
  std::vector<Spent> cost(peers);  // by peer: connect, first poll, the poll that returned
  std::vector<Spent> accept_cost;  // by accepted connection: the accept that returned it
  std::size_t accepted = 0;
  const std::size_t kinds = (two_sided ? 1 : 0) + (one_sided ? 1 : 0);
  const std::size_t want = kinds * (peers - 1) * 2;
  std::size_t have = 0;

  world_.barrier();
  const auto start = Clock::now();
  // Each rank starts with the next one up: the first connects spread over the ranks. Each
  // connect is labelled with this rank: its peer files what it accepts under it.
  const auto label = static_cast<std::uint64_t>(me);
  for (int d = 1; d < n; ++d) {
    const auto p = static_cast<std::size_t>((me + d) % n);
    if (two_sided) {
      timed(cost[p], [&] { return &connectors[p].emplace(context_->connect(handles_[p], label)); });
    }
    if (one_sided) {
      timed(cost[p],
            [&] { return &rma_connectors[p].emplace(context_->connect_rma(handles_[p], label)); });
    }
  }
  Pacer pacer(yield_, std::chrono::seconds(options_.timeout_s), "setup: connecting to every rank");
  while (have < want) {
    bool progressed = false;
    for (int d = 1; d < n; ++d) {
      const auto p = static_cast<std::size_t>((me + d) % n);
      if (connectors[p]) {
        Spent spent;
        auto comm = timed(spent, [&] { return connectors[p]->poll(); });
        if (!polled[p] || comm) cost[p] += spent;
        polled[p] = true;
        if (comm) {
          send_[p] = std::move(comm);
          connectors[p].reset();
          ++have;
          progressed = true;
        }
      }
      if (rma_connectors[p]) {
        Spent spent;
        auto initiator = timed(spent, [&] { return rma_connectors[p]->poll(); });
        if (!rma_polled[p] || initiator) cost[p] += spent;
        rma_polled[p] = true;
        if (initiator) {
          initiators_[p] = std::move(initiator);
          rma_connectors[p].reset();
          ++have;
          progressed = true;
        }
      }
    }
    while (two_sided && accepted < peers - 1) {
      Spent spent;
      auto comm = timed(spent, [&] { return listener_->accept(); });
      if (!comm) break;
      const std::uint64_t peer = comm->label();
      if (peer >= peers || peer == label || recv_[peer]) {
        throw std::runtime_error("setup: a connect labelled " + std::to_string(peer) +
                                 ", not a peer rank without a receive communicator");
      }
      accept_cost.push_back(spent);
      recv_[peer] = std::move(comm);
      ++accepted;
      ++have;
      progressed = true;
    }
    while (one_sided && targets_.size() < peers - 1) {
      Spent spent;
      auto target = timed(spent, [&] { return listener_->accept_rma(); });
      if (!target) break;
      accept_cost.push_back(spent);
      targets_.push_back(std::move(target));
      ++have;
      progressed = true;
    }
    pacer.missing(want - have);
    pacer.pass(progressed);
  }
  setup_.wall_ms = micros_between(start, Clock::now()) / 1000;

  Spent total;
  for (const Spent& c : cost) total += c;
  for (const Spent& a : accept_cost) total += a;
  setup_.calls_ms = total.wall_us / 1000;
  setup_.calls_cpu_ms = total.cpu_us / 1000;
  // Connect-side calls by peer (this rank's own slot left out).
  std::vector<Spent> connects;
  for (std::size_t p = 0; p < peers; ++p) {
    if (p != static_cast<std::size_t>(me)) connects.push_back(cost[p]);
  }
  const PeerShares wall = shares(connects, accept_cost, &Spent::wall_us);
  const PeerShares cpu = shares(connects, accept_cost, &Spent::cpu_us);
  setup_.first_peer_us = wall.first;
  setup_.per_peer_us = wall.median;
  setup_.per_peer_mean_us = wall.mean;
  setup_.first_peer_cpu_us = cpu.first;
  setup_.per_peer_cpu_us = cpu.median;
  setup_.per_peer_cpu_mean_us = cpu.mean;
}

std::vector<std::vector<RemoteRegion>> Mesh::exchange_regions(
    std::span<const MemoryRegion> regions) {
  const auto start = Clock::now();
  // The targets' lanes: a descriptor names its lane, and an initiator takes only those of the
  // lane its connection reaches. One descriptor per region and lane, whichever target exports it.
  std::vector<std::uint64_t> lanes;
  std::vector<std::byte> mine;
  auto append = [&mine](const void* data, std::size_t size) {
    const auto* bytes = static_cast<const std::byte*>(data);
    mine.insert(mine.end(), bytes, bytes + size);
  };
  for (auto& target : targets_) {
    const std::uint64_t lane = target->stats().lane_id;
    if (std::find(lanes.begin(), lanes.end(), lane) != lanes.end()) continue;
    lanes.push_back(lane);
    for (const MemoryRegion& region : regions) {
      const std::vector<std::byte> descriptor = target->export_region(region);
      const auto length = static_cast<std::uint16_t>(descriptor.size());
      append(&length, sizeof length);
      append(descriptor.data(), descriptor.size());
    }
  }
  const auto all = world_.allgatherv(mine);
  // import_region waits for the target's answer, which the target's rank gives when it
  // progresses the target's lane. A rank inside its own imports does (an import's wait gives
  // the context's other lanes turns); one done with them waits in the barrier below, where only
  // the context's background progress would answer (100 ms turns). A thread polls this rank's
  // targets until every rank is done (they are not the initiators the main thread uses).
  std::atomic<bool> importing{true};
  std::string served_error;
  std::thread server([&] {
    try {
      while (importing.load(std::memory_order_relaxed)) {
        for (auto& target : targets_) {
          if (target->poll()) throw std::runtime_error("a notification before any write");
        }
        if (yield_) std::this_thread::yield();
      }
    } catch (const std::exception& e) {
      served_error = e.what();
    }
  });
  struct Join {
    std::atomic<bool>& flag;
    std::thread& thread;
    ~Join() {
      flag = false;
      if (thread.joinable()) thread.join();
    }
  } join{importing, server};
  std::vector<std::vector<RemoteRegion>> imported(static_cast<std::size_t>(size()));
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    const auto& theirs = all[static_cast<std::size_t>(p)];
    RmaInitiator& initiator = *initiators_[static_cast<std::size_t>(p)];
    std::string refusals;
    // Lane by lane: the first descriptor of the right lane is taken, the others are refused
    // by import_region before it asks the target anything.
    for (std::size_t at = 0; at < theirs.size() && imported[static_cast<std::size_t>(p)].empty();) {
      std::vector<RemoteRegion> lane;
      for (std::size_t i = 0; i < regions.size(); ++i) {
        std::uint16_t length = 0;
        std::memcpy(&length, theirs.data() + at, sizeof length);
        at += sizeof length;
        if (lane.size() == i) {
          try {
            lane.push_back(initiator.import_region({theirs.data() + at, length}));
          } catch (const Error& e) {
            refusals += std::string(refusals.empty() ? "" : "; ") + e.what();
          }
        }
        at += length;
      }
      if (lane.size() == regions.size()) imported[static_cast<std::size_t>(p)] = std::move(lane);
    }
    if (imported[static_cast<std::size_t>(p)].empty()) {
      throw std::runtime_error("regions: no descriptor of rank " + std::to_string(p) +
                               " fits this rank's connection: " + refusals);
    }
  }
  // The thread serves until every rank's imports are done (its targets answer them).
  world_.barrier();
  importing = false;
  server.join();
  if (!served_error.empty()) throw std::runtime_error("regions: a target: " + served_error);
  setup_.regions_ms = micros_between(start, Clock::now()) / 1000;
  return imported;
}

void Mesh::close() {
  const auto start = Clock::now();
  for (auto& c : send_)
    if (c) c->close();
  for (auto& c : recv_)
    if (c) c->close();
  for (auto& c : initiators_)
    if (c) c->close();
  for (auto& c : targets_) c->close();
  send_.clear();
  recv_.clear();
  initiators_.clear();
  targets_.clear();
  setup_.close_ms = micros_between(start, Clock::now()) / 1000;
}

Footprint Mesh::footprint() const {
  Footprint f;
  const ContextStats stats = context_->stats();
  f.lanes = stats.lanes.size();
  f.lanes_opened = stats.lanes_opened;
  f.endpoints_per_nic = stats.endpoints_per_nic;
  for (const auto& lane : stats.lanes) f.endpoints += lane.endpoints;
  f.rss_kib = resident_kib();
  return f;
}

}  // namespace loom::bench
