// fi_p2p_bw's command line: fabtests' conventions (-p -S -I -w -W -v -E -s, server = no
// positional argument, client = server address) plus loom's own options.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/memory.hpp"
#include "loom/config.hpp"

namespace CLI {
class App;
}

namespace loom::bench {

struct Options {
  std::string provider;            // -p (else LOOM_PROVIDER / FI_PROVIDER)
  std::vector<std::size_t> sizes;  // -S
  std::size_t iterations = 0;      // -I; 0 = by size, as fabtests
  std::size_t warmup = 10;         // -w
  std::size_t window = 64;         // -W
  bool verify = false;             // -v
  std::uint16_t port = 9228;       // -E[=port], out-of-band bootstrap port
  std::string source;              // -s, address the server's bootstrap socket binds
  std::string server;              // positional: run as client of this server
  unsigned rails = 0;              // --rails (0: LOOM_DATA_RAILS)
  unsigned ctrl_rails = 0;         // --ctrl-rails (0: LOOM_CTRL_RAILS)
  unsigned comms = 1;              // --comms
  int groups = -1;                 // --groups (-1: LOOM_NGROUPS)
  bool bidir = false;              // --bidir
  bool loopback = false;           // --loopback
  bool provider_settings = true;   // set loom's recommended provider settings where unset
  std::string json;                // --json FILE
  unsigned timeout_s = 30;         // --timeout: bootstrap and connect
  bool pingpong = true;            // --no-pingpong disables the latency pass
  bool bandwidth = true;           // --no-bw: the latency pass alone
  std::size_t lat_iterations = 0;  // --lat-iters; 0 = iterations / 10 within [20, 1000]
  std::vector<int> pin_cores;      // --pin-core LIST (with --loopback: server, then client)
  MemoryChoice memory;             // --device host|cuda[:N]

  [[nodiscard]] bool is_client() const { return !server.empty(); }
};

// Throws std::invalid_argument with a one-line reason.
std::vector<std::size_t> parse_sizes(std::string_view text);
std::size_t parse_size(std::string_view text);
// fabtests' default iteration counts by message size.
std::size_t default_iterations(std::size_t size);

// The options fi_p2p_bw and fi_p2p_hub share, with one name, range and meaning: --groups,
// --timeout (each tool bounds a different wait: `timeout_doc`) and --json (`json_doc`).
void add_shared_options(CLI::App& app, int& groups, unsigned& timeout_s,
                        const std::string& timeout_doc, std::string& json,
                        const std::string& json_doc);

enum class ParseResult { kRun, kExit };
// Fills `options`; on --help or --print-config prints and returns kExit; on a bad option
// prints one line to stderr and throws std::invalid_argument.
ParseResult parse_options(int argc, char** argv, Options& options);

// loom never writes the environment (a library cannot know its host's threads); the benches,
// still single-threaded, set loom's recommended provider settings for `config` that the
// environment lacks, so that their figures are what the README's recommendations give. Prints
// each one it sets.
void apply_provider_settings(const Config& config);

}  // namespace loom::bench
