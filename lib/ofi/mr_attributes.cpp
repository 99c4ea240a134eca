#include "ofi/mr_attributes.hpp"

#include <cstdio>

#include "loom/error.hpp"

namespace loom::ofi {
namespace {

std::string region_text(const void* base, std::size_t length) {
  char text[64];
  std::snprintf(text, sizeof text, "%zu bytes at %p", length, base);
  return text;
}

}  // namespace

const char* to_string(RegistrationPath path) noexcept {
  switch (path) {
    case RegistrationPath::kHostAddress:
      return "host memory by address";
    case RegistrationPath::kCudaAddress:
      return "CUDA memory by address (FI_HMEM_CUDA)";
    case RegistrationPath::kCudaDmabuf:
      return "CUDA memory through a dmabuf (FI_HMEM_CUDA, FI_MR_DMABUF)";
  }
  return "unknown";
}

std::string version_text(std::uint32_t version) {
  return std::to_string(FI_MAJOR(version)) + "." + std::to_string(FI_MINOR(version));
}

std::string dmabuf_refusal(const DmabufFacts& facts) {
  if (!facts.compiled) {
    return "loom was compiled against libfabric " +
           version_text(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)) +
           " headers, which have no FI_MR_DMABUF (1.20 and later do)";
  }
  if (facts.linked_version < kDmabufApiVersion) {
    return "the libfabric loaded is " + version_text(facts.linked_version) + ", older than 1.20";
  }
  if (!facts.enabled) return "LOOM_CUDA_DMABUF=0";
  if (!facts.device) {
    return "the CUDA driver exports no dmabuf for this GPU (cuMemGetHandleForAddressRange or "
           "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED missing)";
  }
  if (facts.refused) return "the provider refused a dmabuf registration on this NIC before";
  return {};
}

RegistrationPath choose_path(MemoryType type, const DmabufFacts& facts) {
  if (type == MemoryType::kHost) return RegistrationPath::kHostAddress;
  return dmabuf_refusal(facts).empty() ? RegistrationPath::kCudaDmabuf
                                       : RegistrationPath::kCudaAddress;
}

DmabufSource caller_dmabuf(const void* base, const Dmabuf& dmabuf) noexcept {
  const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(base) - dmabuf.offset;
  return {dmabuf.fd, dmabuf.offset, reinterpret_cast<const void*>(start)};
}

void fill_mr_arguments(MrArguments& arguments, RegistrationPath path, const void* base,
                       std::size_t length, int device, std::uint64_t access,
                       std::uint64_t requested_key, const DmabufSource* dmabuf, bool device_only) {
  arguments.iov = iovec{const_cast<void*>(base), length};
  arguments.attr = fi_mr_attr{};
  arguments.attr.mr_iov = &arguments.iov;
  arguments.attr.iov_count = 1;
  arguments.attr.access = access;
  arguments.attr.requested_key = requested_key;
  arguments.attr.iface = FI_HMEM_SYSTEM;
  arguments.flags = 0;
  if (path == RegistrationPath::kHostAddress) return;
  arguments.attr.iface = FI_HMEM_CUDA;
  arguments.attr.device.cuda = device;
  if (device_only) arguments.flags |= FI_HMEM_DEVICE_ONLY;
  if (path == RegistrationPath::kCudaAddress) return;
#if LOOM_FI_DMABUF
  if (dmabuf == nullptr || dmabuf->fd < 0) {
    throw Error("register memory", "", FI_EINVAL,
                "a dmabuf registration of " + region_text(base, length) + " without a dmabuf");
  }
  arguments.dmabuf = fi_mr_dmabuf{};
  arguments.dmabuf.fd = dmabuf->fd;
  arguments.dmabuf.offset = dmabuf->offset;
  arguments.dmabuf.len = length;
  arguments.dmabuf.base_addr = const_cast<void*>(dmabuf->start);
  arguments.attr.dmabuf = &arguments.dmabuf;
  arguments.flags |= FI_MR_DMABUF;
#else
  (void)dmabuf;
  throw Error("register memory", "", FI_EOPNOTSUPP,
              "a dmabuf registration of " + region_text(base, length) +
                  " needs libfabric 1.20 headers at build time");
#endif
}

std::string memory_type_mismatch(MemoryType type, int device, util::cuda::PointerInfo actual,
                                 const void* base, std::size_t length) {
  using util::cuda::PointerKind;
  if (actual.kind == PointerKind::kUnknown) return {};
  const std::string region = region_text(base, length);
  if (type == MemoryType::kHost && actual.kind == PointerKind::kDevice) {
    return region + " is CUDA device memory (device " + std::to_string(actual.device) +
           ") but was registered as host memory; register it as MemoryType::kCuda with its "
           "device";
  }
  if (type == MemoryType::kCuda && actual.kind == PointerKind::kHost) {
    return region + " is host memory but was registered as CUDA device memory";
  }
  if (type == MemoryType::kCuda && actual.device >= 0 && actual.device != device) {
    return region + " lies on CUDA device " + std::to_string(actual.device) +
           " but was registered for device " + std::to_string(device);
  }
  return {};
}

}  // namespace loom::ofi
