#include <algorithm>
#include <cerrno>
#include <iterator>

#include <signal.h>

#include "providers/profile.hpp"

namespace loom::providers {
namespace {

constexpr Profile kGenericProfile{
    .family = "",
    .summary = "no loom-specific settings for this provider",
    .settings = {},
};

constexpr const Profile* kProfiles[] = {&kEfaProfile, &kCxiProfile, &kVerbsProfile,
                                        &kTcpProfile, &kShmProfile, &kSocketsProfile,
                                        &kUdpProfile};

// "verbs;ofi_rxm" and "tcp;ofi_rxm" name the core provider first.
std::string_view core_name(std::string_view prov_name) {
  return prov_name.substr(0, prov_name.find(';'));
}

}  // namespace

const Profile& profile_for(std::string_view prov_name) noexcept {
  auto core = core_name(prov_name);
  for (const Profile* profile : kProfiles)
    if (profile->family == core) return *profile;
  return kGenericProfile;
}

std::span<const Profile* const> all_profiles() noexcept {
  return kProfiles;
}

std::size_t remove_leftovers_of(int pid) noexcept {
  if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) return 0;
  std::size_t removed = 0;
  for (const Profile* profile : kProfiles)
    if (profile->remove_leftovers != nullptr) removed += profile->remove_leftovers(pid);
  return removed;
}

std::size_t remove_own_stale_leftovers() noexcept {
  std::size_t removed = 0;
  for (const Profile* profile : kProfiles)
    if (profile->remove_own_stale != nullptr) removed += profile->remove_own_stale();
  return removed;
}

std::vector<ProviderSetting> settings_for(std::string_view requested) {
  const auto named = [requested](const Profile& profile) {
    std::string_view rest = requested;
    while (!rest.empty()) {
      const auto cut = rest.find_first_of(",;");
      if (rest.substr(0, cut) == profile.family) return true;
      rest = cut == std::string_view::npos ? std::string_view{} : rest.substr(cut + 1);
    }
    return false;
  };
  const bool any_named = std::any_of(std::begin(kProfiles), std::end(kProfiles),
                                     [&](const Profile* p) { return named(*p); });
  std::vector<ProviderSetting> defaults;
  for (const Profile* profile : kProfiles) {
    if (any_named && !named(*profile)) continue;
    for (const ProviderSetting& env : profile->settings) {
      const bool seen = std::any_of(
          defaults.begin(), defaults.end(),
          [&](const ProviderSetting& d) { return std::string_view(d.name) == env.name; });
      if (!seen) defaults.push_back(env);
    }
  }
  return defaults;
}

}  // namespace loom::providers
