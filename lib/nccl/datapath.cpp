// Data-path entries: isend/irecv/iflush/test, called by NCCL's progress thread of each
// communicator. No allocation: requests come from the communicator's fixed pool; loom's
// kRetry (and a full pool) become success with a NULL request, which NCCL retries.
#include <algorithm>
#include <climits>

#include "nccl/comm.hpp"
#include "nccl/guard.hpp"

namespace loom::nccl {

NetRequest* NetComm::take() noexcept {
  if (free_count_ == 0) return nullptr;
  NetRequest* request = &requests_[free_[--free_count_]];
  request->comm = this;
  return request;
}

void NetComm::give_back(NetRequest* request) noexcept {
  request->inner = {};
  request->comm = nullptr;
  free_[free_count_++] = static_cast<std::uint16_t>(request - requests_.data());
}

namespace ops {
namespace {

abi::Result status_result(Status status) {
  switch (status) {
    case Status::kOk:
    case Status::kInProgress:
      return abi::kSuccess;
    case Status::kRetry:
      return abi::kSuccess;
    case Status::kInvalid:
      return abi::kInvalidArgument;
    case Status::kTruncated:
      return abi::kInvalidUsage;
    case Status::kPeerError:
      return abi::kRemoteError;
    case Status::kCancelled:
      return abi::kInternalError;
    case Status::kError:
      return abi::kSystemError;
  }
  return abi::kInternalError;
}

[[gnu::noinline, gnu::cold]] abi::Result data_error(const char* operation, NetComm& comm,
                                                    Status status) {
  return fail(operation, status_result(status),
              std::string(to_string(status)) + ": " + comm.comm().last_error());
}

MemoryRegion region_of(void* mhandle, NetComm& comm) {
  auto* handle = static_cast<MemoryHandle*>(mhandle);
  if (handle == nullptr || handle->kind() != Kind::kMemory || handle->comm != &comm) return {};
  return handle->region;
}

}  // namespace

abi::Result isend(void* send_comm, void* data, std::size_t size, int tag, void* mhandle,
                  void** request) {
  return guard("isend", [&] {
    if (request == nullptr) throw InvalidArgument("NULL request pointer");
    *request = nullptr;
    NetComm& comm = expect<NetComm>(send_comm, Kind::kSend, "send comm");
    NetRequest* slot = comm.take();
    if (slot == nullptr) return abi::kSuccess;  // every slot pending: NCCL retries
    const auto [status, posted] =
        comm.send().isend(data, size, static_cast<Tag>(tag), region_of(mhandle, comm));
    if (status != Status::kOk) {
      comm.give_back(slot);
      return status == Status::kRetry ? abi::kSuccess : data_error("isend", comm, status);
    }
    slot->inner = posted;
    slot->buffers = 1;
    slot->send_size = size;
    *request = slot;
    return abi::kSuccess;
  });
}

abi::Result irecv(void* recv_comm, int n, void** data, const std::size_t* sizes, const int* tags,
                  void** mhandles, void** request) {
  return guard("irecv", [&] {
    if (request == nullptr) throw InvalidArgument("NULL request pointer");
    *request = nullptr;
    NetComm& comm = expect<NetComm>(recv_comm, Kind::kRecv, "receive comm");
    if (n < 1 || n > static_cast<int>(kMaxRecvBuffers) || data == nullptr || sizes == nullptr ||
        tags == nullptr)
      throw InvalidArgument("irecv of " + std::to_string(n) + " buffers (1 to " +
                            std::to_string(kMaxRecvBuffers) + ", with data, sizes and tags)");
    std::array<RecvBuffer, kMaxRecvBuffers> buffers{};
    for (int i = 0; i < n; ++i) {
      buffers[i] = RecvBuffer{.data = data[i],
                              .size = sizes[i],
                              .tag = static_cast<Tag>(tags[i]),
                              .region = mhandles ? region_of(mhandles[i], comm) : MemoryRegion{}};
    }
    NetRequest* slot = comm.take();
    if (slot == nullptr) return abi::kSuccess;
    const auto [status, posted] = comm.recv().irecv({buffers.data(), static_cast<std::size_t>(n)});
    if (status != Status::kOk) {
      comm.give_back(slot);
      return status == Status::kRetry ? abi::kSuccess : data_error("irecv", comm, status);
    }
    slot->inner = posted;
    slot->buffers = n;
    *request = slot;
    return abi::kSuccess;
  });
}

abi::Result iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles,
                   void** request) {
  return guard("iflush", [&] {
    if (request == nullptr) throw InvalidArgument("NULL request pointer");
    *request = nullptr;
    NetComm& comm = expect<NetComm>(recv_comm, Kind::kRecv, "receive comm");
    if (n < 1 || n > static_cast<int>(kMaxRecvBuffers) || data == nullptr || sizes == nullptr)
      throw InvalidArgument("iflush of " + std::to_string(n) + " buffers");
    std::array<RecvBuffer, kMaxRecvBuffers> buffers{};
    for (int i = 0; i < n; ++i) {
      buffers[i] = RecvBuffer{.data = data[i],
                              .size = static_cast<std::size_t>(std::max(sizes[i], 0)),
                              .tag = 0,
                              .region = mhandles ? region_of(mhandles[i], comm) : MemoryRegion{}};
    }
    NetRequest* slot = comm.take();
    if (slot == nullptr) return abi::kSuccess;
    const auto [status, posted] = comm.recv().iflush({buffers.data(), static_cast<std::size_t>(n)});
    if (status != Status::kOk) {
      comm.give_back(slot);
      return status == Status::kRetry ? abi::kSuccess : data_error("iflush", comm, status);
    }
    // Host memory: loom's flush has nothing to do and is done at once. NCCL reads a NULL
    // request as a flush done.
    if (const Status first = comm.recv().test(posted); first != Status::kInProgress) {
      comm.give_back(slot);
      return first == Status::kOk ? abi::kSuccess : data_error("iflush", comm, first);
    }
    slot->inner = posted;
    slot->buffers = 0;
    *request = slot;
    return abi::kSuccess;
  });
}

abi::Result test(void* request, int* done, int* sizes) {
  return guard("test", [&] {
    if (request == nullptr || done == nullptr) throw InvalidArgument("NULL request or done");
    auto* slot = static_cast<NetRequest*>(request);
    NetComm* comm = slot->comm;
    if (comm == nullptr || !slot->inner.valid()) throw InvalidArgument("not a pending request");
    std::array<std::size_t, kMaxRecvBuffers> delivered{};
    const std::size_t count = static_cast<std::size_t>(std::max(slot->buffers, 1));
    const Status status = comm->comm().test(slot->inner, {delivered.data(), count});
    *done = status == Status::kInProgress ? 0 : 1;
    if (status == Status::kInProgress) return abi::kSuccess;
    const int buffers = slot->buffers;
    const std::size_t send_size = slot->send_size;
    const Kind kind = comm->kind();
    comm->give_back(slot);
    if (status != Status::kOk) return data_error("test", *comm, status);
    if (sizes != nullptr) {
      if (kind == Kind::kSend) {
        sizes[0] = static_cast<int>(std::min<std::size_t>(send_size, INT_MAX));
      } else {
        for (int i = 0; i < buffers; ++i)
          sizes[i] = static_cast<int>(
              std::min<std::size_t>(delivered[static_cast<std::size_t>(i)], INT_MAX));
      }
    }
    return abi::kSuccess;
  });
}

}  // namespace ops
}  // namespace loom::nccl
