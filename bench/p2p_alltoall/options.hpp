// fi_p2p_alltoall's command line: fabtests' letters where they apply (-p -S -I -w -W -v),
// the patterns to run and the expert-parallel shape, and the options every bench shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/options.hpp"
#include "loom/config.hpp"

namespace loom::bench {

enum class YieldMode : std::uint8_t { kAuto, kAlways, kNever };

struct AlltoallOptions {
  std::string provider;            // -p (else LOOM_PROVIDER / FI_PROVIDER)
  std::vector<std::size_t> sizes;  // -S: bytes per pair (pairs, alltoall)
  std::size_t iterations = 0;      // -I; 0 = by pattern and size
  std::size_t warmup = 10;         // -w
  std::size_t window = 64;         // -W: messages in flight per pair (pairs)
  std::size_t depth = 1;           // --depth: iterations in flight (alltoall)
  bool verify = false;             // -v
  bool pairs_in_turn = false;      // --pattern pairs / pairs-turn
  bool pairs_at_once = false;      // --pattern pairs / pairs-once
  bool alltoall = false;           // --pattern alltoall
  bool expert = false;             // --pattern ep
  std::size_t tokens = 128;        // --tokens T
  std::size_t hidden = 7168;       // --hidden H (bytes per token)
  int topk = -1;                   // --topk k (-1: min(8, N - 1))
  std::uint64_t seed = 1;          // --seed
  unsigned rails = 0;              // --rails (0: LOOM_DATA_RAILS)
  int groups = -1;                 // --groups (-1: LOOM_NGROUPS)
  bool loopback = false;           // --loopback: loopback NICs only (one host)
  bool provider_settings = true;   // --no-provider-settings
  YieldMode yield = YieldMode::kAuto;
  unsigned timeout_s = 60;  // --timeout: any wait that makes no progress
  std::string json;         // --json FILE (rank 0 writes it)
  bool quiet = false;       // -q: no per-rank lines

  [[nodiscard]] bool two_sided() const { return pairs_in_turn || pairs_at_once || alltoall; }
  // k for `ranks` ranks.
  [[nodiscard]] std::size_t topk_for(int ranks) const;
};

// Fills `options`; on --help prints (rank 0 only: `print`) and returns kExit; on a bad option
// throws std::invalid_argument with a one-line reason.
ParseResult parse_alltoall_options(int argc, char** argv, AlltoallOptions& options, bool print);

// The context's configuration: the environment's with the command line's overrides.
[[nodiscard]] Config alltoall_config(const AlltoallOptions& options);

// Default iteration counts: messages per pair stream (pairs), iterations (alltoall, ep).
[[nodiscard]] std::size_t pair_iterations(const AlltoallOptions& options, std::size_t size);
[[nodiscard]] std::size_t alltoall_iterations(const AlltoallOptions& options, std::size_t size);
[[nodiscard]] std::size_t expert_iterations(const AlltoallOptions& options);

}  // namespace loom::bench
