// The one place LOOM_* variables are read. Each row of kTable names a variable, its default,
// its documentation and how it is parsed and range-checked; README's table is generated from
// the same rows (fi_p2p_bw --print-config).
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

// Integer with an optional k/m/g (binary) suffix.
std::uint64_t parse_number(std::string_view name, std::string_view value, std::uint64_t lo,
                           std::uint64_t hi) {
  std::uint64_t number = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, number);
  if (ec != std::errc() || ptr == value.data()) invalid(name, value, range_text(lo, hi));
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
        invalid(name, value, range_text(lo, hi));
    }
    if (ptr + 1 != end) invalid(name, value, range_text(lo, hi));
  }
  if (number > hi / scale) invalid(name, value, range_text(lo, hi));
  number *= scale;
  if (number < lo) invalid(name, value, range_text(lo, hi));
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

struct Row {
  ConfigVariable var;
  void (*set)(Config&, std::string_view name, std::string_view value);
  void (*check)(const Config&, std::string_view name);
};

template <auto Member, std::uint64_t Lo, std::uint64_t Hi>
struct Number {
  static void set(Config& c, std::string_view name, std::string_view value) {
    using T = std::remove_reference_t<decltype(c.*Member)>;
    c.*Member = static_cast<T>(parse_number(name, value, Lo, Hi));
  }
  static void check(const Config& c, std::string_view name) {
    auto v = static_cast<std::uint64_t>(c.*Member);
    if (v < Lo || v > Hi) invalid(name, std::to_string(v), range_text(Lo, Hi));
  }
};

template <auto Member>
struct Flag {
  static void set(Config& c, std::string_view name, std::string_view value) {
    c.*Member = parse_bool(name, value);
  }
  static void check(const Config&, std::string_view) {}
};

template <auto Member>
struct Text {
  static void set(Config& c, std::string_view, std::string_view value) { c.*Member = value; }
  static void check(const Config&, std::string_view) {}
};

void set_nics(Config& c, std::string_view, std::string_view value) {
  c.nics = parse_list(value);
}
void check_nothing(const Config&, std::string_view) {}

bool known_log_level(std::string_view value) {
  for (auto level : kLogLevels)
    if (value == level) return true;
  return false;
}
void set_log_level(Config& c, std::string_view name, std::string_view value) {
  if (!known_log_level(value)) invalid(name, value, "one of trace, debug, info, warn, error, off");
  c.log_level = value;
}
// Reads only: the Config checked may be a const object (Context's default argument).
void check_log_level(const Config& c, std::string_view name) {
  if (!known_log_level(c.log_level)) {
    invalid(name, c.log_level, "one of trace, debug, info, warn, error, off");
  }
}

constexpr std::uint64_t kMaxBytes = 1ull << 40;

// clang-format off
constexpr Row kTable[] = {
  {{"LOOM_PROVIDER", "", "libfabric provider to use (e.g. efa, cxi, verbs;ofi_rxm, tcp;ofi_rxm, "
    "shm, epmr); empty = libfabric's first match. FI_PROVIDER filters as usual."},
   Text<&Config::provider>::set, Text<&Config::provider>::check},
  {{"LOOM_NICS", "", "comma-separated domain names (NICs) to use, in this order; empty = every "
    "NIC of the provider, closest first"}, set_nics, check_nothing},
  {{"LOOM_LOOPBACK_ONLY", "0", "use only NICs whose address is loopback (or that have no IP "
    "address, like shm); for single-host runs"},
   Flag<&Config::loopback_only>::set, Flag<&Config::loopback_only>::check},
  {{"LOOM_DATA_RAILS", "1", "data rails (endpoints carrying payload) per lane; more rails than "
    "NICs puts several endpoints on one NIC"},
   Number<&Config::data_rails, 1, 16>::set, Number<&Config::data_rails, 1, 16>::check},
  {{"LOOM_CTRL_RAILS", "1", "control rails (endpoints carrying handshakes and clear-to-send) per "
    "lane"},
   Number<&Config::ctrl_rails, 1, 4>::set, Number<&Config::ctrl_rails, 1, 4>::check},
  {{"LOOM_NGROUPS", "1", "lanes (endpoint groups) shared by the communicators to one peer in one "
    "direction; 0 = one lane per communicator"},
   Number<&Config::ngroups, 0, 256>::set, Number<&Config::ngroups, 0, 256>::check},
  {{"LOOM_QP_DEPTH_MULTIPLIER", "1", "scales queue depths of shared lanes; clamped to the "
    "provider's limits"},
   Number<&Config::qp_depth_multiplier, 1, 64>::set,
   Number<&Config::qp_depth_multiplier, 1, 64>::check},
  {{"LOOM_EAGER_MAX", "16k", "largest message sent eagerly (tagged send), and largest receive "
    "buffer given an eager receive, both never above the provider's max_msg_size; larger "
    "messages, and any message to a larger buffer, use RDMA-write rendezvous"},
   Number<&Config::eager_max, 0, 1ull << 24>::set, Number<&Config::eager_max, 0, 1ull << 24>::check},
  {{"LOOM_INJECT_MAX", "4k", "largest eager message sent by fi_tinjectdata (no send completion) "
    "where the provider's inject size allows it; 0 = never"},
   Number<&Config::inject_max, 0, 1ull << 20>::set, Number<&Config::inject_max, 0, 1ull << 20>::check},
  {{"LOOM_MIN_STRIPE", "256k", "smallest piece a rendezvous message is split into across data "
    "rails"},
   Number<&Config::min_stripe, 4096, kMaxBytes>::set,
   Number<&Config::min_stripe, 4096, kMaxBytes>::check},
  {{"LOOM_MR_CACHE_ENTRIES", "1024", "registrations in use per lane above which the MR cache "
    "says so (debug); a registration is released with its last user, never kept unused"},
   Number<&Config::mr_cache_entries, 1, 1u << 20>::set,
   Number<&Config::mr_cache_entries, 1, 1u << 20>::check},
  {{"LOOM_LOG_LEVEL", "warn", "trace, debug, info, warn, error or off"},
   set_log_level, check_log_level},
  {{"LOOM_CONNECT_TIMEOUT_MS", "30000", "connect gives up after this long without an answer"},
   Number<&Config::connect_timeout_ms, 1, 3600000>::set,
   Number<&Config::connect_timeout_ms, 1, 3600000>::check},
  {{"LOOM_PEER_TIMEOUT_MS", "10000", "a peer silent this long while requests wait on it is taken "
    "as dead (peer error); also how long a closed peer's pending messages have to arrive"},
   Number<&Config::peer_timeout_ms, 1, 3600000>::set,
   Number<&Config::peer_timeout_ms, 1, 3600000>::check},
  {{"LOOM_FORCE_FLUSH", "0", "run iflush's read even for host memory (tests the GPU path)"},
   Flag<&Config::force_flush>::set, Flag<&Config::force_flush>::check},
  {{"LOOM_DEVICE_MEMORY", "1", "in a build with CUDA, ask the provider for FI_HMEM so that CUDA "
    "memory can be registered; 0 = host memory only (shm with FI_HMEM drops its fast paths for "
    "host memory too)"},
   Flag<&Config::device_memory>::set, Flag<&Config::device_memory>::check},
  {{"LOOM_GPU_FLUSH", "1", "iflush of a receive into GPU memory reads a few bytes of it back "
    "through each data rail, so the NIC's earlier writes are visible to the GPU (GPUDirect RDMA); "
    "0 = skip it where the platform makes them visible at completion"},
   Flag<&Config::gpu_flush>::set, Flag<&Config::gpu_flush>::check},
  {{"LOOM_CUDA_DMABUF", "1", "register CUDA memory through a dmabuf (cuMemGetHandleForAddressRange, "
    "FI_MR_DMABUF) where libfabric >= 1.20, the driver and the GPU support it; 0 = always by "
    "address with FI_HMEM_CUDA"},
   Flag<&Config::cuda_dmabuf>::set, Flag<&Config::cuda_dmabuf>::check},
  {{"LOOM_TOPOLOGY_XML", "", "hwloc XML topology to use instead of this machine's"},
   Text<&Config::topology_xml>::set, Text<&Config::topology_xml>::check},
  {{"LOOM_GPU", "", "PCI bus id of the GPU this process drives (0000:13:00.0): NICs closest to "
    "it become the rails; empty = closest to the calling thread's CPUs"},
   Text<&Config::gpu>::set, Text<&Config::gpu>::check},
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
