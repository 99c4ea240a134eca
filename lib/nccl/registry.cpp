#include "nccl/registry.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "nccl/provider_settings.hpp"

namespace loom::nccl {
namespace {

constexpr int kDefaultSpeedMbps = 10000;  // what NCCL assumes when a NIC does not say
constexpr int kMaxComms = 65535;          // a lane numbers its communicators in 16 bits
// NCCL never sends more than 1 GiB in one request (MAX_NET_SIZE). loom stripes a rendezvous
// message over up to 8 writes no longer than the provider's max_msg_size, which bounds it below
// that only on providers with a small one (NicDescription::max_message_size).
constexpr std::size_t kMaxBytes = std::size_t{1} << 30;

// The NIC's interface or device name: the domain for tcp/verbs/efa/cxi ("eth0", "mlx5_0").
std::string sysfs_device(const std::string& domain) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* klass : {"/sys/class/net/", "/sys/class/infiniband/", "/sys/class/cxi/"}) {
    const fs::path device = fs::path(klass) / domain / "device";
    if (!fs::exists(device, ec)) continue;
    const fs::path real = fs::canonical(device, ec);
    if (!ec) return real.string();
  }
  return {};
}

// The provider's link rate where it reports one (efa, verbs, cxi), else the kernel's for the
// interface or IB port, else NCCL's assumption.
int read_speed(const NicDescription& nic) {
  constexpr std::uint64_t kMaxMbps = 100'000'000;  // 100 Tb/s: a fused device's sum stays an int
  if (nic.link_speed_mbps != 0) return static_cast<int>(std::min(nic.link_speed_mbps, kMaxMbps));
  const std::string& domain = nic.name;
  std::ifstream net("/sys/class/net/" + domain + "/speed");
  int mbps = 0;
  if (net >> mbps && mbps > 0) return mbps;
  std::ifstream ib("/sys/class/infiniband/" + domain + "/ports/1/rate");  // "100 Gb/sec (4X EDR)"
  double gbps = 0;
  if (ib >> gbps && gbps > 0) return static_cast<int>(gbps * 1000);
  return kDefaultSpeedMbps;
}

std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return hash;
}

// NCCL_PTR_* bits as NCCL's names, for the log.
std::string ptr_text(int bits) {
  std::string text = "NCCL_PTR_HOST";
  if ((bits & abi::kPtrCuda) != 0) text += "|NCCL_PTR_CUDA";
  if ((bits & abi::kPtrDmaBuf) != 0) text += "|NCCL_PTR_DMABUF";
  return text;
}

// What memory NCCL may register on one NIC: host always; CUDA where the NIC grants device memory
// (a CUDA build, FI_HMEM granted); DMA-BUF where it can also take a dmabuf (libfabric 1.20).
void describe_memory(Device& device, const NicDescription& nic) {
  if (!nic.device_memory) {
    device.ptr_support = abi::kPtrHost;
    device.memory_note = nic.device_memory_note;
  } else if (!nic.dmabuf) {
    device.ptr_support = abi::kPtrHost | abi::kPtrCuda;
    device.memory_note = "no NCCL_PTR_DMABUF: " + nic.dmabuf_note;
  } else {
    device.ptr_support = abi::kPtrHost | abi::kPtrCuda | abi::kPtrDmaBuf;
    device.memory_note.clear();
  }
}

abi::LogLevel to_nccl(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return abi::kLogTrace;
    case LogLevel::kDebug:
    case LogLevel::kInfo:
      return abi::kLogInfo;
    default:
      return abi::kLogWarn;
  }
}

}  // namespace

Registry& Registry::get() {
  static Registry registry;
  return registry;
}

// loom's logger and sink are process statics too: creating them before the registry means
// they are destroyed after it at exit, so closing the contexts here may still log.
Registry::Registry() {
  set_log_sink(nullptr, nullptr);
  set_log_level(LogLevel::kWarn);
}

Registry::~Registry() {
  // dlclose or exit: loom must not call a logger whose library may be gone.
  set_log_sink(nullptr, nullptr);
}

void Registry::sink(LogLevel level, std::string_view message, void* user) {
  auto* self = static_cast<Registry*>(user);
  const abi::Logger logger = self->logger_.load(std::memory_order_acquire);
  if (logger == nullptr) return;
  logger(to_nccl(level), abi::kLogSubsysNet, __FILE__, __LINE__, "NET/loom %.*s",
         static_cast<int>(message.size()), message.data());
}

void Registry::log(abi::LogLevel level, const std::string& message) {
  const abi::Logger logger = logger_.load(std::memory_order_acquire);
  if (logger != nullptr) {
    logger(level, abi::kLogSubsysNet, __FILE__, __LINE__, "NET/loom %s", message.c_str());
  } else if (level <= abi::kLogWarn) {
    std::fprintf(stderr, "NET/loom %s\n", message.c_str());
  }
}

void Registry::init(abi::Logger logger) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (logger != nullptr) logger_.store(logger, std::memory_order_release);
  set_log_sink(&Registry::sink, this);
  if (!base_) open_locked();
  ++inits_;
}

void Registry::open_locked() {
  Config config = Config::from_env();
  // loom's own lines are INFO for NCCL (NCCL_DEBUG=INFO shows them) unless LOOM_LOG_LEVEL
  // asks for something else than its default.
  if (config.log_level == "warn") config.log_level = "info";
  if (!settings_applied_) {
    // Before the first Context: libfabric reads them at its first fi_getinfo.
    for (const std::string& line : apply_provider_settings(config)) log(abi::kLogInfo, line);
    settings_applied_ = true;
  }
  base_ = std::make_unique<Context>(config);
  devices_.clear();
  const auto nics = base_->nics();
  for (std::size_t i = 0; i < nics.size(); ++i) {
    Device device{.nics = {static_cast<int>(i)},
                  .name = nics[i].name,
                  .pci_path = sysfs_device(nics[i].name),
                  .guid = fnv1a(nics[i].provider + "/" + nics[i].fabric + "/" + nics[i].name),
                  .speed_mbps = read_speed(nics[i]),
                  .max_bytes = std::min(kMaxBytes, nics[i].max_message_size)};
    describe_memory(device, nics[i]);
    devices_.push_back(std::move(device));
  }
  std::string names;
  for (const auto& d : devices_) names += " " + d.name;
  log(abi::kLogInfo, "provider " + (nics.empty() ? std::string("?") : nics.front().provider) +
                         ", " + std::to_string(devices_.size()) + " device(s):" + names);
  // Why a device takes no GPU memory (NCCL then stages every transfer through host memory).
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const Device& d = devices_[i];
    log(abi::kLogInfo, "device " + std::to_string(i) + " (" + d.name + "): ptrSupport " +
                           ptr_text(d.ptr_support) +
                           (d.memory_note.empty() ? std::string() : ": " + d.memory_note));
  }
}

void Registry::finalize() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (inits_ > 0) --inits_;
  finalized_ = true;
  close_if_unused_locked();
}

// After v11's last finalize, the contexts go with the last open communicator.
void Registry::close_if_unused_locked() noexcept {
  if (!finalized_ || inits_ > 0 || open_comms_ > 0 || !base_) return;
  pending_.clear();
  device_contexts_.clear();
  base_.reset();
  devices_.clear();
}

void Registry::opened() noexcept {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++open_comms_;
}

void Registry::closed() noexcept {
  const std::lock_guard<std::mutex> lock(mutex_);
  --open_comms_;
  close_if_unused_locked();
}

void Registry::check_device(int dev) const {
  if (!base_) throw std::invalid_argument("the plugin is not initialised");
  if (dev < 0 || static_cast<std::size_t>(dev) >= devices_.size())
    throw std::invalid_argument("device " + std::to_string(dev) + " does not exist (" +
                                std::to_string(devices_.size()) + " devices)");
}

int Registry::device_count() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!base_) throw std::invalid_argument("the plugin is not initialised");
  return static_cast<int>(devices_.size());
}

Properties Registry::properties(int dev) {
  const std::lock_guard<std::mutex> lock(mutex_);
  check_device(dev);
  // forceFlush 0 lets NCCL decide from the GPU and its path to the NIC (it flushes before
  // Hopper and on C2C platforms); LOOM_FORCE_FLUSH asks it to flush every GPU receive.
  return Properties{.device = &devices_[static_cast<std::size_t>(dev)],
                    .max_comms = kMaxComms,
                    .max_recvs = static_cast<int>(kMaxRecvBuffers),
                    .force_flush = base_->config().force_flush ? 1 : 0};
}

int Registry::make_vdevice(std::span<const int> devs) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!base_) throw std::invalid_argument("the plugin is not initialised");
  if (devs.empty()) throw std::invalid_argument("a virtual device fuses at least 1 device");
  Device fused{.max_bytes = kMaxBytes,
               .ptr_support = abi::kPtrHost | abi::kPtrCuda | abi::kPtrDmaBuf};
  for (std::size_t i = 0; i < devs.size(); ++i) {
    check_device(devs[i]);
    const Device& part = devices_[static_cast<std::size_t>(devs[i])];
    for (const int nic : part.nics) {
      if (std::find(fused.nics.begin(), fused.nics.end(), nic) != fused.nics.end())
        throw std::invalid_argument("device " + part.name + " is named twice");
      fused.nics.push_back(nic);
    }
    fused.name += (i == 0 ? "" : "+") + part.name;
    fused.speed_mbps += part.speed_mbps;
    fused.max_bytes = std::min(fused.max_bytes, part.max_bytes);  // every rail takes its writes
    // A buffer is registered on every NIC of the device: what all of them take. The note is
    // the last NIC's that took bits away (bits only go, so it explains the final answer).
    if ((fused.ptr_support & ~part.ptr_support) != 0) {
      fused.memory_note = part.name + ": " + part.memory_note;
      fused.ptr_support &= part.ptr_support;
    }
    if (fused.pci_path.empty()) fused.pci_path = part.pci_path;
  }
  fused.guid = fnv1a("vdevice/" + fused.name);
  devices_.push_back(std::move(fused));
  const Device& made = devices_.back();
  log(abi::kLogInfo,
      "virtual device " + std::to_string(devices_.size() - 1) + " fuses " + made.name +
          ": ptrSupport " + ptr_text(made.ptr_support) +
          (made.memory_note.empty() ? std::string() : " (" + made.memory_note + ")"));
  return static_cast<int>(devices_.size() - 1);
}

Context& Registry::context(int dev) {
  const std::lock_guard<std::mutex> lock(mutex_);
  check_device(dev);
  const Device& device = devices_[static_cast<std::size_t>(dev)];
  const auto nic_count = base_->nics().size();
  if (device.nics.size() == nic_count) return *base_;  // the base context has exactly these
  auto& slot = device_contexts_[dev];
  if (!slot) {
    Config config = base_->config();
    const auto nics = base_->nics();
    config.nics.clear();
    for (const int nic : device.nics)
      config.nics.push_back(nics[static_cast<std::size_t>(nic)].name);
    // A fused device stripes over all its NICs: at least one data rail per NIC.
    config.data_rails =
        std::max<unsigned>(config.data_rails, static_cast<unsigned>(device.nics.size()));
    slot = std::make_unique<Context>(config);
  }
  return *slot;
}

std::unique_ptr<SendComm> Registry::connect(int dev, const void* handle) {
  Context& ctx = context(dev);
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(handle);
  if (it != pending_.end() && (it->second.dev != dev || std::memcmp(it->second.bytes.data(), handle,
                                                                    abi::kHandleMaxBytes) != 0)) {
    pending_.erase(it);  // the buffer now holds another peer's handle
    it = pending_.end();
  }
  if (it == pending_.end()) {
    PendingConnect pending{
        .dev = dev, .bytes = {}, .connector = ctx.connect(WireHandle::read(handle))};
    std::memcpy(pending.bytes.data(), handle, abi::kHandleMaxBytes);
    it = pending_.emplace(handle, std::move(pending)).first;
  }
  try {
    std::unique_ptr<SendComm> comm = it->second.connector.poll();
    if (comm) pending_.erase(it);
    return comm;
  } catch (...) {
    pending_.erase(it);
    throw;
  }
}

void WireHandle::write(const Handle& handle, void* out) {
  if (handle.size + 1 > abi::kHandleMaxBytes)
    throw Error("listen", "", 0,
                "loom's handle (" + std::to_string(handle.size) + " bytes) does not fit NCCL's " +
                    std::to_string(abi::kHandleMaxBytes) + "-byte handle with its length");
  auto* bytes = static_cast<std::byte*>(out);
  std::memset(bytes, 0, abi::kHandleMaxBytes);
  bytes[0] = static_cast<std::byte>(handle.size);
  std::memcpy(bytes + 1, handle.bytes.data(), handle.size);
}

Handle WireHandle::read(const void* in) {
  const auto* bytes = static_cast<const std::byte*>(in);
  const auto size = static_cast<std::size_t>(bytes[0]);
  if (size == 0 || size + 1 > abi::kHandleMaxBytes)
    throw Error("connect", "", 0, "not a loom plugin handle (length " + std::to_string(size) + ")");
  return Handle::from_bytes({bytes + 1, size});
}

}  // namespace loom::nccl
