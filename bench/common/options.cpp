#include "common/options.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "loom/config.hpp"
#include "loom/p2p.hpp"
#include "loom/process.hpp"

namespace loom::bench {

std::size_t parse_size(std::string_view text) {
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) {
    throw std::invalid_argument("bad size '" + std::string(text) + "'");
  }
  std::string_view suffix(end, static_cast<std::size_t>(text.data() + text.size() - end));
  std::uint64_t scale = 1;
  if (suffix == "k" || suffix == "K")
    scale = 1ull << 10;
  else if (suffix == "m" || suffix == "M")
    scale = 1ull << 20;
  else if (suffix == "g" || suffix == "G")
    scale = 1ull << 30;
  else if (!suffix.empty())
    throw std::invalid_argument("bad size suffix in '" + std::string(text) + "'");
  if (value > (1ull << 40) / scale)
    throw std::invalid_argument("size too large: " + std::string(text));
  return static_cast<std::size_t>(value * scale);
}

namespace {

std::vector<std::string_view> split(std::string_view text) {
  std::vector<std::string_view> parts;
  while (true) {
    auto cut = text.find_first_of(",:");
    parts.push_back(text.substr(0, cut));
    if (cut == std::string_view::npos) return parts;
    text.remove_prefix(cut + 1);
  }
}

}  // namespace

std::vector<std::size_t> parse_sizes(std::string_view text) {
  std::vector<std::size_t> sizes;
  if (text == "all") {
    sizes.push_back(0);
    for (std::size_t s = 1; s <= (16u << 20); s *= 2) sizes.push_back(s);
  } else if (text.starts_with("r:")) {
    auto parts = split(text.substr(2));
    if (parts.size() != 3) throw std::invalid_argument("-S r:start,inc,end needs three sizes");
    const std::size_t start = parse_size(parts[0]);
    const std::size_t step = parse_size(parts[1]);
    const std::size_t end = parse_size(parts[2]);
    if (step == 0 || end < start)
      throw std::invalid_argument("-S r: needs inc > 0 and end >= start");
    for (std::size_t s = start; s <= end; s += step) sizes.push_back(s);
  } else if (text.starts_with("l:")) {
    for (auto part : split(text.substr(2))) sizes.push_back(parse_size(part));
  } else {
    sizes.push_back(parse_size(text));
  }
  if (sizes.empty()) throw std::invalid_argument("-S selects no size");
  return sizes;
}

std::size_t default_iterations(std::size_t size) {
  if (size < (64u << 10)) return 20000;
  if (size < (1u << 20)) return 2000;
  return 200;
}

std::size_t default_batches(std::size_t size, std::size_t blocks) {
  return std::max<std::size_t>((default_iterations(size) + blocks - 1) / blocks, 10);
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kSend:
      return "send";
    case Op::kWrite:
      return "write";
    case Op::kRead:
      return "read";
  }
  return "?";
}

const char* protocol_name(NotifyProtocol protocol) {
  return protocol == NotifyProtocol::kCountedCqData ? "cq-data" : "completion";
}

const char* offsets_name(Offsets offsets) {
  switch (offsets) {
    case Offsets::kContiguous:
      return "contiguous";
    case Offsets::kShuffled:
      return "shuffled";
    case Offsets::kSame:
      return "same";
  }
  return "?";
}

const char* host_pages_name(HostPages pages) {
  return pages == HostPages::kMalloc ? "malloc" : "huge";
}

namespace {

// --op, --offsets, --notify-protocol, --host-pages: the value of that name, else a one-line
// refusal.
template <typename T, std::size_t N>
T pick(const char* option, const std::string& text, const char* (*name)(T),
       const std::array<T, N>& values) {
  std::string known;
  for (T value : values) {
    if (text == name(value)) return value;
    known += (known.empty() ? "" : ", ") + std::string(name(value));
  }
  throw std::invalid_argument(std::string(option) + ": expected " + known + ", got \"" + text +
                              "\"");
}

constexpr std::size_t kMaxSlab = std::size_t{8} << 30;

// The one-sided options against the rest (after parsing, `given` counts each on the line).
void check_one_sided(Options& o, const CLI::App& app, const std::string& sizes) {
  const auto given = [&](const char* name) { return app.count(name) != 0; };
  if (!o.one_sided()) {
    for (const char* name :
         {"--blocks", "--offsets", "--notify", "--no-notify", "--notify-protocol"}) {
      if (given(name)) throw std::invalid_argument(std::string(name) + " needs --op write|read");
    }
    return;
  }
  const std::string op = std::string("--op ") + op_name(o.op);
  if (o.bidir) throw std::invalid_argument("--bidir does not go with " + op);
  if (o.comms != 1) throw std::invalid_argument("--comms: " + op + " runs one connection");
  if (given("--notify") && given("--no-notify")) {
    throw std::invalid_argument("--notify with --no-notify");
  }
  if (o.op == Op::kRead) {
    if (given("--notify") || given("--notify-protocol")) {
      throw std::invalid_argument("--notify: only write batches carry a notification");
    }
    o.notify = false;
  } else {
    o.notify = !given("--no-notify");
    if (!o.notify && given("--notify-protocol")) {
      throw std::invalid_argument("--notify-protocol with --no-notify");
    }
  }
  if (!given("-W")) o.window = kRmaWindow;
  if (o.offsets == Offsets::kSame && o.verify) {
    throw std::invalid_argument("--offsets same with -v: overlapping blocks cannot be checked");
  }
  // A block is never empty: "all" starts at 1 byte here.
  if (sizes == "all") o.sizes.erase(o.sizes.begin());
  if (std::find(o.sizes.begin(), o.sizes.end(), 0) != o.sizes.end()) {
    throw std::invalid_argument("-S: " + op + " takes no 0-byte blocks");
  }
  // Each side holds --blocks slots of the largest size; -v: -W times that (no batch in flight
  // overwrites another's).
  const std::size_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  const std::size_t sets = o.verify ? o.window : 1;
  if (o.offsets != Offsets::kSame && largest > kMaxSlab / o.blocks / sets) {
    throw std::invalid_argument((o.verify ? "-v -W " + std::to_string(o.window) + " x " : "") +
                                std::string("--blocks ") + std::to_string(o.blocks) + " x -S " +
                                std::to_string(largest) + " needs more than 8 GiB per side");
  }
}

}  // namespace

void add_shared_options(CLI::App& app, int& groups, unsigned& timeout_s,
                        const std::string& timeout_doc, std::string& json,
                        const std::string& json_doc) {
  app.add_option("--groups", groups, "lanes, shared by all peers both ways (0: one per comm)")
      ->check(CLI::Range(0, 256));
  app.add_option("--timeout", timeout_s, timeout_doc)->check(CLI::Range(1, 3600));
  app.add_option("--json", json, json_doc);
}

void add_provider_settings_flag(CLI::App& app, bool& provider_settings) {
  app.add_flag_callback(
      "--no-provider-settings", [&provider_settings] { provider_settings = false; },
      "leave loom's recommended provider settings unset (else set where unset)");
}

bool parse_command_line(CLI::App& app, int argc, char** argv, bool print_help) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (print_help) app.exit(e);
    return false;
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(e.what());
  }
  return true;
}

ParseResult parse_options(int argc, char** argv, Options& o) {
  CLI::App app{
      "fi_p2p_bw: bandwidth, message rate and latency through loom.\n"
      "Server: fi_p2p_bw [options]; client: fi_p2p_bw [options] SERVER; one host: --loopback."};
  app.get_formatter()->column_width(34);
  std::string sizes = "all";
  std::string port;
  bool print_config = false;
  bool no_pingpong = false;
  app.add_option("-p", o.provider, "libfabric provider (else LOOM_PROVIDER, FI_PROVIDER)");
  app.add_option("-S", sizes, "sizes: N|all|r:start,inc,end|l:a,b,c (k/m/g suffixes)");
  app.add_option("-I", o.iterations,
                 "iterations per size (default: 20000/2000/200 by size; --op write|read: "
                 "batches, default as many blocks)");
  app.add_option("-w", o.warmup, "warmup iterations (default 10)");
  app.add_option("-W", o.window,
                 "window: messages in flight (default 64; --op write|read: batches, default 2)")
      ->check(CLI::Range(1, 128));
  app.add_flag("-v", o.verify, "verify every byte received");
  app.add_option("-E", port, "out-of-band bootstrap port (default 9228)")->expected(0, 1);
  app.add_option("-s", o.source, "address the server's bootstrap socket binds (default any)");
  app.add_option("server", o.server, "server address: run as the client");
  app.add_option("--rails", o.rails, "data rails per lane (default LOOM_DATA_RAILS)")
      ->check(CLI::Range(1, 16));
  app.add_option("--ctrl-rails", o.ctrl_rails, "control rails per lane (default LOOM_CTRL_RAILS)")
      ->check(CLI::Range(1, 4));
  app.add_option("--comms", o.comms, "communicators between the pair (default 1)")
      ->check(CLI::Range(1, 1024));
  add_shared_options(app, o.groups, o.timeout_s, "seconds to wait for the peer (default 30)",
                     o.json, "also write the figures and configuration as JSON");
  app.add_flag("--bidir", o.bidir, "send both ways at once");
  app.add_flag("--loopback", o.loopback, "run server and client on 127.0.0.1 in one command");
  app.add_flag("--no-pingpong", no_pingpong, "skip the latency pass");
  bool no_bw = false;
  app.add_flag("--no-bw", no_bw, "skip the bandwidth pass (latency only)");
  app.add_option("--lat-iters", o.lat_iterations,
                 "timed ping-pong rounds, after -w untimed ones (default iterations / 10, "
                 "20 to 1000)");
  std::string op = "send";
  app.add_option("--op", op, "send (tagged messages), write or read (one-sided batches)");
  app.add_option("--blocks", o.blocks, "--op write|read: blocks per batch (default 128)")
      ->check(CLI::Range(1, 65536));
  std::string offsets = "contiguous";
  app.add_option("--offsets", offsets,
                 "--op write|read: the blocks' remote offsets, contiguous, shuffled (a random "
                 "permutation of the batch's slots) or same (every block from and to one slot, "
                 "as fi_rma_bw writes one buffer)");
  // Flags without a variable (read back with count()); add_flag(name, "text") is ambiguous
  // under g++ with Debian's CLI11.
  app.add_flag("--notify")
      ->description(
          "--op write: each batch carries a notification (the "
          "default)");
  app.add_flag("--no-notify")->description("--op write: batches without a notification");
  std::string protocol = "completion";
  app.add_option("--notify-protocol", protocol,
                 "--op write: completion (loom's: notify once every write completed) or cq-data "
                 "(remote CQ data on every block, counted by the target)");
  std::string pin;
  app.add_option("--pin-core", pin,
                 "cores to pin to, e.g. 0,1 (with --loopback: the server's, then the client's)");
  std::string device = "host";
  app.add_option("--device", device,
                 "message buffers in host memory or on a GPU: host, cuda or cuda:N (default host)");
  std::string host_pages = "huge";
  app.add_option("--host-pages", host_pages,
                 "host message buffers: huge (2 MiB-aligned, advised MADV_HUGEPAGE; the default) "
                 "or malloc (as fabtests allocates them: huge pages only in the kernel's THP "
                 "mode always)");
  add_provider_settings_flag(app, o.provider_settings);
  app.add_flag("--print-config", print_config,
               "print every LOOM_* variable as README's table and exit");
  if (!parse_command_line(app, argc, argv)) return ParseResult::kExit;
  if (print_config) {
    // README's Configuration table, row for row (the config-readme test compares them).
    std::printf("| variable | default | meaning |\n|---|---|---|\n");
    for (const auto& var : config_variables()) {
      std::printf("| `%.*s` | %s | %.*s |\n", static_cast<int>(var.name.size()), var.name.data(),
                  var.default_value.empty() ? "–" : std::string(var.default_value).c_str(),
                  static_cast<int>(var.doc.size()), var.doc.data());
    }
    return ParseResult::kExit;
  }
  o.sizes = parse_sizes(sizes);
  if (app.count("-E") != 0 && !port.empty()) {
    const std::size_t value = parse_size(port);
    if (value == 0 || value > 65535) throw std::invalid_argument("-E: port out of range");
    o.port = static_cast<std::uint16_t>(value);
  }
  if (o.loopback && !o.server.empty()) {
    throw std::invalid_argument("--loopback runs both sides: give no server address");
  }
  o.pingpong = !no_pingpong;
  o.bandwidth = !no_bw;
  if (!o.pingpong && !o.bandwidth) throw std::invalid_argument("--no-bw with --no-pingpong");
  o.memory = MemoryChoice::parse(device);
  o.memory.pages = pick("--host-pages", host_pages, host_pages_name,
                        std::array{HostPages::kHuge, HostPages::kMalloc});
  o.op = pick("--op", op, op_name, std::array{Op::kSend, Op::kWrite, Op::kRead});
  o.offsets = pick("--offsets", offsets, offsets_name,
                   std::array{Offsets::kContiguous, Offsets::kShuffled, Offsets::kSame});
  o.notify_protocol =
      pick("--notify-protocol", protocol, protocol_name,
           std::array{NotifyProtocol::kAfterCompletion, NotifyProtocol::kCountedCqData});
  check_one_sided(o, app, sizes);
  for (auto part : split(pin)) {
    if (part.empty()) continue;
    const std::size_t core = parse_size(part);
    if (core > 4095) throw std::invalid_argument("--pin-core: core out of range");
    o.pin_cores.push_back(static_cast<int>(core));
  }
  return ParseResult::kRun;
}

void apply_provider_settings(const Config& config) {
  for (const ProviderSetting& s : recommended_provider_settings(config)) {
    if (std::getenv(s.name.c_str()) != nullptr) continue;
    setenv(s.name.c_str(), s.value.c_str(), 0);
    std::printf("# %s=%s (loom's recommendation: %s)\n", s.name.c_str(), s.value.c_str(),
                s.why.c_str());
  }
}

}  // namespace loom::bench
