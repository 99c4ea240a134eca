// Setup entries: init/finalize, devices and properties, listen/connect/accept, registration
// and close. NCCL calls these from its service thread (several communicators' at once).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <type_traits>

#include <fcntl.h>

#include "loom/device_memory.hpp"
#include "nccl/comm.hpp"
#include "nccl/guard.hpp"
#include "nccl/registry.hpp"

namespace loom::nccl {

NetComm::NetComm(Kind kind, std::unique_ptr<Communicator> comm, int ptr_support,
                 std::string memory_note)
    : kind_(kind),
      comm_(std::move(comm)),
      ptr_support_(ptr_support),
      memory_note_(std::move(memory_note)) {
  for (std::size_t i = 0; i < free_.size(); ++i)
    free_[i] = static_cast<std::uint16_t>(free_.size() - 1 - i);
  free_count_ = free_.size();
}

namespace ops {
namespace {

template <typename T>
void* release_to_nccl(std::unique_ptr<T> object) {
  Registry::get().opened();
  return object.release();
}

// A communicator of device `dev`, carrying what memory the device takes.
std::unique_ptr<NetComm> make_comm(Kind kind, std::unique_ptr<Communicator> comm, int dev) {
  const Device& device = *Registry::get().properties(dev).device;
  return std::make_unique<NetComm>(kind, std::move(comm), device.ptr_support, device.memory_note);
}

// Takes an object back from NCCL and destroys it, then tells the registry (which may close
// the contexts once the last object is gone).
template <typename T, typename Close>
void close_and_free(T* object, Close&& close) {
  {
    std::unique_ptr<T> owner(object);
    close(*owner);
  }
  Registry::get().closed();
}

}  // namespace

abi::Result init(abi::Logger logger) {
  return guard("init", [&] {
    Registry::get().init(logger);
    return abi::kSuccess;
  });
}

abi::Result init_context(void** ctx, std::uint64_t comm_id, const abi::CommConfig* config,
                         abi::Logger logger) {
  return guard("init", [&] {
    if (ctx == nullptr) throw InvalidArgument("init: no context pointer");
    *ctx = nullptr;
    auto context = std::make_unique<InitContext>();
    context->comm_id = comm_id;
    if (config != nullptr) context->traffic_class = config->trafficClass;
    Registry::get().init(logger);
    *ctx = context.release();  // finalize takes it back
    return abi::kSuccess;
  });
}

abi::Result finalize(void* ctx) {
  return guard("finalize", [&] {
    std::unique_ptr<InitContext> context(&expect<InitContext>(ctx, Kind::kContext, "init context"));
    Registry::get().finalize();
    return abi::kSuccess;
  });
}

abi::Result devices(int* ndev) {
  return guard("devices", [&] {
    if (ndev == nullptr) throw InvalidArgument("no ndev pointer");
    *ndev = Registry::get().device_count();
    return abi::kSuccess;
  });
}

template <typename VProps>
abi::Result make_vdevice(int* dev, VProps* props) {
  return guard("makeVDevice", [&] {
    if (dev == nullptr || props == nullptr) throw InvalidArgument("NULL argument");
    constexpr int kCapacity = static_cast<int>(std::extent_v<decltype(VProps::devs)>);
    if (props->ndevs < 1 || props->ndevs > kCapacity)
      throw InvalidArgument("a virtual device fuses 1 to " + std::to_string(kCapacity) +
                            " devices, not " + std::to_string(props->ndevs));
    *dev = Registry::get().make_vdevice(
        std::span<const int>(props->devs, static_cast<std::size_t>(props->ndevs)));
    return abi::kSuccess;
  });
}
template abi::Result make_vdevice(int*, abi::VDeviceProps*);
template abi::Result make_vdevice(int*, abi::VDevicePropsV12*);

template <typename Props>
abi::Result properties(int dev, Props* props) {
  return guard("getProperties", [&] {
    if (props == nullptr) throw InvalidArgument("no properties pointer");
    const Properties p = Registry::get().properties(dev);
    std::memset(static_cast<void*>(props), 0, sizeof(Props));
    // NCCL keeps these pointers: they point into the registry's device table, which lives
    // as long as the plugin is initialised.
    props->name = const_cast<char*>(p.device->name.c_str());
    props->pciPath =
        p.device->pci_path.empty() ? nullptr : const_cast<char*>(p.device->pci_path.c_str());
    props->guid = p.device->guid;
    props->ptrSupport = p.device->ptr_support;
    props->regIsGlobal = 0;  // loom's MR caches are per lane, not per process
    props->speed = p.device->speed_mbps;
    props->port = 1;
    props->latency = 0;
    props->maxComms = p.max_comms;
    props->maxRecvs = p.max_recvs;
    props->netDeviceType = abi::kDeviceHost;
    props->netDeviceVersion = 0;
    if constexpr (!std::is_same_v<Props, abi::PropertiesV8>) {
      props->forceFlush = p.force_flush;
      const std::size_t ndevs = std::min(p.device->nics.size(), std::size(props->vProps.devs));
      props->vProps.ndevs = static_cast<int>(ndevs);
      for (std::size_t i = 0; i < ndevs; ++i) props->vProps.devs[i] = p.device->nics[i];
      props->maxP2pBytes = p.device->max_bytes;
      props->maxCollBytes = p.device->max_bytes;
    }
    if constexpr (requires { props->maxMultiRequestSize; }) props->maxMultiRequestSize = 1;
    if constexpr (requires { props->railId; }) {
      // NCCL pairs NICs across nodes by rail and plane only where both are defined; loom has
      // no view of the fabric's rails, so it answers what NCCL itself fills in for a v11
      // plugin: undefined, and NCCL's topology search ignores them.
      props->railId = abi::kNetIdUndef;
      props->planeId = abi::kNetIdUndef;
    }
    return abi::kSuccess;
  });
}
template abi::Result properties(int, abi::PropertiesV8*);
template abi::Result properties(int, abi::PropertiesV9*);
template abi::Result properties(int, abi::PropertiesV11*);
template abi::Result properties(int, abi::PropertiesV12*);

abi::Result listen(int dev, void* handle, void** listen_comm) {
  return guard("listen", [&] {
    if (handle == nullptr || listen_comm == nullptr) throw InvalidArgument("NULL argument");
    *listen_comm = nullptr;
    auto comm = std::make_unique<ListenComm>(ListenComm{
        .tag = Kind::kListen, .dev = dev, .listener = Registry::get().context(dev).listen()});
    WireHandle::write(comm->listener.handle(), handle);
    *listen_comm = release_to_nccl(std::move(comm));
    return abi::kSuccess;
  });
}

abi::Result connect(int dev, void* handle, void** send_comm, abi::DeviceHandle** dev_comm) {
  return guard("connect", [&] {
    if (handle == nullptr || send_comm == nullptr) throw InvalidArgument("NULL argument");
    *send_comm = nullptr;
    (void)dev_comm;  // offload handles come only with a non-HOST netDeviceType: left alone
    std::unique_ptr<SendComm> comm = Registry::get().connect(dev, handle);
    if (comm) *send_comm = release_to_nccl(make_comm(Kind::kSend, std::move(comm), dev));
    return abi::kSuccess;
  });
}

abi::Result accept(void* listen_comm, void** recv_comm, abi::DeviceHandle** dev_comm) {
  return guard("accept", [&] {
    if (recv_comm == nullptr) throw InvalidArgument("NULL argument");
    *recv_comm = nullptr;
    (void)dev_comm;  // offload handles come only with a non-HOST netDeviceType: left alone
    auto& listener = expect<ListenComm>(listen_comm, Kind::kListen, "listen comm");
    std::unique_ptr<RecvComm> comm = listener.listener.accept();
    if (comm) *recv_comm = release_to_nccl(make_comm(Kind::kRecv, std::move(comm), listener.dev));
    return abi::kSuccess;
  });
}

namespace {
NetComm& any_comm(void* comm) {
  auto* object = static_cast<NetComm*>(comm);
  if (object == nullptr || (object->kind() != Kind::kSend && object->kind() != Kind::kRecv))
    throw InvalidArgument("not a loom send or receive comm");
  return *object;
}
}  // namespace

namespace {

// "NCCL_PTR_CUDA" for the log; the number for a type NCCL does not define.
std::string type_text(int type) {
  switch (type) {
    case abi::kPtrHost:
      return "NCCL_PTR_HOST";
    case abi::kPtrCuda:
      return "NCCL_PTR_CUDA";
    case abi::kPtrDmaBuf:
      return "NCCL_PTR_DMABUF";
    default:
      return "memory type " + std::to_string(type);
  }
}

// Registers on `net` after the checks every form shares; `dmabuf` for regMrDmaBuf's.
void* register_on(NetComm& net, void* data, std::size_t size, int type, const Dmabuf* dmabuf) {
  if (type != abi::kPtrHost && type != abi::kPtrCuda)
    throw InvalidArgument("unknown " + type_text(type) + " (NCCL_PTR_HOST or NCCL_PTR_CUDA)");
  if (type == abi::kPtrCuda && (net.ptr_support() & abi::kPtrCuda) == 0)
    throw InvalidArgument(
        "NCCL_PTR_CUDA memory, but this device takes host memory only (ptrSupport "
        "NCCL_PTR_HOST): " +
        net.memory_note());
  auto handle = std::make_unique<MemoryHandle>();
  handle->comm = &net;
  if (type == abi::kPtrHost) {
    handle->region = net.comm().register_memory(data, size, MemoryType::kHost);
  } else {
    // NCCL names no device: the driver knows the one the memory lies on (loom::Error if not).
    const int device = cuda_device_of(data);
    handle->region =
        dmabuf != nullptr
            ? net.comm().register_memory(data, size, MemoryType::kCuda, device, *dmabuf)
            : net.comm().register_memory(data, size, MemoryType::kCuda, device);
  }
  return handle.release();  // deregMr takes it back
}

}  // namespace

abi::Result reg_mr(void* comm, void* data, std::size_t size, int type, void** mhandle) {
  return guard("regMr", [&] {
    if (mhandle == nullptr) throw InvalidArgument("NULL mhandle pointer");
    *mhandle = nullptr;
    *mhandle = register_on(any_comm(comm), data, size, type, nullptr);
    return abi::kSuccess;
  });
}

// NCCL exports CUDA memory as a dmabuf and hands the descriptor over (it closes it once this
// returns); fd -1 means none, as NCCL's own IB plugin takes it, and registers as regMr does.
abi::Result reg_mr_dmabuf(void* comm, void* data, std::size_t size, int type, std::uint64_t offset,
                          int fd, void** mhandle) {
  return guard("regMrDmaBuf", [&] {
    if (mhandle == nullptr) throw InvalidArgument("NULL mhandle pointer");
    *mhandle = nullptr;
    NetComm& net = any_comm(comm);
    if (fd == -1) {
      *mhandle = register_on(net, data, size, type, nullptr);
      return abi::kSuccess;
    }
    if (fd < 0) throw InvalidArgument("bad dmabuf file descriptor " + std::to_string(fd));
    if (::fcntl(fd, F_GETFD) == -1)
      throw InvalidArgument("dmabuf file descriptor " + std::to_string(fd) +
                            " is not open: " + std::strerror(errno));
    if (type != abi::kPtrCuda)
      throw InvalidArgument("a dmabuf of " + type_text(type) +
                            ": only NCCL_PTR_CUDA memory comes as a dmabuf");
    if ((net.ptr_support() & abi::kPtrDmaBuf) == 0)
      throw InvalidArgument("a dmabuf registration on a device that takes none: " +
                            net.memory_note());
    const Dmabuf dmabuf{.fd = fd, .offset = offset};
    *mhandle = register_on(net, data, size, type, &dmabuf);
    return abi::kSuccess;
  });
}

abi::Result dereg_mr(void* comm, void* mhandle) {
  return guard("deregMr", [&] {
    NetComm& net = any_comm(comm);
    std::unique_ptr<MemoryHandle> handle(&expect<MemoryHandle>(mhandle, Kind::kMemory, "mhandle"));
    if (handle->comm != &net) throw InvalidArgument("mhandle was registered on another comm");
    handle->tag = Kind{};
    net.comm().deregister(handle->region);
    return abi::kSuccess;
  });
}

abi::Result close_send(void* send_comm) {
  return guard("closeSend", [&] {
    close_and_free(&expect<NetComm>(send_comm, Kind::kSend, "send comm"),
                   [](NetComm& comm) { comm.comm().close(); });
    return abi::kSuccess;
  });
}

abi::Result close_recv(void* recv_comm) {
  return guard("closeRecv", [&] {
    close_and_free(&expect<NetComm>(recv_comm, Kind::kRecv, "receive comm"),
                   [](NetComm& comm) { comm.comm().close(); });
    return abi::kSuccess;
  });
}

abi::Result close_listen(void* listen_comm) {
  return guard("closeListen", [&] {
    close_and_free(&expect<ListenComm>(listen_comm, Kind::kListen, "listen comm"),
                   [](ListenComm& comm) { comm.listener.close(); });
    return abi::kSuccess;
  });
}

abi::Result set_net_attr(void* ctx, abi::NetAttr* attr) {
  return guard("setNetAttr", [&] {
    expect<InitContext>(ctx, Kind::kContext, "init context");
    (void)attr;  // loom has no per-operation tuning to take from NCCL's hints
    return abi::kSuccess;
  });
}

}  // namespace ops
}  // namespace loom::nccl
