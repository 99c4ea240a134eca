// How one registration is described to fi_mr_regattr: the memory interface (FI_HMEM_SYSTEM or
// FI_HMEM_CUDA), the device, and whether the range goes by address or through a dmabuf file
// descriptor (FI_MR_DMABUF, libfabric 1.20 and later). Each choice is a plain function of facts
// (libfabric's versions, the configuration, what the CUDA driver says about the pointer), so
// the tests decide them without a GPU. Private to lib/ofi and its tests: it includes rdma/*.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <sys/uio.h>

#include "loom/memory.hpp"
#include "util/cuda_driver.hpp"

// Whether the libfabric headers loom is compiled against describe a dmabuf (1.20 and later).
#if defined(FI_MR_DMABUF) && \
    FI_VERSION_GE(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), FI_VERSION(1, 20))
#define LOOM_FI_DMABUF 1
#else
#define LOOM_FI_DMABUF 0
#endif

namespace loom::ofi {

// The first libfabric whose fi_mr_attr carries a dmabuf; the fabric must be opened with at
// least this API version for the provider to read it.
inline constexpr std::uint32_t kDmabufApiVersion = FI_VERSION(1, 20);

enum class RegistrationPath : std::uint8_t {
  kHostAddress,  // FI_HMEM_SYSTEM, by address
  kCudaAddress,  // FI_HMEM_CUDA with the device ordinal, by address
  kCudaDmabuf,   // FI_HMEM_CUDA with the device ordinal, through a dmabuf (FI_MR_DMABUF)
};

[[nodiscard]] const char* to_string(RegistrationPath path) noexcept;

struct DmabufFacts {
  bool compiled = LOOM_FI_DMABUF;    // the headers know FI_MR_DMABUF
  std::uint32_t linked_version = 0;  // fi_version() of the libfabric loaded
  bool enabled = true;               // LOOM_CUDA_DMABUF
  bool device = false;               // the driver exports dmabufs of this GPU's memory
  bool refused = false;              // the provider refused a dmabuf registration already
};

// Why CUDA memory does not go through a dmabuf; empty when it does.
[[nodiscard]] std::string dmabuf_refusal(const DmabufFacts& facts);
[[nodiscard]] RegistrationPath choose_path(MemoryType type, const DmabufFacts& facts);

// Where a dmabuf registration's range lies: `fd` exports the pages from `start`, and the
// region begins `offset` bytes into it.
struct DmabufSource {
  int fd = -1;
  std::uint64_t offset = 0;
  const void* start = nullptr;
};

// Where a caller's dmabuf (loom::Dmabuf) lies for a registration of `base`: `base` begins
// dmabuf.offset bytes into it, so the address at its offset 0 is `base` less the offset.
[[nodiscard]] DmabufSource caller_dmabuf(const void* base, const Dmabuf& dmabuf) noexcept;

// What fi_mr_regattr reads. `attr` points into the object itself: keep it where it is.
struct MrArguments {
  MrArguments() = default;
  MrArguments(const MrArguments&) = delete;
  MrArguments& operator=(const MrArguments&) = delete;

  iovec iov{};
#if LOOM_FI_DMABUF
  fi_mr_dmabuf dmabuf{};
#endif
  fi_mr_attr attr{};
  std::uint64_t flags = 0;  // fi_mr_regattr's flags: FI_MR_DMABUF, FI_HMEM_DEVICE_ONLY
};

// Fills `arguments` for registering [base, base + length) along `path`. `dmabuf` is required
// for kCudaDmabuf and ignored otherwise. `device_only`: CUDA memory the host cannot touch
// (cuMemAlloc, not managed memory), registered with FI_HMEM_DEVICE_ONLY, without which shm
// stages every transfer through host bounce buffers instead of copying device to device over
// CUDA IPC (LOOM_CUDA_IPC; README, "GPU memory"). Throws
// loom::Error for kCudaDmabuf where the headers cannot describe one (choose_path never picks
// it there).
void fill_mr_arguments(MrArguments& arguments, RegistrationPath path, const void* base,
                       std::size_t length, int device, std::uint64_t access,
                       std::uint64_t requested_key, const DmabufSource* dmabuf = nullptr,
                       bool device_only = false);

// The error when `type` and `device` contradict what the driver says the memory is; empty when
// they agree or the driver cannot tell. A device pointer registered as host memory is an
// error, never a silent host registration: the NIC would address the wrong memory.
[[nodiscard]] std::string memory_type_mismatch(MemoryType type, int device,
                                               util::cuda::PointerInfo actual, const void* base,
                                               std::size_t length);

// "1.17", "2.6": a libfabric version as text.
[[nodiscard]] std::string version_text(std::uint32_t version);

}  // namespace loom::ofi
