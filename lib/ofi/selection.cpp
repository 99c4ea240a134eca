#include "ofi/selection.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include <netinet/in.h>
#include <rdma/fabric.h>
#include <unistd.h>

#include "loom/error.hpp"
#include "loom_build_config.h"
#include "ofi/error.hpp"
#include "ofi/mr_attributes.hpp"
#include "providers/profile.hpp"
#include "util/env.hpp"
#include "util/log.hpp"

namespace loom::ofi {
namespace {

constexpr std::uint32_t kMinApiVersion = FI_VERSION(1, 17);
constexpr std::uint64_t kCaps =
    FI_MSG | FI_TAGGED | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
// Mode bits loom honours: every context starts with an fi_context2 (OpContext), and remote CQ
// data can consume posted receives (Rail posts them when the provider asks).
constexpr std::uint64_t kModes = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
// Every MR mode bit loom handles; the provider answers with the ones it needs.
constexpr int kMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
// FI_MR_BASIC | FI_MR_SCALABLE: old providers report them; libfabric 2 deprecates the names.
constexpr int kLegacyMrModes = (1 << 0) | (1 << 1);

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
  if (int extra = mr_modes & ~(kMrModes | kLegacyMrModes); extra != 0) {
    return "requires MR mode bits loom does not handle: " + to_text(&extra, FI_TYPE_MR_MODE);
  }
  return "refused loom's hints (FI_EP_RDM, " + to_text(&kCaps, FI_TYPE_CAPS) +
         ", FI_THREAD_SAFE) for another reason; FI_LOG_LEVEL=info tells which";
}

// Every entry libfabric has, unfiltered (for diagnoses).
InfoPtr list_everything() {
  fi_info* all = nullptr;
  fi_getinfo(api_version(), nullptr, nullptr, 0, nullptr, &all);
  return InfoPtr(all);
}

[[noreturn]] void throw_no_match(const Config& config, const fi_info* matched, long rc) {
  InfoPtr all_owner = list_everything();
  const fi_info* all = all_owner.get();
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

// Logs, once per process, the recommended provider settings the environment lacks: loom never
// writes the environment (providers/profile.hpp says why), so the user learns what to set.
void report_missing_settings(const Config& config) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::string text;
    for (const ProviderSetting& s : recommended_settings(config)) {
      if (util::environment(s.name.c_str())) continue;
      text += std::string(text.empty() ? "" : "; ") + s.name + "=" + s.value + " (" + s.why + ")";
    }
    if (!text.empty())
      util::log().info("recommended provider settings not in the environment: {}", text);
  });
}

// The entry of the FI_HMEM answer for the NIC `chosen` describes (same provider, domain and
// address format, allowed by the configuration); nullptr when the provider gave none.
const fi_info* hmem_entry_for(const fi_info& chosen, const fi_info* hmem_list,
                              const Config& config) {
  for (const fi_info* i = hmem_list; i != nullptr; i = i->next) {
    if (std::strcmp(provider_of(*i), provider_of(chosen)) == 0 &&
        std::strcmp(domain_of(*i), domain_of(chosen)) == 0 &&
        i->addr_format == chosen.addr_format && (i->caps & FI_HMEM) != 0 &&
        nic_allowed(*i, config)) {
      return i;
    }
  }
  return nullptr;
}

InfoPtr single_entry(const fi_info& entry) {
  // fi_dupinfo copies the whole list from this entry on; keep just the entry.
  fi_info single = entry;
  single.next = nullptr;
  return duplicate(single);
}

// The chosen entry asked again with what `change` alters in it: the answer's entry for the same
// provider, domain and address format, if `granted` says it has what was asked; else null.
template <typename Change, typename Granted>
InfoPtr ask_again(const fi_info& entry, Change change, Granted granted) {
  InfoPtr hints = single_entry(entry);
  change(*hints);
  fi_info* list = nullptr;
  const int rc = fi_getinfo(api_version(), nullptr, nullptr, 0, hints.get(), &list);
  InfoPtr owner(list);
  for (const fi_info* i = rc == 0 ? list : nullptr; i != nullptr; i = i->next) {
    if (std::strcmp(provider_of(*i), provider_of(entry)) == 0 &&
        std::strcmp(domain_of(*i), domain_of(entry)) == 0 && i->addr_format == entry.addr_format &&
        granted(*i)) {
      return single_entry(*i);
    }
  }
  return nullptr;
}

// The chosen entry asked again, as it is, for an inject size of `wanted`; null if refused.
InfoPtr granting_inject_size(const fi_info& entry, std::size_t wanted) {
  return ask_again(
      entry, [&](fi_info& hints) { hints.tx_attr->inject_size = wanted; },
      [&](const fi_info& i) { return i.tx_attr != nullptr && i.tx_attr->inject_size >= wanted; });
}

// A lane's endpoints and the CQs they share are only ever used under the lane's lock (lib/mux),
// and loom drives their progress itself: FI_THREAD_COMPLETION with FI_PROGRESS_MANUAL data
// progress says so, and rxm (tcp;ofi_rxm, verbs;ofi_rxm) then drops its endpoint's and CQ's
// locks from every call: six lock pairs per message on tcp. rxm grants FI_THREAD_COMPLETION only
// with manual progress (auto progress would start a thread of its own), so the chosen entry is
// asked again with both, where the profile says so: sockets, asked for manual progress, refuses
// injects to a peer it has not connected to yet, and shm gains nothing (1.17 keeps its locks
// whatever the hints). The entry as it was where the provider refuses.
InfoPtr with_completion_threading(const fi_info& entry) {
  if (providers::profile_for(provider_of(entry)).completion_threading &&
      entry.domain_attr->threading != FI_THREAD_COMPLETION) {
    InfoPtr granted = ask_again(
        entry,
        [](fi_info& hints) {
          hints.domain_attr->threading = FI_THREAD_COMPLETION;
          hints.domain_attr->data_progress = FI_PROGRESS_MANUAL;
        },
        [](const fi_info& i) { return i.domain_attr->threading == FI_THREAD_COMPLETION; });
    if (granted) return granted;
  }
  return single_entry(entry);
}

// Providers report a small inject size unless asked for more (tcp;ofi_rxm: 64 bytes, and up
// to its buffer size when asked, FI_OFI_RXM_BUFFER_SIZE, 16 KiB unless set lower). One that
// refuses `wanted` is asked for half as much, a few times while that is more than it offered:
// a user's smaller rxm buffer then still gets injects of its size, not 64 bytes. One that
// grants none keeps the entry it offered. `refused` is the smallest size refused so far by
// this provider's other NICs: not asked again (a host with 32 NICs would ask 128 times).
InfoPtr with_inject_size(const fi_info& entry, std::size_t wanted, std::size_t& refused) {
  constexpr int kAsks = 4;
  const std::size_t offered = entry.tx_attr != nullptr ? entry.tx_attr->inject_size : wanted;
  std::size_t ask = wanted;
  for (int i = 0; i < kAsks && ask > offered; ++i, ask /= 2) {
    if (ask >= refused) continue;
    if (InfoPtr granted = granting_inject_size(entry, ask)) return granted;
    refused = ask;
  }
  return single_entry(entry);
}

}  // namespace

std::size_t remove_process_leftovers(int pid) noexcept {
  return providers::remove_leftovers_of(pid);
}

std::vector<ProviderSetting> recommended_settings(const Config& config) {
  const std::string requested =
      !config.provider.empty() ? config.provider : util::environment("FI_PROVIDER").value_or("");
  std::vector<ProviderSetting> out;
  for (const providers::ProviderSetting& s : providers::settings_for(requested)) {
    out.push_back({s.name, s.value, s.why});
  }
  return out;
}

std::uint32_t api_version() noexcept {
  // fi_version() is the libfabric loaded, which may be older than the headers.
  if (LOOM_FI_DMABUF && fi_version() >= kDmabufApiVersion) return kDmabufApiVersion;
  return kMinApiVersion;
}

const char* domain_of(const fi_info& info) noexcept {
  return info.domain_attr != nullptr && info.domain_attr->name != nullptr ? info.domain_attr->name
                                                                          : "";
}

const char* provider_of(const fi_info& info) noexcept {
  return info.fabric_attr != nullptr && info.fabric_attr->prov_name != nullptr
             ? info.fabric_attr->prov_name
             : "";
}

InfoPtr make_hints(const Config& config, bool device_memory) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) throw std::bad_alloc();
  hints->caps = kCaps | (device_memory ? FI_HMEM : 0);
  hints->mode = kModes;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = kMrModes | (device_memory ? FI_MR_HMEM : 0);
  // Where the provider's profile says so, the entry chosen is asked again for less
  // (with_completion_threading).
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->av_type = FI_AV_TABLE;
  if (!config.provider.empty()) hints->fabric_attr->prov_name = strdup(config.provider.c_str());
  return hints;
}

std::string device_memory_refusal(const fi_info* all, std::string_view provider,
                                  std::string_view domain) {
  bool listed = false;
  bool hmem = false;
  int mr_modes = ~0;
  for (const fi_info* i = all; i != nullptr; i = i->next) {
    if (provider_of(*i) != provider || domain_of(*i) != domain || i->ep_attr == nullptr ||
        i->ep_attr->type != FI_EP_RDM) {
      continue;
    }
    listed = true;
    if ((i->caps & FI_HMEM) == 0) continue;
    hmem = true;
    mr_modes &= i->domain_attr->mr_mode;
  }
  const std::string where = std::string(provider) + " on " + std::string(domain);
  if (!hmem) {
    return where + (listed ? " offers no FI_HMEM" : " is not listed with FI_HMEM") +
           ": the provider has no device-memory support in libfabric " +
           version_text(fi_version()) + ", or libfabric was built without --with-cuda";
  }
  if (int extra = mr_modes & ~(kMrModes | FI_MR_HMEM | kLegacyMrModes); extra != 0) {
    return where + " offers FI_HMEM only with MR mode bits loom does not handle: " +
           to_text(&extra, FI_TYPE_MR_MODE);
  }
  return where + " offers FI_HMEM, but not together with loom's other hints (" +
         to_text(&kCaps, FI_TYPE_CAPS) + ", FI_MR_HMEM); FI_LOG_LEVEL=info tells why";
}

std::vector<std::unique_ptr<Nic>> open_nics(const Config& config) {
  config.validate();
  report_missing_settings(config);
  if (const std::size_t removed = providers::remove_own_stale_leftovers(); removed != 0)
    util::log().warn(
        "removed {} provider object(s) that a killed earlier process with this "
        "pid ({}) left on the host: they would stop endpoints opening",
        removed, ::getpid());
  InfoPtr hints = make_hints(config, false);
  fi_info* list = nullptr;
  long rc = fi_getinfo(api_version(), nullptr, nullptr, 0, hints.get(), &list);
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

  // Device memory: the chosen provider asked again with FI_HMEM and FI_MR_HMEM. Asking this
  // second, for the provider the plain hints chose, keeps the choice of provider and NICs the
  // same in builds with and without CUDA; a NIC whose provider refuses keeps its host-only
  // entry and says why.
  InfoPtr hmem_owner;
  long hmem_rc = -FI_ENODATA;
  const bool device_memory = LOOM_HAVE_CUDA && config.device_memory;
  if (device_memory) {
    InfoPtr hmem_hints = make_hints(config, true);
    std::free(hmem_hints->fabric_attr->prov_name);
    hmem_hints->fabric_attr->prov_name = strdup(provider.c_str());
    fi_info* hmem_list = nullptr;
    hmem_rc = fi_getinfo(api_version(), nullptr, nullptr, 0, hmem_hints.get(), &hmem_list);
    hmem_owner.reset(hmem_list);
  }
  InfoPtr everything;  // for the reasons, listed once and only when needed
  std::vector<std::unique_ptr<Nic>> nics;
  std::size_t inject_refused = std::numeric_limits<std::size_t>::max();
  for (const fi_info* c : chosen) {
    NicOptions options{
        .device_memory_note = {}, .cuda_dmabuf = config.cuda_dmabuf, .cuda_ipc = config.cuda_ipc};
    const fi_info* hmem = hmem_entry_for(*c, hmem_owner.get(), config);
    if (!LOOM_HAVE_CUDA) {
      options.device_memory_note = "loom was built without CUDA (meson setup -Dcuda=enabled)";
    } else if (!config.device_memory) {
      options.device_memory_note = "LOOM_DEVICE_MEMORY=0";
    } else if (hmem == nullptr) {
      if (!everything) everything = list_everything();
      options.device_memory_note =
          device_memory_refusal(everything.get(), provider_of(*c), domain_of(*c));
      if (hmem_rc != 0 && hmem_rc != -FI_ENODATA) {
        options.device_memory_note += "; fi_getinfo with FI_HMEM failed: " + fi_error_text(hmem_rc);
      }
      util::log().info("NIC {} [{}]: host memory only: {}", domain_of(*c), provider,
                       options.device_memory_note);
    }
    const InfoPtr serialized = with_completion_threading(hmem != nullptr ? *hmem : *c);
    nics.push_back(std::make_unique<Nic>(
        with_inject_size(*serialized,
                         config.inject_max == 0 ? 0 : config.inject_max + kInjectHeadroom,
                         inject_refused),
        std::move(options)));
  }
  util::log().info("provider {} (API {}): {} NIC(s); {}", provider, version_text(api_version()),
                   nics.size(), nics.front()->profile().summary);
  return nics;
}

}  // namespace loom::ofi
