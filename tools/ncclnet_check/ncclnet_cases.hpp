// ncclnet_check's conformance cases and the helpers they share: connection setup the way
// NCCL's proxy does it (non-blocking listen/connect/accept polled on the service thread),
// registered buffers (host, GPU or staged memory) with per-message byte patterns, flushes after
// receives into GPU memory, bounded waits.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ncclnet_plugin.hpp"
#include "ncclnet_ranks.hpp"

namespace ncclnet {

struct Options {
  std::string plugin;
  int version = 0;  // 0: newest the plugin exports
  int dev = 0;
  std::chrono::seconds timeout{60};
  std::vector<std::size_t> sizes;  // the sizes case
  int cycles = 50;
  std::string kill_in;  // a case in which rank 1 kills itself (shows the peer-death error)
  bool quiet = false;
  bool leak_check = false;  // LeakSanitizer in each rank (ASan builds)
};

// A send comm to one rank and a receive comm from another (or the same).
struct Link {
  void* send = nullptr;
  void* recv = nullptr;
  void* listen = nullptr;
};

// Opens `count` links: listens `count` times, gives the handles to `from` (who connects to
// them), takes `to`'s handles and connects to them, and polls connect/accept until all are up.
std::vector<Link> establish(Plugin& plugin, Rank& rank, int dev, int to, int from, int count = 1);
void close_links(Plugin& plugin, std::vector<Link>& links);

// A registered buffer in the run's memory (memory(), --device). GPU (or staged) memory is read
// and written through a host copy: data() is that copy (or, for host memory, the buffer itself),
// wire() the address registration and posts take; upload() copies data() to the GPU before a
// send, download() the GPU's bytes into data() after a receive (after_receive does it). A GPU
// buffer is registered with NCCL_PTR_CUDA, or through a dmabuf (regMrDmaBuf) for every other
// buffer where prepare_memory found that possible.
class Buffer {
 public:
  Buffer(Plugin& plugin, void* comm, std::size_t size);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  [[nodiscard]] std::uint8_t* data() noexcept { return bytes_.data(); }
  [[nodiscard]] void* wire() noexcept { return device_ != nullptr ? device_ : bytes_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }
  [[nodiscard]] void* mhandle() const noexcept { return mhandle_; }
  void upload();      // data() -> GPU; nothing for host memory
  void download();    // GPU -> data(); nothing for host memory
  void deregister();  // now rather than at destruction (before closing the comm)

 private:
  Plugin& plugin_;
  void* comm_;
  std::vector<std::uint8_t> bytes_;
  std::vector<std::uint8_t> staged_;  // --device staged: the buffer apart from bytes_
  void* device_ = nullptr;            // GPU memory, staged_, or null (host memory)
  void* mhandle_ = nullptr;
};

// In a rank, after init, for GPU memory: checks that the plugin's device `dev` takes CUDA
// memory and that this process has the GPU (else throws SkipError naming why, quoting the
// plugin's explanation), and decides whether buffers also go through dmabufs (the device's
// ptrSupport has NCCL_PTR_DMABUF and the driver exports them). Returns a line saying how
// buffers are registered; nothing to do, and an empty line, for host memory.
std::string prepare_memory(Plugin& plugin, int dev);

// After a receive into `buffers` completed with `sizes` (NCCL's order: test, then iflush):
// GPU buffers are flushed (iflush, its request waited for) and copied back into data(), as a
// kernel reading them would need them; nothing for host memory, which NCCL never flushes.
void after_receive(Plugin& plugin, void* recv_comm, std::span<Buffer* const> buffers,
                   const int* sizes, Rank& rank);
// Only the flush (GPU memory; nothing for host memory): for the bandwidth mode, which reads
// nothing back.
void flush_received(Plugin& plugin, void* recv_comm, std::span<Buffer* const> buffers,
                    const int* sizes, Rank& rank);
void after_receive(Plugin& plugin, void* recv_comm, Buffer& buffer, int size, Rank& rank);

void fill(std::uint8_t* data, std::size_t size, std::uint32_t seed);
// Throws CheckError naming the first wrong byte.
void verify(const std::uint8_t* data, std::size_t size, std::uint32_t seed,
            const std::string& what);

// Calls isend/irecv until the plugin gives a request (NULL = retry); counts the retries.
void* post_send(Plugin& plugin, void* comm, void* data, std::size_t size, int tag, void* mhandle,
                Rank& rank, std::size_t* retries = nullptr);
void* post_recv(Plugin& plugin, void* comm, int n, void** data, std::size_t* sizes, int* tags,
                void** mhandles, Rank& rank, std::size_t* retries = nullptr);
// test() until done. Throws CheckError on an error result or at the case's deadline.
void wait_done(Plugin& plugin, void* request, int* sizes, const std::string& what, Rank& rank);
// test() until done; returns the result instead of throwing on an error result.
abi::Result wait_result(Plugin& plugin, void* request, int* sizes, const std::string& what,
                        Rank& rank);

struct Case {
  std::string name;
  int ranks = 2;
  std::string description;
  std::function<void(Plugin&, Rank&, const Options&)> body;  // per rank, plugin initialised
  std::function<void(Rank&, const Options&)> standalone;     // or: loads the plugin itself
};

std::vector<Case> single_comm_cases();  // ncclnet_cases.cpp
std::vector<Case> multi_comm_cases();   // ncclnet_cases_multi.cpp

// Prints every device's properties (one rank, forked).
void print_devices(Plugin& plugin);

}  // namespace ncclnet
