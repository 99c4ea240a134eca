// The plugin's process-level state, in one documented object: NCCL loads the plugin once per
// process and calls plain C functions, so the loom contexts, the device table, NCCL's logger
// and connects in progress must live somewhere all of them reach. Everything here is behind
// one mutex and is used on setup paths only (init, devices, listen/connect/accept, close);
// the data path (isend/irecv/test/iflush) never touches it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/log.hpp"
#include "loom/loom.hpp"
#include "nccl/abi.hpp"

namespace loom::nccl {

// One ncclNet device: a NIC of the context, or a virtual device fusing several (v9+).
struct Device {
  std::vector<int> nics;  // indices into the base context's nics()
  std::string name;       // NIC domain, or "a+b" for a fused device
  std::string pci_path;   // sysfs path of the PCI device; empty where there is none (lo, shm)
  std::uint64_t guid = 0;
  int speed_mbps = 0;
  std::size_t max_bytes = 0;  // the largest request: NCCL's 1 GiB, or less where a NIC says so
  // The memory NCCL may register (NCCL_PTR_* bits), every NIC of the device taking it, and why
  // not more (empty when it takes host, CUDA and DMA-BUF memory).
  int ptr_support = abi::kPtrHost;
  std::string memory_note;
};

// What getProperties reports, before it is written into a versioned struct.
struct Properties {
  const Device* device = nullptr;
  int max_comms = 0;
  int max_recvs = 0;
  int force_flush = 0;
};

class Registry {
 public:
  // The one instance; destroyed when the plugin is unloaded (dlclose) or the process exits.
  static Registry& get();

  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // init: opens the base context the first time (throws loom::Error); counts v11 contexts.
  void init(abi::Logger logger);
  // v11 finalize: once the last init context is gone and no communicator is open, the
  // contexts close (their endpoints and bootstrap rails go); a later init opens them again.
  void finalize();

  int device_count();
  Properties properties(int dev);
  // Fuses `devs` (at least one; the caller bounds the count by its version's vProps).
  int make_vdevice(std::span<const int> devs);  // throws std::invalid_argument

  // The context a device's communicators use (opened on first use).
  Context& context(int dev);

  // connect() progress for the NCCL handle at `handle` (NCCL calls again with the same
  // buffer until a communicator comes back). Returns nullptr while the listener has not
  // accepted yet. Throws loom::Error when the connect fails; the attempt is forgotten then.
  std::unique_ptr<SendComm> connect(int dev, const void* handle);

  // Open communicators and listeners, for finalize's decision.
  void opened() noexcept;
  void closed() noexcept;

  // Logs through NCCL's logger (or stderr before init).
  void log(abi::LogLevel level, const std::string& message);

 private:
  Registry();
  void check_device(int dev) const;  // throws std::invalid_argument
  void open_locked();
  void close_if_unused_locked() noexcept;
  static void sink(LogLevel level, std::string_view message, void* user);

  struct PendingConnect {
    int dev = 0;
    std::array<std::byte, abi::kHandleMaxBytes> bytes{};
    Connector connector;
  };

  std::mutex mutex_;
  std::atomic<abi::Logger> logger_{nullptr};
  int inits_ = 0;                  // v11 init contexts alive (v8-v10 count their one init)
  int open_comms_ = 0;             // listeners and communicators not yet closed
  bool finalized_ = false;         // v11's finalize came (v8-v10 never finalize)
  bool settings_applied_ = false;  // provider settings: once per load, before the first Context
  std::unique_ptr<Context> base_;
  std::deque<Device> devices_;  // stable: NCCL keeps the name and pciPath pointers
  std::map<int, std::unique_ptr<Context>> device_contexts_;  // devices other than the base
  std::map<const void*, PendingConnect> pending_;
};

// The NCCL handle: loom's handle, prefixed by its length.
struct WireHandle {
  static void write(const Handle& handle, void* out);  // throws loom::Error if too long
  static Handle read(const void* in);                  // throws loom::Error if malformed
};

}  // namespace loom::nccl
