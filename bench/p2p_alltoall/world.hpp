// The launcher's side of fi_p2p_alltoall: rank, size and the few collectives the bench uses
// around its measurements (listener handles, region descriptors, a barrier before each timed
// pass, the figures gathered to rank 0). The only file that includes mpi.h: nothing here is on
// a measured path, and another launcher's bootstrap (PMIx put/fence/get) would replace it alone.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace loom::bench {

class World {
 public:
  // MPI_Init_thread (funneled); MPI_Finalize in the destructor. Throws std::runtime_error when MPI
  // fails.
  World(int& argc, char**& argv);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  // The ranks on this host (MPI_COMM_TYPE_SHARED) and this one's index among them.
  [[nodiscard]] int local_size() const noexcept { return local_size_; }
  [[nodiscard]] int local_rank() const noexcept { return local_rank_; }
  [[nodiscard]] int hosts() const noexcept { return hosts_; }
  [[nodiscard]] const std::string& host() const noexcept { return host_; }

  // Every rank's `mine` (each exactly `mine.size()` bytes), in rank order.
  [[nodiscard]] std::vector<std::byte> allgather(std::span<const std::byte> mine) const;
  // Every rank's `mine` (any length each), in rank order.
  [[nodiscard]] std::vector<std::vector<std::byte>> allgatherv(
      std::span<const std::byte> mine) const;
  // Rank 0 gets every rank's bytes (any length each), in rank order; the others get nothing.
  [[nodiscard]] std::vector<std::string> gather(const std::string& mine) const;
  void barrier() const;
  // Whether every rank said true.
  [[nodiscard]] bool all(bool mine) const;
  // Ends every rank of the job (MPI_Abort): a rank that failed cannot leave the others waiting.
  [[noreturn]] void abort(int code) const;

 private:
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int hosts_ = 1;
  std::string host_;
};

}  // namespace loom::bench
