#include "ofi/selection.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include <netinet/in.h>
#include <rdma/fabric.h>

#include "loom/error.hpp"
#include "ofi/error.hpp"
#include "providers/profile.hpp"
#include "util/env.hpp"
#include "util/log.hpp"

namespace loom::ofi {
namespace {

constexpr std::uint32_t kApiVersion = FI_VERSION(1, 17);
constexpr std::uint64_t kCaps =
    FI_MSG | FI_TAGGED | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
// Mode bits loom honours: every context starts with an fi_context2 (OpContext), and remote CQ
// data can consume posted receives (Rail posts them when the provider asks).
constexpr std::uint64_t kModes = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
// Every MR mode bit loom handles; the provider answers with the ones it needs.
constexpr int kMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

InfoPtr make_hints(const Config& config) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) throw std::bad_alloc();
  hints->caps = kCaps;
  hints->mode = kModes;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = kMrModes;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->av_type = FI_AV_TABLE;
  if (!config.provider.empty()) hints->fabric_attr->prov_name = strdup(config.provider.c_str());
  return hints;
}

std::string to_text(const void* value, fi_type type) {
  char buffer[512] = {};
  fi_tostr_r(buffer, sizeof buffer, value, type);
  std::string text(buffer);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

bool is_loopback(const fi_info& info) {
  if (info.src_addr == nullptr) return true;
  if (info.addr_format == FI_SOCKADDR_IN) {
    auto* sin = static_cast<const sockaddr_in*>(info.src_addr);
    return (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
  }
  if (info.addr_format == FI_SOCKADDR_IN6) {
    auto* sin6 = static_cast<const sockaddr_in6*>(info.src_addr);
    return std::memcmp(&sin6->sin6_addr, &in6addr_loopback, sizeof(in6_addr)) == 0;
  }
  return true;  // not an IP address (shm, efa, cxi): not a network interface to filter
}

const char* domain_of(const fi_info& info) {
  return info.domain_attr->name != nullptr ? info.domain_attr->name : "";
}
const char* provider_of(const fi_info& info) {
  return info.fabric_attr->prov_name != nullptr ? info.fabric_attr->prov_name : "";
}

bool nic_allowed(const fi_info& info, const Config& config) {
  if (config.loopback_only && !is_loopback(info)) return false;
  if (config.nics.empty()) return true;
  return std::find(config.nics.begin(), config.nics.end(), domain_of(info)) != config.nics.end();
}

// libfabric matches a provider name against every ';'-separated layer ("tcp" selects
// "tcp;ofi_rxm"); the diagnosis mirrors that.
bool names_provider(std::string_view requested, std::string_view provider) {
  if (requested.empty() || requested == provider) return true;
  while (!provider.empty()) {
    auto layer = provider.substr(0, provider.find(';'));
    if (layer == requested) return true;
    if (layer.size() == provider.size()) break;
    provider.remove_prefix(layer.size() + 1);
  }
  return false;
}

std::string list_text(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
  return text.empty() ? "none" : text;
}

// Why `provider` could not serve loom, judged from its unfiltered fi_getinfo entries.
std::string refusal(const std::string& provider, const fi_info* all, const fi_info* matched,
                    const Config& config) {
  if (!names_provider(config.provider, provider)) {
    return "not the requested provider (LOOM_PROVIDER=" + config.provider + ")";
  }
  std::vector<std::string> domains;
  for (const fi_info* i = matched; i != nullptr; i = i->next) {
    if (provider_of(*i) == provider) domains.emplace_back(domain_of(*i));
  }
  if (!domains.empty()) {
    std::sort(domains.begin(), domains.end());
    domains.erase(std::unique(domains.begin(), domains.end()), domains.end());
    return "its NICs (" + list_text(domains) +
           ") are excluded by LOOM_NICS=" + list_text(config.nics) +
           (config.loopback_only ? " / LOOM_LOOPBACK_ONLY=1" : "");
  }
  bool rdm = false;
  std::uint64_t caps = 0;
  std::uint64_t modes = ~0ull;
  int mr_modes = ~0;
  for (const fi_info* i = all; i != nullptr; i = i->next) {
    if (provider_of(*i) != provider || i->ep_attr->type != FI_EP_RDM) continue;
    rdm = true;
    caps |= i->caps;
    modes &= i->mode;
    mr_modes &= i->domain_attr->mr_mode;
  }
  if (!rdm) return "offers no reliable-datagram (FI_EP_RDM) endpoint";
  if (std::uint64_t missing = kCaps & ~caps; missing != 0) {
    return "lacks capabilities " + to_text(&missing, FI_TYPE_CAPS);
  }
  if (std::uint64_t extra = modes & ~kModes; extra != 0) {
    return "requires mode bits loom does not handle: " + to_text(&extra, FI_TYPE_MODE);
  }
  if (int extra = mr_modes & ~(kMrModes | FI_MR_BASIC | FI_MR_SCALABLE); extra != 0) {
    return "requires MR mode bits loom does not handle: " + to_text(&extra, FI_TYPE_MR_MODE);
  }
  return "refused loom's hints (FI_EP_RDM, " + to_text(&kCaps, FI_TYPE_CAPS) +
         ", FI_THREAD_SAFE) for another reason; FI_LOG_LEVEL=info tells which";
}

[[noreturn]] void throw_no_match(const Config& config, const fi_info* matched, long rc) {
  fi_info* all = nullptr;
  fi_getinfo(kApiVersion, nullptr, nullptr, 0, nullptr, &all);
  InfoPtr all_owner(all);
  std::vector<std::string> providers;
  for (const fi_info* i = all; i != nullptr; i = i->next) {
    std::string name = provider_of(*i);
    if (std::find(providers.begin(), providers.end(), name) == providers.end()) {
      providers.push_back(name);
    }
  }
  const auto fi_provider = util::environment("FI_PROVIDER");
  std::string detail = "no usable provider for LOOM_PROVIDER=" +
                       (config.provider.empty() ? std::string("(any)") : config.provider) +
                       ", FI_PROVIDER=" + fi_provider.value_or("(unset)") +
                       ", LOOM_NICS=" + list_text(config.nics);
  if (rc != 0 && rc != -FI_ENODATA) detail += "; fi_getinfo failed: " + fi_error_text(rc);
  detail += ". Providers found:";
  if (providers.empty()) detail += " none (is FI_PROVIDER filtering them all?)";
  for (const auto& name : providers) {
    detail += "\n  " + name + ": " + refusal(name, all, matched, config);
  }
  throw Error("select provider", config.provider, rc == 0 ? FI_ENODATA : static_cast<int>(-rc),
              detail);
}

// Providers read their parameters from the environment when libfabric initializes them or
// builds an fi_info, so loom's defaults go there, once per process and before loom's first
// fi_getinfo: the families the first context names (LOOM_PROVIDER, else FI_PROVIDER), or all.
void apply_provider_defaults(const Config& config) {
  const std::string requested =
      !config.provider.empty() ? config.provider : util::environment("FI_PROVIDER").value_or("");
  std::vector<util::EnvironmentDefault> defaults;
  for (const providers::EnvDefault& d : providers::env_defaults_for(requested)) {
    defaults.push_back({d.name, d.value});
  }
  if (util::set_environment_defaults_once(defaults) && !defaults.empty()) {
    std::string text;
    for (const auto& d : defaults)
      text += std::string(text.empty() ? "" : ", ") + d.name + "=" + d.value;
    util::log().info("provider defaults, each where the environment has no value of its own: {}",
                     text);
  }
}

}  // namespace

std::vector<std::unique_ptr<Nic>> open_nics(const Config& config) {
  config.validate();
  apply_provider_defaults(config);
  InfoPtr hints = make_hints(config);
  fi_info* list = nullptr;
  long rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list);
  InfoPtr list_owner(list);
  if (rc != 0) throw_no_match(config, nullptr, rc);

  // The first allowed entry picks the provider; then one entry per domain of that provider.
  std::string provider;
  std::vector<const fi_info*> chosen;
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    if (!nic_allowed(*i, config)) continue;
    if (provider.empty()) provider = provider_of(*i);
    if (provider_of(*i) != provider) continue;
    bool seen = std::any_of(chosen.begin(), chosen.end(), [&](const fi_info* c) {
      return std::strcmp(domain_of(*c), domain_of(*i)) == 0;
    });
    if (!seen) chosen.push_back(i);
  }
  if (chosen.empty()) throw_no_match(config, list, 0);

  if (!config.nics.empty()) {
    std::vector<const fi_info*> ordered;
    std::vector<std::string> missing;
    for (const auto& name : config.nics) {
      auto it = std::find_if(chosen.begin(), chosen.end(),
                             [&](const fi_info* c) { return name == domain_of(*c); });
      if (it == chosen.end()) {
        missing.push_back(name);
      } else {
        ordered.push_back(*it);
      }
    }
    if (!missing.empty()) {
      std::vector<std::string> found;
      for (const fi_info* c : chosen) found.emplace_back(domain_of(*c));
      throw Error("select provider", provider, FI_ENODEV,
                  "LOOM_NICS names " + list_text(missing) + ", which " + provider +
                      " does not offer (it offers " + list_text(found) + ")");
    }
    chosen = std::move(ordered);
  }

  std::vector<std::unique_ptr<Nic>> nics;
  for (const fi_info* c : chosen) {
    // fi_dupinfo copies the whole list from this entry on; keep just the entry.
    fi_info single = *c;
    single.next = nullptr;
    nics.push_back(std::make_unique<Nic>(duplicate(single)));
  }
  util::log().info("provider {}: {} NIC(s); {}", provider, nics.size(),
                   nics.front()->profile().summary);
  return nics;
}

}  // namespace loom::ofi
