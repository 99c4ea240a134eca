// fi_p2p_alltoall: every rank to every other through loom, as one rank of a job a launcher
// started: all-pairs bandwidth (each ordered pair alone, then all at once), a two-sided
// all-to-all, and expert-parallel dispatch and combine on one-sided writes.
//   mpirun -np N fi_p2p_alltoall [options]        srun --mpi=pmix -n N fi_p2p_alltoall [options]
// MPI gives the rank and size, carries the listener handles (MPI_Allgather), the region
// descriptors, a barrier before each timed pass and the figures to rank 0; every measured byte
// goes through loom.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "loom/process.hpp"
#include "p2p_alltoall/alltoall.hpp"
#include "p2p_alltoall/expert.hpp"
#include "p2p_alltoall/mesh.hpp"
#include "p2p_alltoall/options.hpp"
#include "p2p_alltoall/pairs.hpp"
#include "p2p_alltoall/report.hpp"
#include "p2p_alltoall/world.hpp"

namespace {

using namespace loom::bench;

// loom's recommended provider settings that the environment lacks, set as fi_p2p_bw sets them
// (common/options.hpp: apply_provider_settings) but before MPI_Init, which starts threads, and
// returned instead of printed: rank 0 prints them once MPI says which rank it is.
std::vector<loom::ProviderSetting> set_provider_settings(const loom::Config& config) {
  std::vector<loom::ProviderSetting> set;
  for (loom::ProviderSetting& s : loom::recommended_provider_settings(config)) {
    if (std::getenv(s.name.c_str()) != nullptr) continue;
    setenv(s.name.c_str(), s.value.c_str(), 0);
    set.push_back(std::move(s));
  }
  return set;
}

int run(const AlltoallOptions& options, const World& world,
        const std::vector<loom::ProviderSetting>& settings) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const bool oversubscribed = cores > 0 && world.local_size() > cores;
  const bool yield =
      options.yield == YieldMode::kAlways || (options.yield == YieldMode::kAuto && oversubscribed);
  std::size_t max_size = 1;
  for (std::size_t s : options.sizes) max_size = std::max(max_size, s);

  Mesh mesh(options, world, yield);
  RankReport report(options, mesh, oversubscribed);
  report.header(settings);
  // Every buffer is made and touched before the rank's memory is first measured: what grows
  // after is loom's.
  std::optional<Pairs> pairs;
  std::optional<Alltoall> alltoall;
  std::optional<Expert> expert;
  if (options.pairs_in_turn || options.pairs_at_once) pairs.emplace(options, mesh, max_size);
  if (options.alltoall) alltoall.emplace(options, mesh, max_size);
  if (options.expert && world.size() > 1) expert.emplace(options, mesh);
  world.barrier();
  const Footprint base = mesh.footprint();
  mesh.connect(options.two_sided(), expert.has_value());
  if (expert) expert->attach(mesh.exchange_regions(expert->regions()));
  world.barrier();
  const Footprint connected = mesh.footprint();

  if (pairs && options.pairs_in_turn) {
    for (std::size_t size : options.sizes) report.pairs("in turn", pairs->run(size, false));
  }
  if (pairs && options.pairs_at_once) {
    for (std::size_t size : options.sizes) report.pairs("at once", pairs->run(size, true));
  }
  if (alltoall) {
    for (std::size_t size : options.sizes) report.alltoall(alltoall->run(size));
  }
  if (expert) report.expert(expert->run());
  world.barrier();
  const Footprint end = mesh.footprint();
  mesh.close();
  report.finish(base, connected, end);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Options and provider settings before MPI_Init: MPI starts threads, and the environment must
  // not change under them. Errors wait for the rank, so that only rank 0 prints them.
  AlltoallOptions options;
  std::string error;
  bool help = false;
  std::vector<loom::ProviderSetting> settings;
  try {
    help = parse_alltoall_options(argc, argv, options, false) == ParseResult::kExit;
  } catch (const std::exception& e) {
    error = std::string(e.what()) + " (try --help)";
  }
  if (error.empty() && !help && options.provider_settings) {
    try {
      settings = set_provider_settings(alltoall_config(options));
    } catch (const std::exception& e) {
      error = e.what();  // a bad LOOM_* variable
    }
  }
  std::optional<World> world;
  try {
    world.emplace(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_alltoall: %s\n", e.what());
    return 1;
  }
  if (help) {
    if (world->rank() == 0) (void)parse_alltoall_options(argc, argv, options, true);
    return 0;
  }
  if (error.empty() && world->size() < 2) {
    error = "needs at least 2 ranks (mpirun -np N, N >= 2)";
  }
  if (error.empty() && options.expert && options.topk >= 0 &&
      static_cast<std::size_t>(options.topk) >= static_cast<std::size_t>(world->size())) {
    error = "--topk " + std::to_string(options.topk) +
            ": at most N - 1 = " + std::to_string(world->size() - 1) +
            " (each token goes to k other ranks)";
  }
  if (!error.empty()) {
    if (world->rank() == 0) std::fprintf(stderr, "fi_p2p_alltoall: %s\n", error.c_str());
    return 2;
  }
  try {
    return run(options, *world, settings);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_alltoall: rank %d: %s\n", world->rank(), e.what());
    std::fflush(nullptr);
    world->abort(1);
  }
}
