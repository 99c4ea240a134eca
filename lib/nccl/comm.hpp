// The objects behind NCCL's opaque pointers (listen comm, send/recv comm, memory handle,
// request, v11/v12 init context) and the version-neutral operations the ncclNet tables call.
// Every operation returns an abi::Result and never throws: see guard() in guard.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "loom/loom.hpp"
#include "nccl/abi.hpp"

namespace loom::nccl {

// Objects carry a tag so that a pointer of the wrong kind is refused, not misused.
enum class Kind : std::uint32_t {
  kListen = 0x4C4C5354,   // "LLST"
  kSend = 0x4C534E44,     // "LSND"
  kRecv = 0x4C524356,     // "LRCV"
  kMemory = 0x4C4D454D,   // "LMEM"
  kContext = 0x4C435458,  // "LCTX"
};

struct ListenComm {
  [[nodiscard]] Kind kind() const noexcept { return tag; }
  Kind tag = Kind::kListen;
  int dev = 0;
  Listener listener;
};

class NetComm;

// A pending isend/irecv/iflush. test() has no communicator argument, so a request knows its
// communicator. Requests live in their communicator's fixed pool (no allocation per message).
struct NetRequest {
  NetComm* comm = nullptr;
  Request inner;
  int buffers = 0;  // receives: buffers posted; sends: 1
  std::size_t send_size = 0;
};

class NetComm {
 public:
  // `ptr_support` and `memory_note`: its device's (Device in registry.hpp), for regMr's checks.
  NetComm(Kind kind, std::unique_ptr<Communicator> comm, int ptr_support, std::string memory_note);

  [[nodiscard]] Kind kind() const noexcept { return kind_; }
  [[nodiscard]] int ptr_support() const noexcept { return ptr_support_; }
  [[nodiscard]] const std::string& memory_note() const noexcept { return memory_note_; }
  [[nodiscard]] Communicator& comm() noexcept { return *comm_; }
  [[nodiscard]] SendComm& send() noexcept { return static_cast<SendComm&>(*comm_); }
  [[nodiscard]] RecvComm& recv() noexcept { return static_cast<RecvComm&>(*comm_); }

  // nullptr when every slot is taken (the caller answers "retry" with a NULL request).
  NetRequest* take() noexcept;
  void give_back(NetRequest* request) noexcept;

 private:
  Kind kind_;
  std::unique_ptr<Communicator> comm_;
  int ptr_support_;
  std::string memory_note_;
  std::array<NetRequest, kMaxRequestsPerComm> requests_{};
  std::array<std::uint16_t, kMaxRequestsPerComm> free_{};
  std::size_t free_count_ = 0;
};

struct MemoryHandle {
  [[nodiscard]] Kind kind() const noexcept { return tag; }
  Kind tag = Kind::kMemory;
  NetComm* comm = nullptr;
  MemoryRegion region;
};

// v11's and v12's per-NCCL-communicator init context.
struct InitContext {
  [[nodiscard]] Kind kind() const noexcept { return tag; }
  Kind tag = Kind::kContext;
  std::uint64_t comm_id = 0;
  int traffic_class = abi::kTrafficClassUndef;
};

// The operations, one per ncclNet entry, in their widest form (v11's size_t sizes).
namespace ops {
abi::Result init(abi::Logger logger);
abi::Result init_context(void** ctx, std::uint64_t comm_id, const abi::CommConfig* config,
                         abi::Logger logger);
abi::Result finalize(void* ctx);
abi::Result devices(int* ndev);
// VProps is v9..v11's VDeviceProps (up to 4 devices) or v12's VDevicePropsV12 (up to 8).
template <typename VProps>
abi::Result make_vdevice(int* dev, VProps* props);
// Fills every field the versions share, and the fields of the newer versions where Props has
// them: v9's forceFlush, vProps and byte limits, v11's maxMultiRequestSize, v12's rail and
// plane (kNetIdUndef: loom does not know the fabric's rails).
template <typename Props>
abi::Result properties(int dev, Props* props);

abi::Result listen(int dev, void* handle, void** listen_comm);
abi::Result connect(int dev, void* handle, void** send_comm, abi::DeviceHandle** dev_comm);
abi::Result accept(void* listen_comm, void** recv_comm, abi::DeviceHandle** dev_comm);
abi::Result reg_mr(void* comm, void* data, std::size_t size, int type, void** mhandle);
abi::Result reg_mr_dmabuf(void* comm, void* data, std::size_t size, int type, std::uint64_t offset,
                          int fd, void** mhandle);
abi::Result dereg_mr(void* comm, void* mhandle);
abi::Result close_send(void* send_comm);
abi::Result close_recv(void* recv_comm);
abi::Result close_listen(void* listen_comm);

abi::Result isend(void* send_comm, void* data, std::size_t size, int tag, void* mhandle,
                  void** request);
abi::Result irecv(void* recv_comm, int n, void** data, const std::size_t* sizes, const int* tags,
                  void** mhandles, void** request);
abi::Result iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles,
                   void** request);
abi::Result test(void* request, int* done, int* sizes);
abi::Result set_net_attr(void* ctx, abi::NetAttr* attr);
}  // namespace ops

}  // namespace loom::nccl
