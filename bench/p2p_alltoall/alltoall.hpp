// The all-to-all pattern, two-sided: every iteration each rank sends S bytes to every other
// rank and receives S bytes from each; an iteration ends at a rank when all of its sends and
// receives completed. --depth D keeps D iterations in flight (1, the default, one at a time as a
// collective library runs them; more overlaps them as fi_p2p_bw's window overlaps messages);
// receives are posted one iteration ahead of the sends. Each rank times its iterations, from
// posting its sends to the last completion; no MPI between them.
#pragma once

#include <cstddef>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/memory.hpp"
#include "loom/p2p.hpp"
#include "p2p_alltoall/mesh.hpp"
#include "p2p_alltoall/traffic.hpp"

namespace loom::bench {

class Alltoall {
 public:
  static constexpr std::size_t kMaxDepth = 64;

  // Buffers for the largest size, touched now (before the rank's memory is measured).
  Alltoall(const AlltoallOptions& options, Mesh& mesh, std::size_t max_size);

  // This rank's figures for one size: iterations, depth, seconds (from the first post to the
  // last completion), mean_us, p50_us, p99_us (per iteration), mb_per_s (what it sent),
  // samples_us. Throws std::runtime_error.
  nlohmann::json run(std::size_t size);

 private:
  struct Peer {
    int rank = 0;
    std::size_t index = 0;       // among the peers: its slots in the buffers
    std::vector<Request> sends;  // by iteration modulo the ring
    std::vector<Request> recvs;
    std::size_t sends_done = 0;
    std::size_t recvs_done = 0;
  };
  struct Round {
    Clock::time_point start{};
    Clock::time_point end{};
    std::size_t left = 0;  // requests of this iteration not completed yet
  };

  [[nodiscard]] std::byte* slot(const HostBuffer& buffer, const Peer& peer,
                                std::size_t iteration) const;
  void post_receives(std::size_t size, std::size_t iteration);
  void post_sends(std::size_t size, std::size_t iteration);
  // Tests each peer's oldest requests; true when something completed.
  bool progress(std::size_t size, std::size_t sends_posted, std::size_t recvs_posted);
  void finish(std::size_t iteration);
  void check(const Peer& peer, std::size_t size, std::size_t iteration) const;

  const AlltoallOptions& options_;
  Mesh& mesh_;
  std::size_t max_size_;
  std::size_t ring_;  // depth + 1: receives run one iteration ahead
  HostBuffer send_buffer_;
  HostBuffer recv_buffer_;
  Region send_region_;
  Region recv_region_;
  std::vector<Peer> peers_;
  std::vector<Round> rounds_;
};

}  // namespace loom::bench
