#include "p2p_alltoall/options.hpp"

#include <algorithm>
#include <stdexcept>

#include <CLI/CLI.hpp>

#include "common/options.hpp"

namespace loom::bench {

std::size_t AlltoallOptions::topk_for(int ranks) const {
  const std::size_t others = ranks > 1 ? static_cast<std::size_t>(ranks - 1) : 0;
  return topk < 0 ? std::min<std::size_t>(8, others) : static_cast<std::size_t>(topk);
}

ParseResult parse_alltoall_options(int argc, char** argv, AlltoallOptions& o, bool print) {
  CLI::App app{
      "fi_p2p_alltoall: every rank to every other through loom, started by a launcher\n"
      "(mpirun -np N fi_p2p_alltoall ..., srun --mpi=pmix fi_p2p_alltoall ...). MPI gives\n"
      "the rank and size and carries the listener handles; loom carries every measured byte."};
  app.get_formatter()->column_width(30);
  std::string sizes = "l:4k,64k,1m";
  std::vector<std::string> patterns;
  std::string yield = "auto";
  app.add_option("--pattern", patterns,
                 "pairs (pairs-turn and pairs-once), pairs-turn, pairs-once, alltoall, ep; "
                 "comma-separated (default pairs,alltoall,ep)")
      ->delimiter(',')
      ->check(CLI::IsMember({"pairs", "pairs-turn", "pairs-once", "alltoall", "ep"}));
  app.add_option("-p", o.provider, "libfabric provider (else LOOM_PROVIDER, FI_PROVIDER)");
  app.add_option("-S", sizes,
                 "bytes per pair: N|all|r:start,inc,end|l:a,b,c (default l:4k,64k,1m)");
  app.add_option("-I", o.iterations,
                 "iterations: messages per pair (pairs, default 5000/500/50 by size), "
                 "all-to-alls (default 1000/200/50), dispatch+combine rounds (default 100)");
  app.add_option("-w", o.warmup, "warmup messages or iterations (default 10)");
  app.add_option("-W", o.window, "pairs: messages in flight per ordered pair (default 64)")
      ->check(CLI::Range(1, 64));
  app.add_option("--depth", o.depth,
                 "alltoall: iterations in flight (default 1: one all-to-all at a time)")
      ->check(CLI::Range(1, 64));
  app.add_flag("-v", o.verify, "give each message or token its own buffer and check every byte");
  app.add_option("--tokens", o.tokens, "ep: tokens per rank T (default 128)")
      ->check(CLI::Range(1, 65536));
  std::string hidden = "7168";
  app.add_option("--hidden", hidden, "ep: bytes per token H, k/m suffixes (default 7168)");
  app.add_option("--topk", o.topk, "ep: destinations per token k (default min(8, N-1))")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--seed", o.seed, "ep: routing seed (default 1)");
  app.add_option("--rails", o.rails, "data rails per lane (default LOOM_DATA_RAILS)")
      ->check(CLI::Range(1, 16));
  add_shared_options(app, o.groups, o.timeout_s,
                     "seconds any wait may go without progress (default 60)", o.json,
                     "rank 0 writes every rank's figures as JSON");
  app.add_flag("--loopback", o.loopback, "loopback NICs only (all ranks on one host)");
  app.add_option("--yield", yield,
                 "yield the CPU after a pass that found nothing: auto (where this host runs more "
                 "ranks than they have cores), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  app.add_flag("-q", o.quiet, "aggregate lines only, no line per rank");
  add_provider_settings_flag(app, o.provider_settings);
  if (!parse_command_line(app, argc, argv, print)) return ParseResult::kExit;
  if (patterns.empty()) patterns = {"pairs", "alltoall", "ep"};
  for (const auto& p : patterns) {
    if (p == "pairs" || p == "pairs-turn") o.pairs_in_turn = true;
    if (p == "pairs" || p == "pairs-once") o.pairs_at_once = true;
    if (p == "alltoall") o.alltoall = true;
    if (p == "ep") o.expert = true;
  }
  o.sizes = parse_sizes(sizes);
  o.hidden = parse_size(hidden);
  if (o.hidden < 8 || o.hidden > (std::size_t{16} << 20)) {
    throw std::invalid_argument("--hidden: 8 bytes to 16 MiB per token");
  }
  o.yield = yield == "always"  ? YieldMode::kAlways
            : yield == "never" ? YieldMode::kNever
                               : YieldMode::kAuto;
  return ParseResult::kRun;
}

Config alltoall_config(const AlltoallOptions& options) {
  Config config = Config::from_env();
  if (!options.provider.empty()) config.provider = options.provider;
  if (options.rails != 0) config.data_rails = options.rails;
  if (options.groups >= 0) config.ngroups = static_cast<unsigned>(options.groups);
  if (options.loopback) config.loopback_only = true;
  config.connect_timeout_ms = options.timeout_s * 1000;
  return config;
}

std::size_t pair_iterations(const AlltoallOptions& options, std::size_t size) {
  if (options.iterations != 0) return options.iterations;
  return default_iterations(size) / 4;
}

std::size_t alltoall_iterations(const AlltoallOptions& options, std::size_t size) {
  if (options.iterations != 0) return options.iterations;
  return size < (64u << 10) ? 1000 : size < (1u << 20) ? 200 : 50;
}

std::size_t expert_iterations(const AlltoallOptions& options) {
  return options.iterations != 0 ? options.iterations : 100;
}

}  // namespace loom::bench
