// loom's configuration: every LOOM_* variable, parsed in one place (lib/util/config.cpp).
// A program may build a Config from the environment and override fields in code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// LOOM_CARRY_CONTROL: whether clear-to-sends ride inside eager messages going the other way
// (its values 0, 1, 2 in this order).
enum class CarryControl : std::uint8_t { kNever, kWhereItHelps, kAlways };

// Every field starts at its variable's default: Config() parses the default column of the
// table in lib/util/config.cpp, where each default is written once. (The {} below only keep
// a field that no row sets from being indeterminate.)
struct Config {
  Config();

  std::string provider;                     // LOOM_PROVIDER
  std::vector<std::string> nics;            // LOOM_NICS
  bool loopback_only{};                     // LOOM_LOOPBACK_ONLY
  unsigned data_rails{};                    // LOOM_DATA_RAILS
  unsigned ctrl_rails{};                    // LOOM_CTRL_RAILS
  unsigned ngroups{};                       // LOOM_NGROUPS
  unsigned qp_depth_multiplier{};           // LOOM_QP_DEPTH_MULTIPLIER
  std::size_t eager_max{};                  // LOOM_EAGER_MAX
  std::optional<unsigned> eager_credits;    // LOOM_EAGER_CREDITS (none: auto, the provider's)
  std::optional<unsigned> eager_fragments;  // LOOM_EAGER_FRAGMENTS (none: auto, the provider's)
  std::size_t inject_max{};                 // LOOM_INJECT_MAX
  CarryControl carry_control{};             // LOOM_CARRY_CONTROL
  std::size_t min_stripe{};                 // LOOM_MIN_STRIPE
  std::size_t mr_cache_entries{};           // LOOM_MR_CACHE_ENTRIES
  std::string log_level;                    // LOOM_LOG_LEVEL
  unsigned connect_timeout_ms{};            // LOOM_CONNECT_TIMEOUT_MS
  unsigned peer_timeout_ms{};               // LOOM_PEER_TIMEOUT_MS
  bool progress_thread{};                   // LOOM_PROGRESS_THREAD
  bool peer_isolation{};                    // LOOM_PEER_ISOLATION
  bool force_flush{};                       // LOOM_FORCE_FLUSH
  bool device_memory{};                     // LOOM_DEVICE_MEMORY
  bool gpu_flush{};                         // LOOM_GPU_FLUSH
  bool cuda_dmabuf{};                       // LOOM_CUDA_DMABUF
  bool cuda_ipc{};                          // LOOM_CUDA_IPC
  std::string topology_xml;                 // LOOM_TOPOLOGY_XML
  std::string gpu;                          // LOOM_GPU

  // Reads every LOOM_* variable; unset ones keep their defaults. Throws loom::Error naming
  // the variable and the accepted values when one is invalid, and for unknown LOOM_* names.
  static Config from_env();
  // Same, from explicit name/value pairs (tests, or programs with their own config files).
  static Config from_values(const std::map<std::string, std::string, std::less<>>& values);

  // Throws loom::Error if fields set in code are out of range.
  void validate() const;

  bool operator==(const Config&) const = default;
};

// One row of the configuration table: the variable, its default and what it does.
struct ConfigVariable {
  std::string_view name;
  std::string_view default_value;
  std::string_view doc;
};

// Every LOOM_* variable, in the order the README documents them.
[[nodiscard]] std::span<const ConfigVariable> config_variables() noexcept;

// A libfabric provider parameter (an environment variable) loom recommends, and why
// (loom::recommended_provider_settings).
struct ProviderSetting {
  std::string name;
  std::string value;
  std::string why;
};

}  // namespace loom
