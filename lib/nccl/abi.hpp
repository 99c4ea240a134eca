// NCCL's network plugin ABI (ncclNet v8 to v12: v8..v11 as NCCL 2.28 loads them, v12 as
// NCCL 2.30 does), written from the facts of NCCL's public plugin headers
// (src/include/plugin/net/net_v*.h): the same field order and types, so the layouts are what
// NCCL reads. Every struct's size and every field offset is pinned below (LP64).
//
// Only lib/nccl (the plugin) and the plugin test tool include this header; nothing in loom's
// library does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::nccl::abi {

// ncclResult_t
enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// ncclDebugLogLevel and the NCCL_NET subsystem flag
enum LogLevel : int {
  kLogNone = 0,
  kLogVersion = 1,
  kLogWarn = 2,
  kLogInfo = 3,
  kLogAbort = 4,
  kLogTrace = 5,
};
inline constexpr unsigned long kLogSubsysInit = 0x1;
inline constexpr unsigned long kLogSubsysNet = 0x10;

using Logger = void (*)(LogLevel level, unsigned long flags, const char* file, int line,
                        const char* fmt, ...);
using ProfilerCallback = Result (*)(void** event, int type, void* parent, std::int64_t plugin_id,
                                    void* ext_data);

// Pointer kinds (ptrSupport bits and regMr's type).
inline constexpr int kPtrHost = 0x1;
inline constexpr int kPtrCuda = 0x2;
inline constexpr int kPtrDmaBuf = 0x4;

inline constexpr std::size_t kHandleMaxBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
inline constexpr int kMaxDevsPerNic = 4;             // NCCL_NET_MAX_DEVS_PER_NIC_V9..V11
inline constexpr int kMaxDevsPerNicV12 = 8;          // NCCL_NET_MAX_DEVS_PER_NIC_V12
inline constexpr int kTrafficClassUndef = -1;
inline constexpr std::int16_t kNetIdUndef = -1;  // NCCL_NET_ID_UNDEF: no rail / plane known

// ncclNetDeviceType
enum DeviceType : int {
  kDeviceHost = 0,
  kDeviceUnpack = 1,
  kDeviceGinProxy = 2,
  kDeviceGinGdaki = 3,
};

// ncclNetDeviceHandle_v7..v12_t (device offload; loom never offers one)
struct DeviceHandle {
  DeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  std::size_t size;
  int needsProxyProgress;
};

// ncclNetVDeviceProps_v9..v11_t
struct VDeviceProps {
  int ndevs;
  int devs[kMaxDevsPerNic];
};

// ncclNetVDeviceProps_v12_t: room for 8 devices
struct VDevicePropsV12 {
  int ndevs;
  int devs[kMaxDevsPerNicV12];
};

// ncclNetCommConfig_v10..v12_t
struct CommConfig {
  int trafficClass;
};

// ncclNetProperties_v8_t
struct PropertiesV8 {
  char* name;
  char* pciPath;
  std::uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;  // Mbps
  int port;
  float latency;  // microseconds
  int maxComms;
  int maxRecvs;
  DeviceType netDeviceType;
  int netDeviceVersion;
};

// ncclNetProperties_v9_t and _v10_t (same layout)
struct PropertiesV9 {
  char* name;
  char* pciPath;
  std::uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  DeviceType netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  std::size_t maxP2pBytes;
  std::size_t maxCollBytes;
};
using PropertiesV10 = PropertiesV9;

// ncclNetProperties_v11_t
struct PropertiesV11 {
  char* name;
  char* pciPath;
  std::uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  DeviceType netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  std::size_t maxP2pBytes;
  std::size_t maxCollBytes;
  int maxMultiRequestSize;
};

// ncclNetProperties_v12_t: v11's fields with the wider vProps (so the byte limits move), then
// the NIC's rail and plane (kNetIdUndef where the plugin does not know them).
struct PropertiesV12 {
  char* name;
  char* pciPath;
  std::uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  DeviceType netDeviceType;
  int netDeviceVersion;
  VDevicePropsV12 vProps;
  std::size_t maxP2pBytes;
  std::size_t maxCollBytes;
  int maxMultiRequestSize;
  std::int16_t railId;
  std::int16_t planeId;
};

// ncclNetCommAttr_v11/v12_t, ncclNetAttr_v11/v12_t (the same layout in both)
struct CommAttr {
  std::int32_t maxConcurrentPeers;
  std::int32_t minConcurrentPeers;
  std::int32_t maxFlowsPerPeer;
  std::int32_t minFlowsPerPeer;
};
struct NetAttr {
  CommAttr sendCommAttr;
  CommAttr recvCommAttr;
  std::uint32_t op;
  std::uint32_t algo;
  std::uint32_t proto;
};

// The function tables. Members named as NCCL names them; comments give the differences.
struct NetV8 {
  const char* name;
  Result (*init)(Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV8* props);
  Result (*listen)(int dev, void* handle, void** listen_comm);
  Result (*connect)(int dev, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*regMr)(void* comm, void* data, std::size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, std::size_t size, int type, std::uint64_t offset,
                        int fd, void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                  void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* send_comm);
  Result (*closeRecv)(void* recv_comm);
  Result (*closeListen)(void* listen_comm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecvConsumed)(void* recv_comm, int n, void* request);
};

// v9: sizes become size_t for isend/irecv; props gain forceFlush, vProps, max bytes;
// makeVDevice appended.
struct NetV9 {
  const char* name;
  Result (*init)(Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV9* props);
  Result (*listen)(int dev, void* handle, void** listen_comm);
  Result (*connect)(int dev, void* handle, void** send_comm, DeviceHandle** send_dev_comm);
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*regMr)(void* comm, void* data, std::size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, std::size_t size, int type, std::uint64_t offset,
                        int fd, void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, std::size_t size, int tag, void* mhandle,
                  void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, std::size_t* sizes, int* tags,
                  void** mhandles, void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* send_comm);
  Result (*closeRecv)(void* recv_comm);
  Result (*closeListen)(void* listen_comm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecvConsumed)(void* recv_comm, int n, void* request);
  Result (*makeVDevice)(int* dev, VDeviceProps* props);
};

// v10: init takes a profiler callback; connect takes a CommConfig; isend/irecv take profiler
// handles (phandle / phandles).
struct NetV10 {
  const char* name;
  Result (*init)(Logger logger, ProfilerCallback profiler);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV10* props);
  Result (*listen)(int dev, void* handle, void** listen_comm);
  Result (*connect)(int dev, CommConfig* config, void* handle, void** send_comm,
                    DeviceHandle** send_dev_comm);
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*regMr)(void* comm, void* data, std::size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, std::size_t size, int type, std::uint64_t offset,
                        int fd, void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, std::size_t size, int tag, void* mhandle,
                  void* phandle, void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, std::size_t* sizes, int* tags,
                  void** mhandles, void** phandles, void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* send_comm);
  Result (*closeRecv)(void* recv_comm);
  Result (*closeListen)(void* listen_comm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecvConsumed)(void* recv_comm, int n, void* request);
  Result (*makeVDevice)(int* dev, VDeviceProps* props);
};

// v11: init is per NCCL communicator (returns a context, takes the comm id and CommConfig);
// listen/connect take that context; finalize and setNetAttr appended.
// v12: the same entries; only getProperties' and makeVDevice's structs differ. One template
// gives both tables (its type aliases add no members, so the layout is the list below).
template <typename Props, typename VProps>
struct NetWithContext {
  using Properties = Props;
  using VDevice = VProps;

  const char* name;
  Result (*init)(void** ctx, std::uint64_t comm_id, CommConfig* config, Logger logger,
                 ProfilerCallback profiler);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, Props* props);
  Result (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  Result (*connect)(void* ctx, int dev, void* handle, void** send_comm,
                    DeviceHandle** send_dev_comm);
  Result (*accept)(void* listen_comm, void** recv_comm, DeviceHandle** recv_dev_comm);
  Result (*regMr)(void* comm, void* data, std::size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, std::size_t size, int type, std::uint64_t offset,
                        int fd, void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* send_comm, void* data, std::size_t size, int tag, void* mhandle,
                  void* phandle, void** request);
  Result (*irecv)(void* recv_comm, int n, void** data, std::size_t* sizes, int* tags,
                  void** mhandles, void** phandles, void** request);
  Result (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* send_comm);
  Result (*closeRecv)(void* recv_comm);
  Result (*closeListen)(void* listen_comm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecvConsumed)(void* recv_comm, int n, void* request);
  Result (*makeVDevice)(int* dev, VProps* props);
  Result (*finalize)(void* ctx);
  Result (*setNetAttr)(void* ctx, NetAttr* attr);
};
using NetV11 = NetWithContext<PropertiesV11, VDeviceProps>;
using NetV12 = NetWithContext<PropertiesV12, VDevicePropsV12>;

// The exported symbol names, newest first (the order NCCL probes them in).
inline constexpr const char* kSymbolV12 = "ncclNetPlugin_v12";
inline constexpr const char* kSymbolV11 = "ncclNetPlugin_v11";
inline constexpr const char* kSymbolV10 = "ncclNetPlugin_v10";
inline constexpr const char* kSymbolV9 = "ncclNetPlugin_v9";
inline constexpr const char* kSymbolV8 = "ncclNetPlugin_v8";

// ---- layout pins (LP64: 8-byte pointers and size_t, 4-byte int, float and enums) ----
static_assert(sizeof(void*) == 8 && sizeof(std::size_t) == 8 && sizeof(int) == 4);
static_assert(sizeof(Result) == 4 && sizeof(DeviceType) == 4 && sizeof(LogLevel) == 4);

static_assert(sizeof(DeviceHandle) == 32);
static_assert(offsetof(DeviceHandle, netDeviceVersion) == 4);
static_assert(offsetof(DeviceHandle, handle) == 8);
static_assert(offsetof(DeviceHandle, size) == 16);
static_assert(offsetof(DeviceHandle, needsProxyProgress) == 24);

static_assert(sizeof(VDeviceProps) == 20 && offsetof(VDeviceProps, devs) == 4);
static_assert(sizeof(VDevicePropsV12) == 36 && offsetof(VDevicePropsV12, devs) == 4);
static_assert(sizeof(CommConfig) == 4);
static_assert(sizeof(CommAttr) == 16 && offsetof(CommAttr, minFlowsPerPeer) == 12);
static_assert(sizeof(NetAttr) == 44);
static_assert(offsetof(NetAttr, recvCommAttr) == 16 && offsetof(NetAttr, op) == 32);
static_assert(offsetof(NetAttr, algo) == 36 && offsetof(NetAttr, proto) == 40);

static_assert(sizeof(PropertiesV8) == 64);
static_assert(offsetof(PropertiesV8, pciPath) == 8 && offsetof(PropertiesV8, guid) == 16);
static_assert(offsetof(PropertiesV8, ptrSupport) == 24 &&
              offsetof(PropertiesV8, regIsGlobal) == 28);
static_assert(offsetof(PropertiesV8, speed) == 32 && offsetof(PropertiesV8, port) == 36);
static_assert(offsetof(PropertiesV8, latency) == 40 && offsetof(PropertiesV8, maxComms) == 44);
static_assert(offsetof(PropertiesV8, maxRecvs) == 48 &&
              offsetof(PropertiesV8, netDeviceType) == 52);
static_assert(offsetof(PropertiesV8, netDeviceVersion) == 56);

static_assert(sizeof(PropertiesV9) == 104);
static_assert(offsetof(PropertiesV9, pciPath) == 8 && offsetof(PropertiesV9, guid) == 16);
static_assert(offsetof(PropertiesV9, ptrSupport) == 24 &&
              offsetof(PropertiesV9, regIsGlobal) == 28);
static_assert(offsetof(PropertiesV9, forceFlush) == 32 && offsetof(PropertiesV9, speed) == 36);
static_assert(offsetof(PropertiesV9, port) == 40 && offsetof(PropertiesV9, latency) == 44);
static_assert(offsetof(PropertiesV9, maxComms) == 48 && offsetof(PropertiesV9, maxRecvs) == 52);
static_assert(offsetof(PropertiesV9, netDeviceType) == 56);
static_assert(offsetof(PropertiesV9, netDeviceVersion) == 60);
static_assert(offsetof(PropertiesV9, vProps) == 64 && offsetof(PropertiesV9, maxP2pBytes) == 88);
static_assert(offsetof(PropertiesV9, maxCollBytes) == 96);

static_assert(sizeof(PropertiesV11) == 112);
static_assert(offsetof(PropertiesV11, forceFlush) == 32 && offsetof(PropertiesV11, speed) == 36);
static_assert(offsetof(PropertiesV11, port) == 40 && offsetof(PropertiesV11, latency) == 44);
static_assert(offsetof(PropertiesV11, maxComms) == 48 && offsetof(PropertiesV11, maxRecvs) == 52);
static_assert(offsetof(PropertiesV11, netDeviceType) == 56);
static_assert(offsetof(PropertiesV11, netDeviceVersion) == 60);
static_assert(offsetof(PropertiesV11, vProps) == 64 && offsetof(PropertiesV11, maxP2pBytes) == 88);
static_assert(offsetof(PropertiesV11, maxCollBytes) == 96);
static_assert(offsetof(PropertiesV11, maxMultiRequestSize) == 104);

static_assert(sizeof(PropertiesV12) == 128);
static_assert(offsetof(PropertiesV12, pciPath) == 8 && offsetof(PropertiesV12, guid) == 16);
static_assert(offsetof(PropertiesV12, ptrSupport) == 24 &&
              offsetof(PropertiesV12, regIsGlobal) == 28);
static_assert(offsetof(PropertiesV12, forceFlush) == 32 && offsetof(PropertiesV12, speed) == 36);
static_assert(offsetof(PropertiesV12, port) == 40 && offsetof(PropertiesV12, latency) == 44);
static_assert(offsetof(PropertiesV12, maxComms) == 48 && offsetof(PropertiesV12, maxRecvs) == 52);
static_assert(offsetof(PropertiesV12, netDeviceType) == 56);
static_assert(offsetof(PropertiesV12, netDeviceVersion) == 60);
static_assert(offsetof(PropertiesV12, vProps) == 64 && offsetof(PropertiesV12, maxP2pBytes) == 104);
static_assert(offsetof(PropertiesV12, maxCollBytes) == 112);
static_assert(offsetof(PropertiesV12, maxMultiRequestSize) == 120);
static_assert(offsetof(PropertiesV12, railId) == 124 && offsetof(PropertiesV12, planeId) == 126);

// Function tables: one pointer per member, in NCCL's order.
constexpr std::size_t slot(std::size_t index) {
  return index * sizeof(void*);
}
static_assert(sizeof(NetV8) == slot(19));
static_assert(offsetof(NetV8, init) == slot(1) && offsetof(NetV8, listen) == slot(4));
static_assert(offsetof(NetV8, regMr) == slot(7) && offsetof(NetV8, isend) == slot(10));
static_assert(offsetof(NetV8, test) == slot(13) && offsetof(NetV8, closeListen) == slot(16));
static_assert(offsetof(NetV8, irecvConsumed) == slot(18));
static_assert(sizeof(NetV9) == slot(20));
static_assert(offsetof(NetV9, isend) == slot(10) && offsetof(NetV9, test) == slot(13));
static_assert(offsetof(NetV9, makeVDevice) == slot(19));
static_assert(sizeof(NetV10) == slot(20));
static_assert(offsetof(NetV10, connect) == slot(5) && offsetof(NetV10, irecv) == slot(11));
static_assert(offsetof(NetV10, makeVDevice) == slot(19));
static_assert(sizeof(NetV11) == slot(22));
static_assert(offsetof(NetV11, listen) == slot(4) && offsetof(NetV11, deregMr) == slot(9));
static_assert(offsetof(NetV11, makeVDevice) == slot(19) && offsetof(NetV11, finalize) == slot(20));
static_assert(offsetof(NetV11, setNetAttr) == slot(21));
static_assert(sizeof(NetV12) == slot(22));
static_assert(offsetof(NetV12, getProperties) == slot(3) && offsetof(NetV12, listen) == slot(4));
static_assert(offsetof(NetV12, isend) == slot(10) && offsetof(NetV12, test) == slot(13));
static_assert(offsetof(NetV12, makeVDevice) == slot(19) && offsetof(NetV12, finalize) == slot(20));
static_assert(offsetof(NetV12, setNetAttr) == slot(21));

}  // namespace loom::nccl::abi
