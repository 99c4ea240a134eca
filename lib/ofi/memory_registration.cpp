#include "ofi/memory_registration.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <tuple>
#include <utility>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include "loom/error.hpp"
#include "loom_build_config.h"
#include "ofi/error.hpp"
#include "ofi/mr_attributes.hpp"
#include "ofi/nic.hpp"
#include "util/cuda_driver.hpp"
#include "util/log.hpp"

namespace loom::ofi {
namespace {

constexpr std::uint64_t kAccess =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

std::string region_text(const void* base, std::size_t length) {
  char text[64];
  std::snprintf(text, sizeof text, "%zu bytes at %p", length, base);
  return text;
}

}  // namespace

// What every fid_mr of one MemoryRegistration shares: the range, its memory type, and for CUDA
// memory the driver and the dmabuf: the caller's (`external`), or loom's own export (made at the
// first NIC that takes one, closed once the registration is made: the provider holds the
// memory from then on).
struct MemoryRegistration::Source {
  const void* base;
  std::size_t length;
  MemoryType type;
  int device;
  const Dmabuf* external = nullptr;      // the caller's dmabuf (register_memory's dmabuf form)
  util::cuda::Driver* driver = nullptr;  // null for host memory without a loaded driver
  std::optional<util::cuda::DmabufRange> dmabuf;
  bool dmabuf_failed = false;  // the driver would not export it: by address on every NIC
  bool device_only = false;    // CUDA memory the host cannot touch (FI_HMEM_DEVICE_ONLY)

  // Where the dmabuf of a kCudaDmabuf registration lies.
  [[nodiscard]] DmabufSource dmabuf_source() const {
    if (external != nullptr) return caller_dmabuf(base, *external);
    return {dmabuf->fd.get(), dmabuf->offset, dmabuf->start};
  }
};

FidPtr<fid_mr> MemoryRegistration::register_on(Nic& nic, Source& source, const std::string& where) {
  const NicAttributes& attributes = nic.attributes();
  // A caller's dmabuf is exported already: what the driver would export does not matter.
  DmabufFacts facts{.linked_version = fi_version(),
                    .enabled = attributes.cuda_dmabuf,
                    .device = source.external != nullptr ||
                              (source.driver != nullptr && source.type == MemoryType::kCuda &&
                               source.driver->dmabuf_supported(source.device)),
                    .refused = nic.dmabuf_refused()};
  facts.compiled = facts.compiled && attributes.api_version >= kDmabufApiVersion;
  RegistrationPath path = choose_path(source.type, facts);
  if (source.external != nullptr && path != RegistrationPath::kCudaDmabuf) {
    util::log().info("{}: the caller's dmabuf is not used ({}); registering by address", where,
                     dmabuf_refusal(facts));
  }
  if (path == RegistrationPath::kCudaDmabuf && source.external == nullptr && !source.dmabuf &&
      !source.dmabuf_failed) {
    try {
      source.dmabuf = source.driver->dmabuf_range(source.base, source.length, source.device);
    } catch (const Error& e) {
      util::log().info("{}; registering by address", e.what());
      source.dmabuf_failed = true;
    }
  }
  if (source.dmabuf_failed && source.external == nullptr) path = RegistrationPath::kCudaAddress;
  const std::uint64_t key = attributes.prov_key ? 0 : nic.next_requested_key();
  MrArguments arguments;
  const auto attempt = [&](RegistrationPath how) {
    DmabufSource dmabuf;
    if (how == RegistrationPath::kCudaDmabuf) dmabuf = source.dmabuf_source();
    fill_mr_arguments(arguments, how, source.base, source.length, source.device, kAccess, key,
                      &dmabuf, source.device_only && attributes.cuda_ipc);
    fid_mr* mr = nullptr;
    const int rc = fi_mr_regattr(nic.domain(), &arguments.attr, arguments.flags, &mr);
    return std::pair{rc, FidPtr<fid_mr>(mr)};
  };
  auto [rc, mr] = attempt(path);
  if (rc != 0 && path == RegistrationPath::kCudaDmabuf) {
    util::log().info(
        "{}: the provider refused a dmabuf registration ({}); CUDA memory goes by "
        "address on this NIC from now on",
        where, fi_error_text(rc));
    nic.refuse_dmabuf();
    path = RegistrationPath::kCudaAddress;
    std::tie(rc, mr) = attempt(path);
  }
  if (rc != 0) {
    std::string detail =
        region_text(source.base, source.length) + " (" + to_string(path) + ") on " + where;
    if (source.type == MemoryType::kCuda && rc == -FI_ENOSYS) {
      detail += "; this libfabric cannot register CUDA memory (build it --with-cuda)";
    }
    throw_fi_error("register memory", "fi_mr_regattr", attributes.provider, rc, detail);
  }
  through_dmabuf_ = through_dmabuf_ || path == RegistrationPath::kCudaDmabuf;
  return std::move(mr);
}

MemoryRegistration::MemoryRegistration(std::span<const RegistrationTarget> targets,
                                       const void* base, std::size_t length, MemoryType type,
                                       int device, const Dmabuf* dmabuf)
    : base_(base), length_(length), type_(type), device_(device) {
  std::string provider = targets.empty() ? "" : targets.front().nic->attributes().provider;
  if (targets.empty()) throw Error("register memory", "", FI_EINVAL, "no rails to register on");
  if (base == nullptr) {
    throw Error("register memory", provider, FI_EINVAL,
                "null address (" + std::to_string(length) + " bytes)");
  }
  if (length == 0) {
    throw Error("register memory", provider, FI_EINVAL,
                "zero-length region at " + region_text(base, length));
  }
  if (dmabuf != nullptr && type != MemoryType::kCuda) {
    throw Error("register memory", provider, FI_EINVAL,
                region_text(base, length) + ": a dmabuf registration is for CUDA memory");
  }
  if (dmabuf != nullptr && dmabuf->fd < 0) {
    throw Error(
        "register memory", provider, FI_EBADF,
        region_text(base, length) + ": dmabuf file descriptor " + std::to_string(dmabuf->fd));
  }
  if (type == MemoryType::kCuda && !LOOM_HAVE_CUDA) {
    throw Error("register memory", provider, FI_EOPNOTSUPP,
                "device memory needs a loom built with -Dcuda=enabled");
  }
  Source source{.base = base, .length = length, .type = type, .device = device, .external = dmabuf};
  check_memory(targets, source, provider);
  const NicAttributes& attributes = targets.front().nic->attributes();
  virt_addr_ = attributes.virt_addr;
  std::size_t max_index = 0;
  for (const RegistrationTarget& target : targets) max_index = std::max(max_index, target.index);
  slots_.resize(max_index + 1);

  if (attributes.endpoint_mr) {
    // One registration per endpoint: register, bind to the endpoint, enable. Only then does the
    // provider give a key (FI_MR_PROV_KEY) and accept the descriptor on that endpoint.
    for (const RegistrationTarget& target : targets) {
      const std::string where(target.name);
      auto mr = register_on(*target.nic, source, where);
      if (int rc = fi_mr_bind(mr.get(), &target.endpoint->fid, 0); rc != 0) {
        throw_fi_error("register memory", "fi_mr_bind", provider, rc, where);
      }
      if (int rc = fi_mr_enable(mr.get()); rc != 0) {
        throw_fi_error("register memory", "fi_mr_enable", provider, rc, where);
      }
      slots_[target.index] = Slot{fi_mr_desc(mr.get()), fi_mr_key(mr.get()), true};
      mrs_.push_back(std::move(mr));
    }
  } else {
    // One registration per domain, shared by every rail on that NIC.
    std::vector<std::pair<Nic*, std::size_t>> by_nic;  // NIC -> index into mrs_
    for (const RegistrationTarget& target : targets) {
      auto it = std::find_if(by_nic.begin(), by_nic.end(),
                             [&](const auto& entry) { return entry.first == target.nic; });
      if (it == by_nic.end()) {
        mrs_.push_back(register_on(*target.nic, source, std::string(target.name)));
        it = by_nic.insert(by_nic.end(), {target.nic, mrs_.size() - 1});
      }
      fid_mr* mr = mrs_[it->second].get();
      slots_[target.index] = Slot{fi_mr_desc(mr), fi_mr_key(mr), true};
    }
  }
  for (const Slot& slot : slots_) {
    if (slot.registered && slot.key == FI_KEY_NOTAVAIL) {
      throw Error("register memory", provider, FI_ENOKEY,
                  "the provider gave no key for " + region_text(base, length));
    }
  }
}

// CUDA memory needs a driver, must be what it is said to be, and needs NICs with FI_HMEM; host
// memory is checked against the driver only where the process has it loaded already (an
// application that uses CUDA), so a host-only program never loads it.
void MemoryRegistration::check_memory(std::span<const RegistrationTarget> targets, Source& source,
                                      const std::string& provider) {
  const std::string region = region_text(source.base, source.length);
  if (source.type == MemoryType::kCuda) {
    try {
      source.driver = &util::cuda::Driver::instance();
    } catch (const Error& e) {
      throw Error("register memory", provider, 0, region + " as CUDA memory: " + e.what());
    }
  } else {
    source.driver = util::cuda::Driver::if_loaded();
  }
  if (source.driver != nullptr) {
    const util::cuda::PointerInfo actual = source.driver->pointer_info(source.base);
    const std::string mismatch =
        memory_type_mismatch(source.type, source.device, actual, source.base, source.length);
    if (!mismatch.empty()) throw Error("register memory", provider, FI_EINVAL, mismatch);
    source.device_only = source.type == MemoryType::kCuda &&
                         actual.kind == util::cuda::PointerKind::kDevice && !actual.managed;
  }
  if (source.type != MemoryType::kCuda) return;
  for (const RegistrationTarget& target : targets) {
    const NicAttributes& attributes = target.nic->attributes();
    if (!attributes.device_memory) {
      throw Error("register memory", provider, FI_EOPNOTSUPP,
                  region + " is CUDA memory, but NIC " + attributes.domain +
                      " has no device-memory support: " + attributes.device_memory_note);
    }
  }
}

MemoryRegistration::~MemoryRegistration() = default;

}  // namespace loom::ofi
