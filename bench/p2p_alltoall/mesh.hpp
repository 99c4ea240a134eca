// One rank's connections to every other: its context and listener, the handles every rank
// listens on (MPI_Allgather), a send and a receive communicator per peer and/or a one-sided
// initiator and target per peer, set up at once (every rank connects and accepts in one loop,
// never blocking on either), and what that cost: loom's calls per peer, wall time, endpoints,
// lanes, memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/p2p.hpp"
#include "loom/rma.hpp"
#include "p2p_alltoall/options.hpp"
#include "p2p_alltoall/world.hpp"

namespace loom::bench {

struct MeshSetup {
  double wall_ms = 0;  // from a barrier to every connection ready and its peer known
  // Time in the loom calls that set connections up (connect, a connector's first poll and the
  // one that returned, the accept that returned), all peers: wall clock, and this thread's CPU
  // time, which a rank descheduled mid-call (more ranks than cores) does not inflate.
  double calls_ms = 0;
  double calls_cpu_ms = 0;
  // The first peer's share (the dearest connect and accept: they opened the lanes), and of
  // the other peers the median (a connect's calls plus an accept) and the mean,
  // (calls - first) / (N - 2), which also holds one-time work done inside some peer's call;
  // wall and CPU.
  double first_peer_us = 0;
  double per_peer_us = 0;
  double per_peer_mean_us = 0;
  double first_peer_cpu_us = 0;
  double per_peer_cpu_us = 0;
  double per_peer_cpu_mean_us = 0;
  double regions_ms = 0;  // ep: exporting, exchanging (MPI) and importing the regions
  double close_ms = 0;
};

// What a rank holds at one moment: endpoints, lanes and its resident memory.
struct Footprint {
  std::size_t endpoints = 0;
  std::size_t lanes = 0;
  std::uint64_t lanes_opened = 0;
  std::vector<std::pair<std::string, std::size_t>> endpoints_per_nic;
  long rss_kib = 0;
};

class Mesh {
 public:
  // Makes the context and the listener, and swaps handles with every rank (MPI_Allgather).
  Mesh(const AlltoallOptions& options, const World& world, bool yield);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // Connects to and accepts from every other rank, two-sided and/or one-sided, all at once;
  // two-sided receive communicators are told apart by a first message carrying the sender's
  // rank. Throws std::runtime_error (or loom::Error) naming the step.
  void connect(bool two_sided, bool one_sided);
  // ep: exports `regions` (this context's) to every initiator, ships the descriptors with
  // MPI_Allgatherv and imports every peer's. Returns by peer, the imported regions in order.
  std::vector<std::vector<RemoteRegion>> exchange_regions(std::span<const MemoryRegion> regions);
  // Closes every connection (timed into setup().close_ms).
  void close();

  [[nodiscard]] Footprint footprint() const;
  [[nodiscard]] Context& context() { return *context_; }
  [[nodiscard]] const World& world() const { return world_; }
  [[nodiscard]] const MeshSetup& setup() const { return setup_; }
  [[nodiscard]] bool yields() const { return yield_; }
  [[nodiscard]] int rank() const { return world_.rank(); }
  [[nodiscard]] int size() const { return world_.size(); }

  [[nodiscard]] SendComm& send(int peer) { return *send_[static_cast<std::size_t>(peer)]; }
  [[nodiscard]] RecvComm& recv(int peer) { return *recv_[static_cast<std::size_t>(peer)]; }
  [[nodiscard]] RmaInitiator& initiator(int peer) {
    return *initiators_[static_cast<std::size_t>(peer)];
  }
  // In accept order: which peer each serves is not known (notifications carry it).
  [[nodiscard]] std::vector<std::unique_ptr<RmaTarget>>& targets() { return targets_; }

 private:
  const AlltoallOptions& options_;
  const World& world_;
  bool yield_;
  std::unique_ptr<Context> context_;
  std::optional<Listener> listener_;
  std::vector<Handle> handles_;  // by rank
  // By peer rank (this rank's slot empty).
  std::vector<std::unique_ptr<SendComm>> send_;
  std::vector<std::unique_ptr<RecvComm>> recv_;
  std::vector<std::unique_ptr<RmaInitiator>> initiators_;
  std::vector<std::unique_ptr<RmaTarget>> targets_;
  MeshSetup setup_;
};

}  // namespace loom::bench
