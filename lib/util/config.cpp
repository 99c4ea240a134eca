// The one place LOOM_* variables are read. Each row of kTable names a variable, its default,
// its documentation and how it is parsed and range-checked. Config() parses the default
// column, so a default is written nowhere else. fi_p2p_bw --print-config prints the rows as
// README's Configuration table, and the config-readme test fails when the two differ.
#include "loom/config.hpp"

#include <charconv>
#include <cstdlib>
#include <string>

#include "loom/error.hpp"

extern char** environ;  // NOLINT: POSIX

namespace loom {
namespace {

constexpr std::string_view kPrefix = "LOOM_";

[[noreturn]] void invalid(std::string_view name, std::string_view value, std::string_view want) {
  throw Error("config", "", 0,
              std::string(name) + "=\"" + std::string(value) + "\": expected " + std::string(want));
}

std::string range_text(std::uint64_t lo, std::uint64_t hi) {
  return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// Integer with an optional k/m/g (binary) suffix. `also` names what else the variable
// accepts, for the error text.
std::uint64_t parse_number(std::string_view name, std::string_view value, std::uint64_t lo,
                           std::uint64_t hi, std::string_view also = {}) {
  const auto refuse = [&] { invalid(name, value, range_text(lo, hi) + std::string(also)); };
  std::uint64_t number = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, number);
  if (ec != std::errc() || ptr == value.data()) refuse();
  std::uint64_t scale = 1;
  if (ptr != end) {
    switch (*ptr | 0x20) {
      case 'k':
        scale = 1ull << 10;
        break;
      case 'm':
        scale = 1ull << 20;
        break;
      case 'g':
        scale = 1ull << 30;
        break;
      default:
        refuse();
    }
    if (ptr + 1 != end) refuse();
  }
  if (number > hi / scale) refuse();
  number *= scale;
  if (number < lo) refuse();
  return number;
}

bool parse_bool(std::string_view name, std::string_view value) {
  for (auto yes : {"1", "true", "yes", "on"})
    if (value == yes) return true;
  for (auto no : {"0", "false", "no", "off"})
    if (value == no) return false;
  invalid(name, value, "one of 1/0, true/false, yes/no, on/off");
}

std::vector<std::string> parse_list(std::string_view value) {
  std::vector<std::string> items;
  while (!value.empty()) {
    auto comma = value.find(',');
    auto item = value.substr(0, comma);
    if (!item.empty()) items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return items;
}

constexpr std::string_view kLogLevels[] = {"trace", "debug", "info", "warn", "error", "off"};

// One row per variable: its name, default and documentation, and how a value is parsed into
// its Config member and range-checked there. Config() is the default column parsed.
struct Row {
  ConfigVariable var;
  void (*set)(Config&, std::string_view name, std::string_view value);
  void (*check)(const Config&, std::string_view name);
};

template <auto Member, std::uint64_t Lo, std::uint64_t Hi>
void set_number(Config& c, std::string_view name, std::string_view value) {
  using T = std::remove_reference_t<decltype(c.*Member)>;
  c.*Member = static_cast<T>(parse_number(name, value, Lo, Hi));
}
template <auto Member, std::uint64_t Lo, std::uint64_t Hi>
void check_number(const Config& c, std::string_view name) {
  const auto v = static_cast<std::uint64_t>(c.*Member);
  if (v < Lo || v > Hi) invalid(name, std::to_string(v), range_text(Lo, Hi));
}
// A number, or "auto": left to the provider's profile (the member is a std::optional).
template <auto Member, std::uint64_t Lo, std::uint64_t Hi>
void set_number_or_auto(Config& c, std::string_view name, std::string_view value) {
  using T = typename std::remove_reference_t<decltype(c.*Member)>::value_type;
  if (value == "auto") {
    (c.*Member).reset();
    return;
  }
  c.*Member = static_cast<T>(parse_number(name, value, Lo, Hi, " or auto"));
}
template <auto Member, std::uint64_t Lo, std::uint64_t Hi>
void check_number_or_auto(const Config& c, std::string_view name) {
  if (!(c.*Member).has_value()) return;
  const auto v = static_cast<std::uint64_t>(*(c.*Member));
  if (v < Lo || v > Hi) invalid(name, std::to_string(v), range_text(Lo, Hi) + " or auto");
}
template <auto Member>
void set_flag(Config& c, std::string_view name, std::string_view value) {
  c.*Member = parse_bool(name, value);
}
template <auto Member>
void set_text(Config& c, std::string_view, std::string_view value) {
  c.*Member = value;
}
template <auto Member>
void set_list(Config& c, std::string_view, std::string_view value) {
  c.*Member = parse_list(value);
}
void check_nothing(const Config&, std::string_view) {}

bool known_log_level(std::string_view value) {
  for (auto level : kLogLevels)
    if (value == level) return true;
  return false;
}
template <auto Member>
void set_log_level(Config& c, std::string_view name, std::string_view value) {
  if (!known_log_level(value)) invalid(name, value, "one of trace, debug, info, warn, error, off");
  c.*Member = value;
}
// Reads only: the Config checked may be a const object (Context's default argument).
template <auto Member>
void check_log_level(const Config& c, std::string_view name) {
  if (!known_log_level(c.*Member)) {
    invalid(name, c.*Member, "one of trace, debug, info, warn, error, off");
  }
}

// Row factories: each names its member, and a number its range, once.
template <auto Member, std::uint64_t Lo, std::uint64_t Hi>
constexpr Row number(std::string_view name, std::string_view value, std::string_view doc) {
  return {{name, value, doc}, set_number<Member, Lo, Hi>, check_number<Member, Lo, Hi>};
}
template <auto Member, std::uint64_t Lo, std::uint64_t Hi>
constexpr Row number_or_auto(std::string_view name, std::string_view value, std::string_view doc) {
  return {
      {name, value, doc}, set_number_or_auto<Member, Lo, Hi>, check_number_or_auto<Member, Lo, Hi>};
}
template <auto Member>
constexpr Row flag(std::string_view name, std::string_view value, std::string_view doc) {
  return {{name, value, doc}, set_flag<Member>, check_nothing};
}
template <auto Member>
constexpr Row text(std::string_view name, std::string_view value, std::string_view doc) {
  return {{name, value, doc}, set_text<Member>, check_nothing};
}
template <auto Member>
constexpr Row list(std::string_view name, std::string_view value, std::string_view doc) {
  return {{name, value, doc}, set_list<Member>, check_nothing};
}
template <auto Member>
constexpr Row log_level(std::string_view name, std::string_view value, std::string_view doc) {
  return {{name, value, doc}, set_log_level<Member>, check_log_level<Member>};
}

constexpr std::uint64_t kMaxBytes = 1ull << 40;
constexpr std::uint64_t kMaxMs = 3600000;

// clang-format off
constexpr Row kTable[] = {
  text<&Config::provider>("LOOM_PROVIDER", "",
    "libfabric provider to use (e.g. efa, cxi, verbs;ofi_rxm, tcp;ofi_rxm, shm, epmr); empty = "
    "libfabric's first match. FI_PROVIDER filters as usual."),
  list<&Config::nics>("LOOM_NICS", "",
    "comma-separated domain names (NICs) to use, in this order; empty = every NIC of the "
    "provider, closest first"),
  flag<&Config::loopback_only>("LOOM_LOOPBACK_ONLY", "0",
    "use only NICs whose address is loopback (or that have no IP address, like shm); for "
    "single-host runs"),
  number<&Config::data_rails, 1, 16>("LOOM_DATA_RAILS", "1",
    "data rails (endpoints carrying payload) per lane; more rails than NICs puts several "
    "endpoints on one NIC"),
  number<&Config::ctrl_rails, 1, 4>("LOOM_CTRL_RAILS", "1",
    "control rails (endpoints carrying handshakes and clear-to-send) per lane"),
  number<&Config::ngroups, 0, 256>("LOOM_NGROUPS", "1",
    "lanes (endpoint groups) shared by the communicators to and from all peers on the same "
    "NICs (on shm: that many each way); peers start at successive lanes and each peer's "
    "communicators go round from there, its n-th send and n-th receive communicator on the same "
    "lane; 0 = one lane per communicator"),
  number<&Config::qp_depth_multiplier, 1, 64>("LOOM_QP_DEPTH_MULTIPLIER", "1",
    "scales queue depths of shared lanes; clamped to the provider's limits"),
  number<&Config::eager_max, 0, 1ull << 24>("LOOM_EAGER_MAX", "16k",
    "largest message sent eagerly (tagged send into one of the receiver's eager buffers, "
    "copied from there into the posted buffer), never above the provider's max_msg_size, nor "
    "on shm above its 4 KiB inject size; larger messages use RDMA-write rendezvous"),
  number_or_auto<&Config::eager_credits, 0, 256>("LOOM_EAGER_CREDITS", "auto",
    "eager messages a receiving communicator's sender may have in flight before their buffers "
    "are announced (credits out of its lane's eager pool of 4x this many buffers, its fair "
    "share of them when the lane serves many peers); the rest wait for the announcement and "
    "go by RDMA write; 0 = every message waits; auto = the provider's choice (64 on shm, where "
    "a write costs the receiver more than a send; 16 elsewhere)"),
  number_or_auto<&Config::eager_fragments, 1, 4>("LOOM_EAGER_FRAGMENTS", "auto",
    "eager buffers one message sent ahead may fill, as that many eager messages, each on a "
    "credit: a message up to this many times the receiver's eager size needs no "
    "clear-to-send; 1 = one buffer (larger messages use RDMA-write rendezvous); auto = the "
    "provider's choice (2 on shm, whose 4 KiB eager size would otherwise send 8 KiB "
    "messages by clear-to-send and a write from the sender; 1 elsewhere)"),
  number<&Config::inject_max, 0, 1ull << 20>("LOOM_INJECT_MAX", "15k",
    "largest eager message sent by fi_tinjectdata (no send completion, and room for a carried "
    "clear-to-send) where the provider's inject size allows it, and largest message written by "
    "fi_inject_writedata where its profile allows that (shm, not rxm): loom asks the provider "
    "for this much plus 1 KiB, then for less if refused (shm grants 4 KiB, tcp;ofi_rxm up to "
    "its buffer size, 16 KiB unless FI_OFI_RXM_BUFFER_SIZE is lower); 0 = never"),
  number<&Config::carry_control, 0, 2>("LOOM_CARRY_CONTROL", "1",
    "clear-to-sends ride inside eager messages going the other way to the same peer instead of "
    "as messages of their own: 1 = where that saves the provider work (not shm, whose messages "
    "cost less than carrying them), 2 = always, 0 = never"),
  number<&Config::min_stripe, 4096, kMaxBytes>("LOOM_MIN_STRIPE", "256k",
    "smallest piece a rendezvous message is split into across data rails"),
  number<&Config::mr_cache_entries, 1, 1u << 20>("LOOM_MR_CACHE_ENTRIES", "1024",
    "registrations in use per lane above which the MR cache says so (debug); a registration is "
    "released with its last user, never kept unused"),
  log_level<&Config::log_level>("LOOM_LOG_LEVEL", "warn",
    "trace, debug, info, warn, error or off"),
  number<&Config::connect_timeout_ms, 1, kMaxMs>("LOOM_CONNECT_TIMEOUT_MS", "30000",
    "connect gives up after this long without an answer (accept never times out: it returns "
    "nothing until a connect arrives); also how long a handshake message waits for a peer that "
    "cannot take it"),
  number<&Config::peer_timeout_ms, 1, kMaxMs>("LOOM_PEER_TIMEOUT_MS", "10000",
    "a peer silent this long while requests wait on it is taken as dead (peer error): a live "
    "peer answers pings whatever its application does (its lanes progress in the background "
    "every eighth of this, at most 100 ms), so only a dead, unreachable or stopped one is; also "
    "how long a closed peer's pending messages have to arrive, and a closing lane keeps its "
    "last control messages"),
  flag<&Config::progress_thread>("LOOM_PROGRESS_THREAD", "1",
    "each context keeps a thread that progresses the lanes its application has not polled for "
    "an idle period (an eighth of LOOM_PEER_TIMEOUT_MS, at most 100 ms) and closes lanes left "
    "closing; 0 = no thread: the application's waiting tests do that instead, which saves a "
    "single-threaded application on tcp or sockets ~50 ns per socket call (with a second thread "
    "the kernel counts references to the file), 2-4% of an 8 B one-way trip, but a process that "
    "calls nothing of loom for LOOM_PEER_TIMEOUT_MS while its peers wait on it is taken by them "
    "for dead"),
  flag<&Config::peer_isolation>("LOOM_PEER_ISOLATION", "1",
    "a peer that stops taking messages (dead, stopped) never holds up the lane's traffic with "
    "other peers; on shm, which completes an endpoint's operations above its 4 KiB inject size "
    "in order and only once the peer took them, that keeps each eager message within 4 KiB "
    "(up to LOOM_EAGER_FRAGMENTS of them make one message) and writes longer ones itself (0: "
    "shm's own sends up to LOOM_EAGER_MAX and writes in one part, windows of 8 KiB-1 MiB up to "
    "1.8x faster before eager fragments, but such a peer holds up every other's completions on "
    "the lane)"),
  flag<&Config::force_flush>("LOOM_FORCE_FLUSH", "0",
    "run iflush's read even for host memory (tests the GPU path); the NCCL plugin then "
    "reports forceFlush 1, so that NCCL flushes every GPU receive"),
  flag<&Config::device_memory>("LOOM_DEVICE_MEMORY", "1",
    "in a build with CUDA, ask the provider for FI_HMEM so that CUDA memory can be registered; "
    "0 = host memory only (shm with FI_HMEM drops its fast paths for host memory too)"),
  flag<&Config::gpu_flush>("LOOM_GPU_FLUSH", "1",
    "iflush of a receive into GPU memory reads a few bytes of it back through each data rail, so "
    "the NIC's earlier writes are visible to the GPU (GPUDirect RDMA); 0 = skip it where the "
    "platform makes them visible at completion"),
  flag<&Config::cuda_dmabuf>("LOOM_CUDA_DMABUF", "1",
    "register CUDA memory through a dmabuf (cuMemGetHandleForAddressRange, FI_MR_DMABUF) where "
    "libfabric >= 1.20, the driver and the GPU support it; 0 = always by address with "
    "FI_HMEM_CUDA"),
  flag<&Config::cuda_ipc>("LOOM_CUDA_IPC", "0",
    "register cuMemAlloc'd memory as device-only (FI_HMEM_DEVICE_ONLY), so that shm (and efa "
    "to peers on the same host) copies it device to device over CUDA IPC instead of through "
    "host bounce buffers (one H100, 16 MiB: 2 GB/s -> 1.1 TB/s); off by default because "
    "libfabric up to 2.6.0 reports such a copy complete before the GPU made it, which corrupts "
    "data (libfabric issue 11231; fixed on its main branch after 2.6.0)"),
  text<&Config::topology_xml>("LOOM_TOPOLOGY_XML", "",
    "hwloc XML topology to use instead of this machine's"),
  text<&Config::gpu>("LOOM_GPU", "",
    "PCI bus id of the GPU this process drives (0000:13:00.0): NICs closest to it become the "
    "rails; empty = closest to the calling thread's CPUs"),
};
// clang-format on

constexpr auto make_variables() {
  std::array<ConfigVariable, std::size(kTable)> vars{};
  for (std::size_t i = 0; i < std::size(kTable); ++i) vars[i] = kTable[i].var;
  return vars;
}
constexpr auto kVariables = make_variables();

const Row* find_row(std::string_view name) {
  for (const auto& row : kTable)
    if (row.var.name == name) return &row;
  return nullptr;
}

}  // namespace

std::span<const ConfigVariable> config_variables() noexcept {
  return kVariables;
}

Config::Config() {
  for (const auto& row : kTable) row.set(*this, row.var.name, row.var.default_value);
}

Config Config::from_values(const std::map<std::string, std::string, std::less<>>& values) {
  Config config;
  for (const auto& [name, value] : values) {
    const Row* row = find_row(name);
    if (row == nullptr) {
      throw Error("config", "", 0,
                  "unknown variable " + name + " (fi_p2p_bw --print-config lists them)");
    }
    row->set(config, name, value);
  }
  return config;
}

Config Config::from_env() {
  std::map<std::string, std::string, std::less<>> values;
  for (char** env = environ; env != nullptr && *env != nullptr; ++env) {
    std::string_view entry(*env);
    if (!entry.starts_with(kPrefix)) continue;
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    values.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return from_values(values);
}

void Config::validate() const {
  for (const auto& row : kTable) row.check(*this, row.var.name);
}

}  // namespace loom
