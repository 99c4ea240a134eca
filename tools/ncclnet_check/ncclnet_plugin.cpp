#include "ncclnet_plugin.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <type_traits>

#include <dlfcn.h>

namespace ncclnet {
namespace {

// The tool's logger has no user pointer (NCCL's logger signature), so its verbosity is the
// one process-wide setting of the tool, set once from the command line.
std::atomic<int> log_verbosity{abi::kLogWarn};

// The lines the plugin logged (log_mark, log_since): the last kKept, numbered from the first.
constexpr std::size_t kKept = 4096;
struct Recorded {
  std::mutex mutex;
  std::deque<LogLine> lines;
  std::size_t dropped = 0;  // lines numbered before lines.front()
};
Recorded& recorded() {
  static Recorded r;
  return r;
}

void tool_logger(abi::LogLevel level, unsigned long, const char* file, int line, const char* fmt,
                 ...) {
  std::array<char, 1024> text{};
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text.data(), text.size(), fmt, args);
  va_end(args);
  {
    Recorded& r = recorded();
    const std::lock_guard lock(r.mutex);
    r.lines.push_back({level, text.data()});
    if (r.lines.size() > kKept) {
      r.lines.pop_front();
      ++r.dropped;
    }
  }
  if (static_cast<int>(level) > log_verbosity.load(std::memory_order_relaxed)) return;
  const char* kind = level == abi::kLogWarn ? "WARN" : level == abi::kLogInfo ? "INFO" : "TRACE";
  std::fprintf(stderr, "[plugin %s %s:%d] %s\n", kind, file, line, text.data());
}

template <typename Props>
DeviceProps convert(const Props& p) {
  DeviceProps out;
  out.name = p.name != nullptr ? p.name : "(null)";
  out.pci_path = p.pciPath != nullptr ? p.pciPath : "";
  out.guid = p.guid;
  out.ptr_support = p.ptrSupport;
  out.reg_is_global = p.regIsGlobal;
  out.speed = p.speed;
  out.port = p.port;
  out.latency = p.latency;
  out.max_comms = p.maxComms;
  out.max_recvs = p.maxRecvs;
  out.device_type = p.netDeviceType;
  out.device_version = p.netDeviceVersion;
  if constexpr (!std::is_same_v<Props, abi::PropertiesV8>) {
    out.force_flush = p.forceFlush;
    const int capacity = static_cast<int>(std::size(p.vProps.devs));
    for (int i = 0; i < std::min(p.vProps.ndevs, capacity); ++i)
      out.vdevs.push_back(p.vProps.devs[i]);
    out.max_p2p_bytes = p.maxP2pBytes;
    out.max_coll_bytes = p.maxCollBytes;
  }
  if constexpr (requires { p.maxMultiRequestSize; }) out.max_multi_request = p.maxMultiRequestSize;
  if constexpr (requires { p.railId; }) {
    out.rail_id = p.railId;
    out.plane_id = p.planeId;
  }
  return out;
}

// v11 and v12 tables have the same entries (abi::NetWithContext): calls that do not touch
// getProperties' or makeVDevice's structs are written once for both.
template <typename F>
decltype(auto) with_context_table(int version, const void* table, F&& f) {
  if (version == 12) return f(*static_cast<const abi::NetV12*>(table));
  return f(*static_cast<const abi::NetV11*>(table));
}

// VProps: v9..v11's VDeviceProps (4 devices) or v12's VDevicePropsV12 (8).
template <typename Net, typename VProps>
abi::Result make_vdevice_on(const void* table, std::span<const int> devs, int* dev) {
  VProps props{};
  props.ndevs = static_cast<int>(devs.size());
  std::copy_n(devs.begin(), std::min(devs.size(), std::size(props.devs)), props.devs);
  return static_cast<const Net*>(table)->makeVDevice(dev, &props);
}

}  // namespace

const char* result_name(abi::Result result) {
  switch (result) {
    case abi::kSuccess:
      return "ncclSuccess";
    case abi::kUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case abi::kSystemError:
      return "ncclSystemError";
    case abi::kInternalError:
      return "ncclInternalError";
    case abi::kInvalidArgument:
      return "ncclInvalidArgument";
    case abi::kInvalidUsage:
      return "ncclInvalidUsage";
    case abi::kRemoteError:
      return "ncclRemoteError";
    case abi::kInProgress:
      return "ncclInProgress";
  }
  return "unknown ncclResult_t";
}

void check(abi::Result result, const std::string& what) {
  if (result != abi::kSuccess) throw CheckError(what + ": " + result_name(result));
}

void set_log_verbosity(abi::LogLevel level) {
  log_verbosity.store(level, std::memory_order_relaxed);
}

std::size_t log_mark() {
  Recorded& r = recorded();
  const std::lock_guard lock(r.mutex);
  return r.dropped + r.lines.size();
}

std::vector<LogLine> log_since(std::size_t mark) {
  Recorded& r = recorded();
  const std::lock_guard lock(r.mutex);
  const std::size_t first = mark > r.dropped ? mark - r.dropped : 0;
  std::vector<LogLine> out;
  for (std::size_t i = first; i < r.lines.size(); ++i) out.push_back(r.lines[i]);
  return out;
}

Plugin::Plugin(const std::string& path, int version) {
  library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    const char* why = dlerror();
    throw CheckError("cannot load " + path + ": " + (why ? why : "dlopen failed"));
  }
  const std::array<std::pair<int, const char*>, 5> symbols{{{12, abi::kSymbolV12},
                                                            {11, abi::kSymbolV11},
                                                            {10, abi::kSymbolV10},
                                                            {9, abi::kSymbolV9},
                                                            {8, abi::kSymbolV8}}};
  std::string tried;
  for (const auto& [v, symbol] : symbols) {
    if (version != 0 && v != version) continue;
    tried += std::string(tried.empty() ? "" : ", ") + symbol;
    if (const void* table = dlsym(library_, symbol)) {
      version_ = v;
      table_ = table;
      return;
    }
  }
  dlclose(library_);
  throw CheckError(path + " is not an ncclNet plugin: it exports none of " + tried);
}

Plugin::~Plugin() {
  finalize();
  dlclose(library_);
}

void Plugin::finalize() {
  if (version_ >= 11 && context_ != nullptr) {
    with_context_table(version_, table_, [&](const auto& net) {
      if (net.finalize != nullptr) net.finalize(context_);
    });
  }
  context_ = nullptr;
}

// Calls member `f` of whichever table this plugin exports, with the same arguments.
#define NCCLNET_CALL(f, ...)                                                  \
  (version_ == 12   ? static_cast<const abi::NetV12*>(table_)->f(__VA_ARGS__) \
   : version_ == 11 ? static_cast<const abi::NetV11*>(table_)->f(__VA_ARGS__) \
   : version_ == 10 ? static_cast<const abi::NetV10*>(table_)->f(__VA_ARGS__) \
   : version_ == 9  ? static_cast<const abi::NetV9*>(table_)->f(__VA_ARGS__)  \
                    : static_cast<const abi::NetV8*>(table_)->f(__VA_ARGS__))

const char* Plugin::name() const noexcept {
  return static_cast<const abi::NetV8*>(table_)->name;  // the first member of every version
}

void Plugin::init() {
  abi::Result result = abi::kSuccess;
  switch (version_) {
    case 12:
    case 11: {
      abi::CommConfig config{.trafficClass = abi::kTrafficClassUndef};
      result = with_context_table(version_, table_, [&](const auto& net) {
        return net.init(&context_, 0x10ad, &config, tool_logger, nullptr);
      });
      break;
    }
    case 10:
      result = static_cast<const abi::NetV10*>(table_)->init(tool_logger, nullptr);
      break;
    case 9:
      result = static_cast<const abi::NetV9*>(table_)->init(tool_logger);
      break;
    default:
      result = static_cast<const abi::NetV8*>(table_)->init(tool_logger);
      break;
  }
  check(result,
        std::string("init of plugin ") + name() + " (ncclNet v" + std::to_string(version_) + ")");
  initialised_ = true;
}

int Plugin::devices() {
  int n = 0;
  check(NCCLNET_CALL(devices, &n), "devices");
  return n;
}

DeviceProps Plugin::properties(int dev) {
  const std::string what = "getProperties(" + std::to_string(dev) + ")";
  switch (version_) {
    case 12: {
      abi::PropertiesV12 p{};
      check(static_cast<const abi::NetV12*>(table_)->getProperties(dev, &p), what);
      return convert(p);
    }
    case 11: {
      abi::PropertiesV11 p{};
      check(static_cast<const abi::NetV11*>(table_)->getProperties(dev, &p), what);
      return convert(p);
    }
    case 10:
    case 9: {
      abi::PropertiesV9 p{};
      check(version_ == 10 ? static_cast<const abi::NetV10*>(table_)->getProperties(dev, &p)
                           : static_cast<const abi::NetV9*>(table_)->getProperties(dev, &p),
            what);
      return convert(p);
    }
    default: {
      abi::PropertiesV8 p{};
      check(static_cast<const abi::NetV8*>(table_)->getProperties(dev, &p), what);
      return convert(p);
    }
  }
}

std::size_t Plugin::vdevice_capacity() const noexcept {
  if (version_ < 9) return 0;
  return version_ == 12 ? std::extent_v<decltype(abi::VDevicePropsV12::devs)>
                        : std::extent_v<decltype(abi::VDeviceProps::devs)>;
}

int Plugin::make_vdevice(std::span<const int> devs) {
  if (version_ < 9) throw CheckError("makeVDevice needs ncclNet v9 or later");
  int dev = -1;
  const abi::Result result =
      version_ == 12   ? make_vdevice_on<abi::NetV12, abi::VDevicePropsV12>(table_, devs, &dev)
      : version_ == 11 ? make_vdevice_on<abi::NetV11, abi::VDeviceProps>(table_, devs, &dev)
      : version_ == 10 ? make_vdevice_on<abi::NetV10, abi::VDeviceProps>(table_, devs, &dev)
                       : make_vdevice_on<abi::NetV9, abi::VDeviceProps>(table_, devs, &dev);
  check(result, "makeVDevice");
  return dev;
}

abi::Result Plugin::listen(int dev, void* handle, void** comm) {
  if (version_ >= 11) {
    return with_context_table(
        version_, table_, [&](const auto& net) { return net.listen(context_, dev, handle, comm); });
  }
  if (version_ == 10) return static_cast<const abi::NetV10*>(table_)->listen(dev, handle, comm);
  if (version_ == 9) return static_cast<const abi::NetV9*>(table_)->listen(dev, handle, comm);
  return static_cast<const abi::NetV8*>(table_)->listen(dev, handle, comm);
}

abi::Result Plugin::connect(int dev, void* handle, void** comm) {
  abi::DeviceHandle* dev_comm = nullptr;
  switch (version_) {
    case 12:
    case 11:
      return with_context_table(version_, table_, [&](const auto& net) {
        return net.connect(context_, dev, handle, comm, &dev_comm);
      });
    case 10: {
      abi::CommConfig config{.trafficClass = abi::kTrafficClassUndef};
      return static_cast<const abi::NetV10*>(table_)->connect(dev, &config, handle, comm,
                                                              &dev_comm);
    }
    case 9:
      return static_cast<const abi::NetV9*>(table_)->connect(dev, handle, comm, &dev_comm);
    default:
      return static_cast<const abi::NetV8*>(table_)->connect(dev, handle, comm, &dev_comm);
  }
}

abi::Result Plugin::accept(void* listen_comm, void** comm) {
  abi::DeviceHandle* dev_comm = nullptr;
  return NCCLNET_CALL(accept, listen_comm, comm, &dev_comm);
}

abi::Result Plugin::reg_mr(void* comm, void* data, std::size_t size, void** mhandle) {
  return NCCLNET_CALL(regMr, comm, data, size, abi::kPtrHost, mhandle);
}

abi::Result Plugin::reg_mr(void* comm, void* data, std::size_t size, int type, void** mhandle) {
  return NCCLNET_CALL(regMr, comm, data, size, type, mhandle);
}

abi::Result Plugin::reg_mr_dmabuf(void* comm, void* data, std::size_t size, int type,
                                  std::uint64_t offset, int fd, void** mhandle) {
  return NCCLNET_CALL(regMrDmaBuf, comm, data, size, type, offset, fd, mhandle);
}

abi::Result Plugin::dereg_mr(void* comm, void* mhandle) {
  return NCCLNET_CALL(deregMr, comm, mhandle);
}

abi::Result Plugin::isend(void* comm, void* data, std::size_t size, int tag, void* mhandle,
                          void** request) {
  switch (version_) {
    case 12:
    case 11:
      return with_context_table(version_, table_, [&](const auto& net) {
        return net.isend(comm, data, size, tag, mhandle, nullptr, request);
      });
    case 10:
      return static_cast<const abi::NetV10*>(table_)->isend(comm, data, size, tag, mhandle, nullptr,
                                                            request);
    case 9:
      return static_cast<const abi::NetV9*>(table_)->isend(comm, data, size, tag, mhandle, request);
    default:
      if (size > static_cast<std::size_t>(INT32_MAX)) throw CheckError("v8 isend sizes are int");
      return static_cast<const abi::NetV8*>(table_)->isend(comm, data, static_cast<int>(size), tag,
                                                           mhandle, request);
  }
}

abi::Result Plugin::irecv(void* comm, int n, void** data, std::size_t* sizes, int* tags,
                          void** mhandles, void** request) {
  std::array<void*, abi::kMaxDevsPerNic * 2> phandles{};
  switch (version_) {
    case 12:
    case 11:
      return with_context_table(version_, table_, [&](const auto& net) {
        return net.irecv(comm, n, data, sizes, tags, mhandles, phandles.data(), request);
      });
    case 10:
      return static_cast<const abi::NetV10*>(table_)->irecv(comm, n, data, sizes, tags, mhandles,
                                                            phandles.data(), request);
    case 9:
      return static_cast<const abi::NetV9*>(table_)->irecv(comm, n, data, sizes, tags, mhandles,
                                                           request);
    default: {
      std::array<int, 8> narrow{};
      for (int i = 0; i < n && i < 8; ++i)
        narrow[static_cast<std::size_t>(i)] = static_cast<int>(sizes[i]);
      return static_cast<const abi::NetV8*>(table_)->irecv(comm, n, data, narrow.data(), tags,
                                                           mhandles, request);
    }
  }
}

abi::Result Plugin::iflush(void* comm, int n, void** data, int* sizes, void** mhandles,
                           void** request) {
  return NCCLNET_CALL(iflush, comm, n, data, sizes, mhandles, request);
}

abi::Result Plugin::test(void* request, int* done, int* sizes) {
  return NCCLNET_CALL(test, request, done, sizes);
}

abi::Result Plugin::close_send(void* comm) {
  return NCCLNET_CALL(closeSend, comm);
}
abi::Result Plugin::close_recv(void* comm) {
  return NCCLNET_CALL(closeRecv, comm);
}
abi::Result Plugin::close_listen(void* comm) {
  return NCCLNET_CALL(closeListen, comm);
}

#undef NCCLNET_CALL

}  // namespace ncclnet
