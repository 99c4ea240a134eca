// ncclnet_check's GPU memory (--device cuda[:N]): the CUDA driver API reached through
// dlopen("libcuda.so.1"), as NCCL reaches it, with the few entries the tool uses declared here
// by their ABI (no cuda.h: the tool builds without the toolkit, links nothing of CUDA and
// nothing of loom). The driver is loaded in the ranks, never before they fork: CUDA does not
// survive a fork.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ncclnet {

// Where the cases' and the bandwidth mode's buffers live (--device): host memory, or GPU `gpu`,
// or host memory handled as GPU memory is (`staged`: a buffer apart from the bytes the case
// checks, copied to and from it, every receive flushed), which checks the tool's GPU path
// without a GPU.
struct MemoryChoice {
  bool cuda = false;
  bool staged = false;
  int gpu = 0;
  // Whether buffers are apart from their host copies (GPU memory, or staged).
  [[nodiscard]] bool separate() const noexcept { return cuda || staged; }
};
// "host", "staged", "cuda" or "cuda:N"; throws CheckError.
[[nodiscard]] MemoryChoice parse_memory(const std::string& text);
// Set once in main before any rank forks; read in the ranks.
void set_memory(const MemoryChoice& choice);
[[nodiscard]] const MemoryChoice& memory();

}  // namespace ncclnet

namespace ncclnet::cuda {

// Why this process cannot use GPU `gpu` (no driver library, cuInit failed, no such device);
// empty when it can. Loads the driver on first use.
[[nodiscard]] std::string unavailable(int gpu);
[[nodiscard]] std::string device_name(int gpu);

// Makes `gpu`'s primary context current on the calling thread, as NCCL's proxy threads have
// their device set. The calls below do it themselves.
void make_current(int gpu);

// cuMemAlloc / cuMemFree and synchronous copies. Throw CheckError naming the driver's error.
[[nodiscard]] void* allocate(int gpu, std::size_t size);
void release(int gpu, void* pointer) noexcept;
void copy_to_device(int gpu, void* target, const void* source, std::size_t length);
void copy_to_host(int gpu, void* target, const void* source, std::size_t length);

// Whether the driver exports dmabufs of `gpu`'s memory (cuMemGetHandleForAddressRange and
// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED); why not when it does not.
[[nodiscard]] std::string dmabuf_unavailable(int gpu);

// A dmabuf export of the host pages enclosing [data, data + size), as NCCL makes one for
// regMrDmaBuf: `fd` (the caller closes it) and where `data` lies in it. Throws CheckError.
struct DmabufExport {
  int fd = -1;
  std::uint64_t offset = 0;
};
[[nodiscard]] DmabufExport export_dmabuf(int gpu, const void* data, std::size_t size);

}  // namespace ncclnet::cuda
