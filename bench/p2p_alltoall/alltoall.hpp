// The all-to-all pattern, two-sided: every iteration each rank sends S bytes to every other
// rank and receives S bytes from each (its own buffer per peer each way, as an all-to-all's
// input and output), one iteration at a time; an iteration ends when all of a rank's sends and
// receives completed. Each rank times its iterations; no MPI between them.
#pragma once

#include <cstddef>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/memory.hpp"
#include "loom/p2p.hpp"
#include "p2p_alltoall/mesh.hpp"

namespace loom::bench {

class Alltoall {
 public:
  // Buffers for the largest size, touched now (before the rank's memory is measured).
  Alltoall(const AlltoallOptions& options, Mesh& mesh, std::size_t max_size);

  // This rank's figures for one size: iterations, seconds, mean_us, p50_us, p99_us,
  // mb_per_s (what it sent), samples_us (each iteration). Throws std::runtime_error.
  nlohmann::json run(std::size_t size);

 private:
  struct Peer {
    int rank = 0;
    std::size_t slot = 0;  // its S bytes in each buffer
    Request send;
    Request recv;
    std::size_t recv_iteration = 0;  // what the posted receive is for
    bool received = false;           // this iteration's receive done
  };

  void post_receive(Peer& peer, std::size_t size, std::size_t iteration);
  void check(const Peer& peer, std::size_t size, std::size_t iteration) const;

  const AlltoallOptions& options_;
  Mesh& mesh_;
  std::size_t max_size_;
  HugePageBuffer send_buffer_;
  HugePageBuffer recv_buffer_;
  Region send_region_;
  Region recv_region_;
  std::vector<Peer> peers_;
};

}  // namespace loom::bench
