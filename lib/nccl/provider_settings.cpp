#include "nccl/provider_settings.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "loom/process.hpp"

namespace loom::nccl {

// NCCL calls init while other threads of the process may read the environment; setenv and
// getenv race in principle (glibc never frees an environment it grew, so a reader sees the old
// or the new one). Providers read these once, at libfabric's first fi_getinfo, and nothing
// earlier in the plugin's life could set them: aws-ofi-nccl sets its provider variables in its
// init the same way.
std::vector<std::string> apply_provider_settings(const Config& config) {
  std::vector<std::string> lines;
  const std::vector<ProviderSetting> settings = recommended_provider_settings(config);
  if (settings.empty()) {
    lines.push_back("provider settings: loom recommends none for provider " +
                    (config.provider.empty() ? std::string("(any)") : config.provider));
    return lines;
  }
  for (const ProviderSetting& s : settings) {
    if (const char* current = std::getenv(s.name.c_str()); current != nullptr) {
      lines.push_back("provider setting " + s.name + " left alone: the environment sets it to " +
                      current + " (loom recommends " + s.value + ": " + s.why + ")");
      continue;
    }
    if (::setenv(s.name.c_str(), s.value.c_str(), 0) != 0) {
      lines.push_back("provider setting " + s.name + "=" + s.value +
                      " not applied: setenv failed: " + std::strerror(errno));
      continue;
    }
    lines.push_back("provider setting " + s.name + "=" + s.value + " applied (unset before; " +
                    s.why + ")");
  }
  return lines;
}

}  // namespace loom::nccl
