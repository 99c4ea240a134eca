// The expert-parallel pattern on loom's one-sided path, as DeepEP's tests shape it. Dispatch:
// each rank routes its T tokens of H bytes each to k of the other ranks (seeded random top-k,
// a new routing every iteration) and writes, to every other rank, the tokens routed there (a
// block per token, into that rank's slot for this one) in one batch whose notification carries
// the count; a rank with no token from it gets an 8-byte write, so that its count still arrives.
// Combine: each rank writes every token it received back to its source the same way. A phase
// ends at a rank once its batches completed and every other rank's notification arrived.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/memory.hpp"
#include "loom/rma.hpp"
#include "p2p_alltoall/mesh.hpp"
#include "p2p_alltoall/traffic.hpp"

namespace loom::bench {

class Expert {
 public:
  // The token buffer and the two slot regions (N x T x H bytes each), touched now. Throws
  // std::invalid_argument for a k above N - 1.
  Expert(const AlltoallOptions& options, Mesh& mesh);

  // What every initiator imports: dispatch slots, combine slots.
  [[nodiscard]] std::vector<MemoryRegion> regions() const {
    return {dispatch_region_, combine_region_};
  }
  // By peer: its dispatch and combine slots as this rank imported them.
  void attach(std::vector<std::vector<RemoteRegion>> remote) { remote_ = std::move(remote); }

  // This rank's figures: tokens, hidden, topk, iterations, and per phase tokens and bytes
  // (sent per iteration), mean_us, p50_us, p99_us, tokens_per_s, gb_per_s, samples_us.
  nlohmann::json run();

 private:
  enum Phase : std::uint64_t { kDispatch = 0, kCombine = 1 };
  struct Pending {
    int peer;
    Request request;
  };
  // Notifications by iteration parity (a phase's can arrive one iteration early) and sender.
  struct Arrivals {
    std::vector<std::int64_t> count;  // -1: not yet
    std::size_t arrived = 0;
    void reset(std::size_t ranks) {
      count.assign(ranks, -1);
      arrived = 0;
    }
  };

  // Which of `source`'s tokens go to each rank in `iteration`, in token order.
  void route(std::uint64_t iteration, int source, std::vector<std::vector<std::uint32_t>>& to);
  // Posts one batch per other rank, then tests them and polls the targets until this rank's
  // batches completed and every other rank's notification of `phase` arrived.
  void exchange(Phase phase, std::uint64_t iteration);
  void poll_targets(std::uint64_t iteration, bool& progressed);
  [[nodiscard]] std::size_t slot_offset(int rank, std::size_t token) const;
  void check_dispatch(int source, std::uint64_t iteration) const;
  void check_combine(int destination, std::uint64_t iteration) const;

  const AlltoallOptions& options_;
  Mesh& mesh_;
  std::size_t tokens_;
  std::size_t hidden_;
  std::size_t topk_;
  HostBuffer token_buffer_;
  HostBuffer dispatch_buffer_;
  HostBuffer combine_buffer_;
  Region token_region_;
  Region dispatch_region_;
  Region combine_region_;
  std::vector<std::vector<RemoteRegion>> remote_;
  std::vector<std::vector<std::uint32_t>> to_;       // this rank's routing, by destination
  std::vector<std::vector<std::uint32_t>> from_;     // -v: the tokens each source routes here
  std::vector<std::vector<std::uint32_t>> scratch_;  // route() of another source
  std::vector<int> others_;                          // route()'s draw
  std::vector<std::vector<RmaBlock>> blocks_;        // by peer: the batch being posted
  std::vector<Pending> pending_;
  Arrivals arrivals_[2][2];  // [phase][iteration parity]
  std::uint64_t tokens_sent_[2] = {0, 0};
};

}  // namespace loom::bench
