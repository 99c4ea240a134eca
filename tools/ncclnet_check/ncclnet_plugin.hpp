// ncclnet_check's view of an ncclNet plugin: dlopens any plugin .so, takes the newest
// ncclNetPlugin_vN it exports (v12 down to v8, NCCL's order) and calls it through one
// version-neutral interface. The ABI layouts come from lib/nccl/abi.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "nccl/abi.hpp"

namespace ncclnet {

namespace abi = loom::nccl::abi;

// A failed check: the message names what failed and why.
class CheckError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the run asked for cannot be had here (no GPU, a plugin without CUDA memory): the rank
// exits 77, and the tool too, "skipped" as meson and the GPU tests count it.
class SkipError : public CheckError {
 public:
  using CheckError::CheckError;
};

[[nodiscard]] const char* result_name(abi::Result result);
// Throws CheckError "<what>: <ncclResult name>" unless `result` is ncclSuccess.
void check(abi::Result result, const std::string& what);

// NCCL log lines at or below this level are printed (to stderr) by the tool's logger.
void set_log_verbosity(abi::LogLevel level);

// Every line the plugin logged in this process, whatever the verbosity (the last 4096), so that
// a check can quote the plugin's own explanation: log_mark() now, log_since(mark) later.
struct LogLine {
  abi::LogLevel level = abi::kLogNone;
  std::string text;
};
[[nodiscard]] std::size_t log_mark();
[[nodiscard]] std::vector<LogLine> log_since(std::size_t mark);

struct DeviceProps {
  std::string name;
  std::string pci_path;  // empty when the plugin gave NULL
  std::uint64_t guid = 0;
  int ptr_support = 0;
  int reg_is_global = 0;
  int force_flush = 0;
  int speed = 0;
  int port = 0;
  float latency = 0;
  int max_comms = 0;
  int max_recvs = 0;
  int device_type = 0;
  int device_version = 0;
  std::vector<int> vdevs;
  std::size_t max_p2p_bytes = 0;
  std::size_t max_coll_bytes = 0;
  int max_multi_request = 0;
  int rail_id = abi::kNetIdUndef;  // v12; undefined before
  int plane_id = abi::kNetIdUndef;
};

class Plugin {
 public:
  // dlopens `path` (RTLD_NOW | RTLD_LOCAL as NCCL does) and probes ncclNetPlugin_v12..v8.
  // `version` > 0 takes that version only. Throws CheckError naming the file and the symbols
  // tried when none is there.
  explicit Plugin(const std::string& path, int version = 0);
  ~Plugin();  // closes the v11/v12 context (finalize) and dlcloses
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  [[nodiscard]] int version() const noexcept { return version_; }
  [[nodiscard]] const char* name() const noexcept;

  void init();  // throws CheckError ("init: ncclInternalError")
  // v11+: finalize the init context now (the destructor does it otherwise); no-op before v11.
  void finalize();
  int devices();
  DeviceProps properties(int dev);
  int make_vdevice(std::span<const int> devs);  // v9+; throws CheckError before
  // Devices a virtual device may fuse: vProps' room (4 in v9..v11, 8 in v12; 0 before v9).
  [[nodiscard]] std::size_t vdevice_capacity() const noexcept;

  abi::Result listen(int dev, void* handle, void** comm);
  abi::Result connect(int dev, void* handle, void** comm);
  abi::Result accept(void* listen_comm, void** comm);
  abi::Result reg_mr(void* comm, void* data, std::size_t size, void** mhandle);  // host memory
  abi::Result reg_mr(void* comm, void* data, std::size_t size, int type, void** mhandle);
  abi::Result reg_mr_dmabuf(void* comm, void* data, std::size_t size, int type,
                            std::uint64_t offset, int fd, void** mhandle);
  abi::Result dereg_mr(void* comm, void* mhandle);
  abi::Result isend(void* comm, void* data, std::size_t size, int tag, void* mhandle,
                    void** request);
  abi::Result irecv(void* comm, int n, void** data, std::size_t* sizes, int* tags, void** mhandles,
                    void** request);
  abi::Result iflush(void* comm, int n, void** data, int* sizes, void** mhandles, void** request);
  abi::Result test(void* request, int* done, int* sizes);
  abi::Result close_send(void* comm);
  abi::Result close_recv(void* comm);
  abi::Result close_listen(void* comm);

 private:
  void* library_ = nullptr;
  int version_ = 0;
  const void* table_ = nullptr;
  void* context_ = nullptr;  // v11/v12 init context
  bool initialised_ = false;
};

}  // namespace ncclnet
