#include "info.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace epmr {
namespace {

// libfabric frees info strings with free(), so they are replaced with strdup'ed copies.
bool set_string(char*& field, const char* value) noexcept {
  std::free(field);
  field = value != nullptr ? strdup(value) : nullptr;
  return value == nullptr || field != nullptr;
}

bool same_name(const char* wanted, const char* actual) noexcept {
  return wanted == nullptr || (actual != nullptr && std::strcmp(wanted, actual) == 0);
}

uint64_t hmem_bit(const fi_domain_attr* attr) noexcept {
  return attr != nullptr ? static_cast<uint64_t>(attr->mr_mode) & FI_MR_HMEM : 0;
}

// epmr answers only applications that declare they handle every MR mode bit it requires,
// as a strict provider (cxi) does, and only for what it forwards: RDM endpoints without atomics.
bool accepts(const fi_info* hints) noexcept {
  if (hints == nullptr || hints->domain_attr == nullptr) return false;
  const auto mr_mode = static_cast<uint64_t>(hints->domain_attr->mr_mode);
  if ((mr_mode & kRequiredMrMode) != kRequiredMrMode) return false;
  if (hints->ep_attr != nullptr && hints->ep_attr->type != FI_EP_UNSPEC &&
      hints->ep_attr->type != FI_EP_RDM)
    return false;
  // FI_EPMR_RX_CQ_DATA: a mode the provider requires is one the application must handle.
  if (knobs().rx_cq_data && (hints->mode & FI_RX_CQ_DATA) == 0) return false;
  return (hints->caps & kUnsupportedCaps) == 0;
}

InfoPtr make_inner_hints(const fi_info& hints) noexcept {
  InfoPtr inner(fi_dupinfo(&hints));
  if (!inner) return nullptr;
  // Hints built by hand may lack attribute structs; fi_freeinfo frees these with free().
  if (inner->fabric_attr == nullptr)
    inner->fabric_attr = static_cast<fi_fabric_attr*>(std::calloc(1, sizeof(fi_fabric_attr)));
  if (inner->ep_attr == nullptr)
    inner->ep_attr = static_cast<fi_ep_attr*>(std::calloc(1, sizeof(fi_ep_attr)));
  if (inner->fabric_attr == nullptr || inner->ep_attr == nullptr) return nullptr;
  if (!set_string(inner->fabric_attr->prov_name, kInnerProvider)) return nullptr;
  inner->ep_attr->type = FI_EP_RDM;
  inner->domain_attr->mr_mode = static_cast<int>(kInnerMrMode | hmem_bit(hints.domain_attr));
  return inner;
}

InfoPtr make_outer_info(const fi_info& inner) noexcept {
  InfoPtr outer(fi_dupinfo(&inner));
  if (!outer) return nullptr;
  outer->next = nullptr;
  // A core provider leaves prov_name empty; libfabric then fills in "epmr", which is what lets
  // fi_fabric() route back here.
  set_string(outer->fabric_attr->prov_name, nullptr);
  outer->fabric_attr->prov_version = kProviderVersion;
  outer->domain_attr->mr_mode = static_cast<int>(kRequiredMrMode | hmem_bit(inner.domain_attr));
  if (knobs().rx_cq_data) outer->mode |= FI_RX_CQ_DATA;
  if (const size_t limit = knobs().max_msg_size; limit != 0 && outer->ep_attr != nullptr) {
    outer->ep_attr->max_msg_size = std::min(outer->ep_attr->max_msg_size, limit);
  }
  outer->caps &= ~kUnsupportedCaps;
  if (outer->tx_attr != nullptr) outer->tx_attr->caps &= ~kUnsupportedCaps;
  if (outer->rx_attr != nullptr) outer->rx_attr->caps &= ~kUnsupportedCaps;
  return outer;
}

// tcp ignores a domain-name hint (it lists every interface), so epmr filters by name itself:
// asking for domain "lo" must never hand back eth0.
bool wanted(const fi_info& hints, const fi_info& inner) noexcept {
  const bool domain_ok =
      hints.domain_attr == nullptr || same_name(hints.domain_attr->name, inner.domain_attr->name);
  const bool fabric_ok =
      hints.fabric_attr == nullptr || same_name(hints.fabric_attr->name, inner.fabric_attr->name);
  return domain_ok && fabric_ok;
}

// The inner fi_getinfo must not come back into epmr (it cannot today, because it names
// tcp;ofi_rxm, but a libfabric that routes differently must not recurse forever).
// initial-exec: the flag lives in the static TLS block, not in a dynamic one that libfabric's
// dlclose of this provider at exit leaves dangling in each thread's DTV (LeakSanitizer's exit
// scan then reads it and crashes: "Tracer caught signal 11", seen in p2p-threads-epmr).
[[gnu::tls_model("initial-exec")]] thread_local bool in_getinfo = false;

class ReentryGuard {
 public:
  ReentryGuard() noexcept { in_getinfo = true; }
  ~ReentryGuard() { in_getinfo = false; }
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;
};

InfoPtr inner_hints_for(const fi_info& outer) noexcept {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return nullptr;
  hints->caps = outer.caps;
  hints->mode = outer.mode;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(kInnerMrMode | hmem_bit(outer.domain_attr));
  if (outer.domain_attr != nullptr) {
    hints->domain_attr->threading = outer.domain_attr->threading;
    hints->domain_attr->control_progress = outer.domain_attr->control_progress;
    hints->domain_attr->data_progress = outer.domain_attr->data_progress;
  }
  if (!set_string(hints->fabric_attr->prov_name, kInnerProvider)) return nullptr;
  if (outer.fabric_attr != nullptr &&
      !set_string(hints->fabric_attr->name, outer.fabric_attr->name))
    return nullptr;
  return hints;
}

uint32_t api_version_of(const fi_fabric_attr* attr) noexcept {
  return attr != nullptr && attr->api_version != 0 ? attr->api_version : kApiVersion;
}

}  // namespace

int getinfo(uint32_t version, const char* node, const char* service, uint64_t flags,
            const fi_info* hints, fi_info** info) {
  *info = nullptr;
  if (in_getinfo || (flags & ~kPublicGetinfoFlags) != 0 || !accepts(hints)) return -FI_ENODATA;
  const ReentryGuard guard;

  const InfoPtr inner_hints = make_inner_hints(*hints);
  if (!inner_hints) return -FI_ENOMEM;
  fi_info* inner_list = nullptr;
  const int rc = fi_getinfo(version, node, service, flags, inner_hints.get(), &inner_list);
  const InfoPtr inner_owner(inner_list);
  if (rc != 0) return rc;

  InfoPtr head;
  fi_info* tail = nullptr;
  for (const fi_info* cur = inner_list; cur != nullptr; cur = cur->next) {
    if (!wanted(*hints, *cur)) continue;
    InfoPtr outer = make_outer_info(*cur);
    if (!outer) return -FI_ENOMEM;
    fi_info* raw = outer.release();
    if (tail == nullptr)
      head.reset(raw);
    else
      tail->next = raw;
    tail = raw;
  }
  if (!head) return -FI_ENODATA;
  *info = head.release();
  return 0;
}

int query_inner_fabric(const fi_fabric_attr& outer, InfoPtr& inner) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return -FI_ENOMEM;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(kInnerMrMode);
  if (!set_string(hints->fabric_attr->prov_name, kInnerProvider) ||
      !set_string(hints->fabric_attr->name, outer.name))
    return -FI_ENOMEM;

  fi_info* list = nullptr;
  const int rc = fi_getinfo(api_version_of(&outer), nullptr, nullptr, 0, hints.get(), &list);
  const InfoPtr owner(list);
  if (rc != 0) return rc;
  for (const fi_info* cur = list; cur != nullptr; cur = cur->next) {
    if (same_name(outer.name, cur->fabric_attr->name)) {
      inner.reset(fi_dupinfo(cur));
      return inner ? 0 : -FI_ENOMEM;
    }
  }
  return -FI_ENODATA;
}

int query_inner(const fi_info& outer, InnerView& view) {
  const InfoPtr hints = inner_hints_for(outer);
  if (!hints) return -FI_ENOMEM;
  fi_info* list = nullptr;
  const int rc =
      fi_getinfo(api_version_of(outer.fabric_attr), nullptr, nullptr, 0, hints.get(), &list);
  const InfoPtr owner(list);
  if (rc != 0) return rc;
  const char* domain = outer.domain_attr != nullptr ? outer.domain_attr->name : nullptr;
  for (const fi_info* cur = list; cur != nullptr; cur = cur->next) {
    if (same_name(domain, cur->domain_attr->name)) {
      view.prov_version = cur->fabric_attr->prov_version;
      view.mr_mode = static_cast<uint64_t>(cur->domain_attr->mr_mode);
      return 0;
    }
  }
  return -FI_ENODATA;
}

InfoPtr to_inner_info(const fi_info& outer, const InnerView& view) {
  InfoPtr inner(fi_dupinfo(&outer));
  if (!inner || inner->fabric_attr == nullptr || inner->domain_attr == nullptr) return nullptr;
  if (!set_string(inner->fabric_attr->prov_name, kInnerProvider)) return nullptr;
  inner->fabric_attr->prov_version = view.prov_version;
  inner->domain_attr->mr_mode = static_cast<int>(view.mr_mode);
  return inner;
}

}  // namespace epmr
