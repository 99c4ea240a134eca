// What fi_p2p_alltoall prints and writes: rank 0 gathers every rank's figures (as JSON, with
// MPI, between measurements) and prints fabtests-style rows with the aggregate, a line per rank
// unless -q, and at the end each rank's endpoints, lanes, memory and setup; --json holds all of
// it, every rank's figures included.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "p2p_alltoall/mesh.hpp"
#include "p2p_alltoall/options.hpp"

namespace loom::bench {

class RankReport {
 public:
  RankReport(const AlltoallOptions& options, Mesh& mesh, bool oversubscribed);

  // Collective calls: every rank calls each, rank 0 prints.
  void header(const std::vector<ProviderSetting>& settings) const;
  void pairs(const std::string& mode, nlohmann::json mine);
  void alltoall(nlohmann::json mine);
  void expert(nlohmann::json mine);
  // The resources and setup of every rank; writes --json (rank 0). Throws when it cannot.
  void finish(const Footprint& base, const Footprint& connected, const Footprint& end);

 private:
  // Rank 0: every rank's `mine`, in rank order; the others: empty.
  [[nodiscard]] std::vector<nlohmann::json> gather(const nlohmann::json& mine) const;
  [[nodiscard]] bool prints() const { return mesh_.rank() == 0; }

  const AlltoallOptions& options_;
  Mesh& mesh_;
  bool oversubscribed_;
  nlohmann::json ranks_ = nlohmann::json::array();       // rank 0: per rank, every pattern's rows
  nlohmann::json aggregate_ = nlohmann::json::object();  // rank 0: by pattern, the printed rows
};

}  // namespace loom::bench
