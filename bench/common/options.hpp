// fi_p2p_bw's command line: fabtests' conventions (-p -S -I -w -W -v -E -s, server = no
// positional argument, client = server address) plus loom's own options. --op write|read turns
// it one-sided (loom/rma.hpp): -S gives block sizes, -I and -w batches, -W batches in flight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/memory.hpp"
#include "loom/config.hpp"
#include "loom/rma.hpp"

namespace CLI {
class App;
}

namespace loom::bench {

// What a run moves: tagged messages (isend/irecv), or one-sided batches of blocks.
enum class Op : std::uint8_t { kSend, kWrite, kRead };
// Where a batch's blocks land in the target's memory: slot i for block i, or a random
// permutation of the batch's slots (the same one for every batch of a size).
// kSame: every block from one local slot into one remote slot, as fi_rma_bw writes one buffer
// (the protocol's rate without the memory traffic of many blocks; no -v).
enum class Offsets : std::uint8_t { kContiguous, kShuffled, kSame };

// One-sided batches in flight when -W is not given. Two keep the pipe full: one batch's blocks
// go while the other's last completions and notification are under way. More only queue: a
// connection keeps kMaxRmaOpsInFlight (256) operations posted, two batches of kRmaBlocks, and
// on tcp and shm -W 1, 2, 4 and 8 gave the same GB/s (4k-512k x 128) while batch latency grew
// with -W.
inline constexpr std::size_t kRmaWindow = 2;
inline constexpr std::size_t kRmaBlocks = 128;

struct Options {
  std::string provider;            // -p (else LOOM_PROVIDER / FI_PROVIDER)
  std::vector<std::size_t> sizes;  // -S
  std::size_t iterations = 0;      // -I; 0 = by size, as fabtests
  std::size_t warmup = 10;         // -w
  std::size_t window = 64;         // -W (one-sided: batches, default kRmaWindow)
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
  // One-sided (--op write|read):
  Op op = Op::kSend;                       // --op
  std::size_t blocks = kRmaBlocks;         // --blocks: per batch
  Offsets offsets = Offsets::kContiguous;  // --offsets
  bool notify = true;                      // --notify / --no-notify (writes)
  NotifyProtocol notify_protocol = NotifyProtocol::kAfterCompletion;  // --notify-protocol

  [[nodiscard]] bool is_client() const { return !server.empty(); }
  [[nodiscard]] bool one_sided() const { return op != Op::kSend; }
};

// Throws std::invalid_argument with a one-line reason.
std::vector<std::size_t> parse_sizes(std::string_view text);
std::size_t parse_size(std::string_view text);
// fabtests' default iteration counts by message size.
std::size_t default_iterations(std::size_t size);
// One-sided: batches that move as many blocks as fabtests moves messages of that size (at
// least 10).
std::size_t default_batches(std::size_t size, std::size_t blocks);
// "write", "read", "send"; "completion", "cq-data"; "contiguous", "shuffled", "same"; "huge",
// "malloc".
const char* op_name(Op op);
const char* protocol_name(NotifyProtocol protocol);
const char* offsets_name(Offsets offsets);
const char* host_pages_name(HostPages pages);

// The options fi_p2p_bw and fi_p2p_hub share, with one name, range and meaning: --groups,
// --timeout (each tool bounds a different wait: `timeout_doc`) and --json (`json_doc`).
void add_shared_options(CLI::App& app, int& groups, unsigned& timeout_s,
                        const std::string& timeout_doc, std::string& json,
                        const std::string& json_doc);

// --no-provider-settings, one flag in every bench: clears `provider_settings` when given (see
// apply_provider_settings).
void add_provider_settings_flag(CLI::App& app, bool& provider_settings);
// Parses the command line into `app`'s options: false when --help was asked for (the help
// printed where `print_help`: one MPI rank prints it, the others stay quiet); a bad option
// throws std::invalid_argument with CLI11's one-line reason.
bool parse_command_line(CLI::App& app, int argc, char** argv, bool print_help = true);

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
