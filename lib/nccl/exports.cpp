// The exported ncclNet tables, v8 to v12. Each version's entries adapt its argument types to
// the operations of comm.hpp (which take the widest forms); nothing else differs.
#include <algorithm>
#include <array>
#include <climits>

#include "nccl/abi.hpp"
#include "nccl/comm.hpp"
#include "nccl/guard.hpp"

namespace loom::nccl {
namespace {

constexpr const char* kName = "loom";

// ---- v8: int sizes ----
abi::Result init_v8(abi::Logger logger) {
  return ops::init(logger);
}
abi::Result connect_v8(int dev, void* handle, void** send_comm, abi::DeviceHandle** dev_comm) {
  return ops::connect(dev, handle, send_comm, dev_comm);
}
abi::Result isend_v8(void* comm, void* data, int size, int tag, void* mhandle, void** request) {
  if (size < 0) return fail("isend", abi::kInvalidArgument, "negative size");
  return ops::isend(comm, data, static_cast<std::size_t>(size), tag, mhandle, request);
}
abi::Result irecv_v8(void* comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                     void** request) {
  std::array<std::size_t, kMaxRecvBuffers> wide{};
  if (n < 1 || n > static_cast<int>(kMaxRecvBuffers) || sizes == nullptr)
    return ops::irecv(comm, n, data, nullptr, tags, mhandles, request);  // it says what is wrong
  for (int i = 0; i < n; ++i)
    wide[static_cast<std::size_t>(i)] = static_cast<std::size_t>(std::max(sizes[i], 0));
  return ops::irecv(comm, n, data, wide.data(), tags, mhandles, request);
}

// ---- v9: size_t sizes, makeVDevice ----
abi::Result irecv_v9(void* comm, int n, void** data, std::size_t* sizes, int* tags, void** mhandles,
                     void** request) {
  return ops::irecv(comm, n, data, sizes, tags, mhandles, request);
}

// ---- v10: profiler callback, per-connect config, profiler handles (ignored) ----
abi::Result init_v10(abi::Logger logger, abi::ProfilerCallback) {
  return ops::init(logger);
}
abi::Result connect_v10(int dev, abi::CommConfig*, void* handle, void** send_comm,
                        abi::DeviceHandle** dev_comm) {
  return ops::connect(dev, handle, send_comm, dev_comm);
}
abi::Result isend_v10(void* comm, void* data, std::size_t size, int tag, void* mhandle, void*,
                      void** request) {
  return ops::isend(comm, data, size, tag, mhandle, request);
}
abi::Result irecv_v10(void* comm, int n, void** data, std::size_t* sizes, int* tags,
                      void** mhandles, void**, void** request) {
  return ops::irecv(comm, n, data, sizes, tags, mhandles, request);
}

// ---- v11 and v12: per-communicator init context ----
abi::Result init_v11(void** ctx, std::uint64_t comm_id, abi::CommConfig* config, abi::Logger logger,
                     abi::ProfilerCallback) {
  return ops::init_context(ctx, comm_id, config, logger);
}
abi::Result listen_v11(void*, int dev, void* handle, void** listen_comm) {
  return ops::listen(dev, handle, listen_comm);
}
abi::Result connect_v11(void*, int dev, void* handle, void** send_comm,
                        abi::DeviceHandle** dev_comm) {
  return ops::connect(dev, handle, send_comm, dev_comm);
}
abi::Result iflush_any(void* comm, int n, void** data, int* sizes, void** mhandles,
                       void** request) {
  return ops::iflush(comm, n, data, sizes, mhandles, request);
}

// v11 and v12 have the same entries (abi::NetWithContext); v12 differs only in the structs of
// getProperties (wider vProps, railId/planeId) and makeVDevice (8 devices), which the ops
// take as template arguments. v12 brings no new entry. setNetAttr (v11, kept in v12) is
// honoured as a hint loom has no use for: it checks the context and answers ncclSuccess.
// NCCL would also accept a NULL setNetAttr (it calls it only where non-NULL), but an entry
// that checks its context catches a stale one.
template <typename Net>
constexpr Net table_with_context() {
  return Net{
      .name = kName,
      .init = init_v11,
      .devices = ops::devices,
      .getProperties = ops::properties<typename Net::Properties>,
      .listen = listen_v11,
      .connect = connect_v11,
      .accept = ops::accept,
      .regMr = ops::reg_mr,
      .regMrDmaBuf = ops::reg_mr_dmabuf,
      .deregMr = ops::dereg_mr,
      .isend = isend_v10,
      .irecv = irecv_v10,
      .iflush = iflush_any,
      .test = ops::test,
      .closeSend = ops::close_send,
      .closeRecv = ops::close_recv,
      .closeListen = ops::close_listen,
      .getDeviceMr = nullptr,
      .irecvConsumed = nullptr,
      .makeVDevice = ops::make_vdevice<typename Net::VDevice>,
      .finalize = ops::finalize,
      .setNetAttr = ops::set_net_attr,
  };
}

}  // namespace
}  // namespace loom::nccl

using namespace loom::nccl;  // NOLINT: the tables below name many entries

// NCCL dlopens the plugin and dlsyms these names, newest first.
extern "C" {

[[gnu::visibility("default")]] extern const abi::NetV8 ncclNetPlugin_v8;
[[gnu::visibility("default")]] extern const abi::NetV9 ncclNetPlugin_v9;
[[gnu::visibility("default")]] extern const abi::NetV10 ncclNetPlugin_v10;
[[gnu::visibility("default")]] extern const abi::NetV11 ncclNetPlugin_v11;
[[gnu::visibility("default")]] extern const abi::NetV12 ncclNetPlugin_v12;

const abi::NetV8 ncclNetPlugin_v8 = {
    .name = kName,
    .init = init_v8,
    .devices = ops::devices,
    .getProperties = ops::properties<abi::PropertiesV8>,
    .listen = ops::listen,
    .connect = connect_v8,
    .accept = ops::accept,
    .regMr = ops::reg_mr,
    .regMrDmaBuf = ops::reg_mr_dmabuf,
    .deregMr = ops::dereg_mr,
    .isend = isend_v8,
    .irecv = irecv_v8,
    .iflush = iflush_any,
    .test = ops::test,
    .closeSend = ops::close_send,
    .closeRecv = ops::close_recv,
    .closeListen = ops::close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
};

const abi::NetV9 ncclNetPlugin_v9 = {
    .name = kName,
    .init = init_v8,
    .devices = ops::devices,
    .getProperties = ops::properties<abi::PropertiesV9>,
    .listen = ops::listen,
    .connect = connect_v8,
    .accept = ops::accept,
    .regMr = ops::reg_mr,
    .regMrDmaBuf = ops::reg_mr_dmabuf,
    .deregMr = ops::dereg_mr,
    .isend = ops::isend,
    .irecv = irecv_v9,
    .iflush = iflush_any,
    .test = ops::test,
    .closeSend = ops::close_send,
    .closeRecv = ops::close_recv,
    .closeListen = ops::close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
    .makeVDevice = ops::make_vdevice<abi::VDeviceProps>,
};

const abi::NetV10 ncclNetPlugin_v10 = {
    .name = kName,
    .init = init_v10,
    .devices = ops::devices,
    .getProperties = ops::properties<abi::PropertiesV10>,
    .listen = ops::listen,
    .connect = connect_v10,
    .accept = ops::accept,
    .regMr = ops::reg_mr,
    .regMrDmaBuf = ops::reg_mr_dmabuf,
    .deregMr = ops::dereg_mr,
    .isend = isend_v10,
    .irecv = irecv_v10,
    .iflush = iflush_any,
    .test = ops::test,
    .closeSend = ops::close_send,
    .closeRecv = ops::close_recv,
    .closeListen = ops::close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
    .makeVDevice = ops::make_vdevice<abi::VDeviceProps>,
};

constinit const abi::NetV11 ncclNetPlugin_v11 = table_with_context<abi::NetV11>();
constinit const abi::NetV12 ncclNetPlugin_v12 = table_with_context<abi::NetV12>();

}  // extern "C"
