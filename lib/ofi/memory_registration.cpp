#include "ofi/memory_registration.hpp"

#include <algorithm>
#include <cstdio>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include "loom/error.hpp"
#include "loom_build_config.h"
#include "ofi/error.hpp"
#include "ofi/nic.hpp"
#include "ofi/rail.hpp"

namespace loom::ofi {
namespace {

constexpr std::uint64_t kAccess =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

std::string region_text(const void* base, std::size_t length) {
  char text[64];
  std::snprintf(text, sizeof text, "%zu bytes at %p", length, base);
  return text;
}

FidPtr<fid_mr> register_on(Nic& nic, const void* base, std::size_t length, MemoryType type,
                           int device, const std::string& where) {
  iovec iov{const_cast<void*>(base), length};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = kAccess;
  attr.requested_key = nic.attributes().prov_key ? 0 : nic.next_requested_key();
  attr.iface = FI_HMEM_SYSTEM;
  if (type == MemoryType::kCuda) {
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = device;
  }
  fid_mr* mr = nullptr;
  if (int rc = fi_mr_regattr(nic.domain(), &attr, 0, &mr); rc != 0) {
    throw_fi_error("register memory", "fi_mr_regattr", nic.attributes().provider, rc,
                   region_text(base, length) + " on " + where);
  }
  return FidPtr<fid_mr>(mr);
}

}  // namespace

MemoryRegistration::MemoryRegistration(std::span<Rail* const> rails, const void* base,
                                       std::size_t length, MemoryType type, int device)
    : base_(base), length_(length), type_(type), device_(device) {
  std::string provider = rails.empty() ? "" : rails.front()->nic().attributes().provider;
  if (rails.empty()) throw Error("register memory", "", FI_EINVAL, "no rails to register on");
  if (base == nullptr) {
    throw Error("register memory", provider, FI_EINVAL,
                "null address (" + std::to_string(length) + " bytes)");
  }
  if (length == 0) {
    throw Error("register memory", provider, FI_EINVAL,
                "zero-length region at " + region_text(base, length));
  }
  if (type == MemoryType::kCuda && !LOOM_HAVE_CUDA) {
    throw Error("register memory", provider, FI_EOPNOTSUPP,
                "device memory needs a loom built with -Dcuda=enabled");
  }
  const NicAttributes& attributes = rails.front()->nic().attributes();
  virt_addr_ = attributes.virt_addr;
  std::size_t max_index = 0;
  for (Rail* rail : rails) max_index = std::max(max_index, rail->index());
  slots_.resize(max_index + 1);

  if (attributes.endpoint_mr) {
    // One registration per endpoint: register, bind to the endpoint, enable. Only then does the
    // provider give a key (FI_MR_PROV_KEY) and accept the descriptor on that endpoint.
    for (Rail* rail : rails) {
      auto mr = register_on(rail->nic(), base, length, type, device, rail->describe());
      if (int rc = fi_mr_bind(mr.get(), &rail->endpoint()->fid, 0); rc != 0) {
        throw_fi_error("register memory", "fi_mr_bind", provider, rc, rail->describe());
      }
      if (int rc = fi_mr_enable(mr.get()); rc != 0) {
        throw_fi_error("register memory", "fi_mr_enable", provider, rc, rail->describe());
      }
      slots_[rail->index()] = Slot{fi_mr_desc(mr.get()), fi_mr_key(mr.get()), true};
      mrs_.push_back(std::move(mr));
    }
  } else {
    // One registration per domain, shared by every rail on that NIC.
    std::vector<std::pair<Nic*, std::size_t>> by_nic;  // NIC -> index into mrs_
    for (Rail* rail : rails) {
      auto it = std::find_if(by_nic.begin(), by_nic.end(),
                             [&](const auto& entry) { return entry.first == &rail->nic(); });
      if (it == by_nic.end()) {
        mrs_.push_back(register_on(rail->nic(), base, length, type, device, rail->describe()));
        it = by_nic.insert(by_nic.end(), {&rail->nic(), mrs_.size() - 1});
      }
      fid_mr* mr = mrs_[it->second].get();
      slots_[rail->index()] = Slot{fi_mr_desc(mr), fi_mr_key(mr), true};
    }
  }
  for (const Slot& slot : slots_) {
    if (slot.registered && slot.key == FI_KEY_NOTAVAIL) {
      throw Error("register memory", provider, FI_ENOKEY,
                  "the provider gave no key for " + region_text(base, length));
    }
  }
}

MemoryRegistration::~MemoryRegistration() = default;

}  // namespace loom::ofi
