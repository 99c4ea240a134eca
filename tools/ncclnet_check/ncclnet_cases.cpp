// Shared helpers (buffers in the run's memory, flushes after receives) and the
// single-communicator cases: sizes, grouped receives, a window of requests with NULL-request
// retries, a message larger than its receive buffer, registration arguments to refuse.
#include "ncclnet_cases.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include "ncclnet_cuda.hpp"

namespace ncclnet {

// ---- helpers ----

std::vector<Link> establish(Plugin& plugin, Rank& rank, int dev, int to, int from, int count) {
  std::vector<Link> links(static_cast<std::size_t>(count));
  std::vector<std::array<std::uint8_t, abi::kHandleMaxBytes>> mine(links.size()),
      theirs(links.size());
  for (std::size_t i = 0; i < links.size(); ++i)
    check(plugin.listen(dev, mine[i].data(), &links[i].listen), "listen");
  for (auto& handle : mine) rank.send(from, handle.data(), handle.size());
  for (auto& handle : theirs) rank.recv(to, handle.data(), handle.size());
  std::size_t pending = 2 * links.size();
  while (pending > 0) {
    for (std::size_t i = 0; i < links.size(); ++i) {
      if (links[i].send == nullptr) {
        check(plugin.connect(dev, theirs[i].data(), &links[i].send),
              "connect to rank " + std::to_string(to));
        if (links[i].send != nullptr) --pending;
      }
      if (links[i].recv == nullptr) {
        check(plugin.accept(links[i].listen, &links[i].recv),
              "accept from rank " + std::to_string(from));
        if (links[i].recv != nullptr) --pending;
      }
    }
    rank.keep_waiting("connect/accept");
  }
  return links;
}

void close_links(Plugin& plugin, std::vector<Link>& links) {
  for (auto& link : links) {
    if (link.send != nullptr) check(plugin.close_send(link.send), "closeSend");
    if (link.recv != nullptr) check(plugin.close_recv(link.recv), "closeRecv");
    if (link.listen != nullptr) check(plugin.close_listen(link.listen), "closeListen");
    link = Link{};
  }
}

namespace {

// What prepare_memory decided for this rank's GPU buffers.
struct GpuRegistration {
  std::string no_dmabuf;  // why buffers go by address only; empty: every other one by dmabuf
  std::atomic<std::uint64_t> made{0};  // GPU buffers registered so far (by any thread)
};
GpuRegistration gpu_registration;

// Registers GPU memory as NCCL does: through a dmabuf where it may (NCCL closes the descriptor
// once the plugin returned), else by address with NCCL_PTR_CUDA.
void register_gpu(Plugin& plugin, void* comm, void* data, std::size_t size, void** mhandle) {
  const bool dmabuf = gpu_registration.no_dmabuf.empty() && gpu_registration.made++ % 2 == 1;
  if (!dmabuf) {
    check(plugin.reg_mr(comm, data, size, abi::kPtrCuda, mhandle), "regMr (NCCL_PTR_CUDA)");
    return;
  }
  const cuda::DmabufExport exported = cuda::export_dmabuf(memory().gpu, data, size);
  const abi::Result result =
      plugin.reg_mr_dmabuf(comm, data, size, abi::kPtrCuda, exported.offset, exported.fd, mhandle);
  ::close(exported.fd);
  check(result, "regMrDmaBuf (NCCL_PTR_CUDA, offset " + std::to_string(exported.offset) + ")");
}

}  // namespace

Buffer::Buffer(Plugin& plugin, void* comm, std::size_t size)
    : plugin_(plugin), comm_(comm), bytes_(std::max<std::size_t>(size, 1)) {
  if (!memory().separate()) {
    check(plugin_.reg_mr(comm_, bytes_.data(), bytes_.size(), &mhandle_), "regMr");
    return;
  }
  if (memory().staged) {
    staged_.resize(bytes_.size());
    device_ = staged_.data();
    check(plugin_.reg_mr(comm_, device_, bytes_.size(), &mhandle_), "regMr (staged)");
    return;
  }
  device_ = cuda::allocate(memory().gpu, bytes_.size());
  try {
    register_gpu(plugin_, comm_, device_, bytes_.size(), &mhandle_);
  } catch (...) {
    cuda::release(memory().gpu, device_);
    throw;
  }
}

Buffer::~Buffer() {
  deregister();
  if (memory().cuda && device_ != nullptr) cuda::release(memory().gpu, device_);
}

void Buffer::upload() {
  if (memory().staged) std::memcpy(device_, bytes_.data(), bytes_.size());
  if (memory().cuda) cuda::copy_to_device(memory().gpu, device_, bytes_.data(), bytes_.size());
}

void Buffer::download() {
  if (memory().staged) std::memcpy(bytes_.data(), device_, bytes_.size());
  if (memory().cuda) cuda::copy_to_host(memory().gpu, bytes_.data(), device_, bytes_.size());
}

void Buffer::deregister() {
  if (mhandle_ != nullptr) plugin_.dereg_mr(comm_, mhandle_);
  mhandle_ = nullptr;
}

std::string prepare_memory(Plugin& plugin, int dev) {
  if (memory().staged)
    return "host memory staged as GPU memory is (the tool's GPU path without a GPU): buffers "
           "apart from the bytes checked, copied to and from them, every receive flushed";
  if (!memory().cuda) return {};
  const int gpu = memory().gpu;
  const DeviceProps props = plugin.properties(dev);
  if ((props.ptr_support & abi::kPtrCuda) == 0) {
    std::string why;
    for (const LogLine& line : log_since(0))
      if (line.text.find("ptrSupport") != std::string::npos &&
          line.text.find(props.name) != std::string::npos)
        why = line.text;
    throw SkipError("plugin device " + std::to_string(dev) + " (" + props.name +
                    ") takes no CUDA memory (ptrSupport without NCCL_PTR_CUDA)" +
                    (why.empty() ? std::string() : "; the plugin says: " + why));
  }
  if (const std::string missing = cuda::unavailable(gpu); !missing.empty())
    throw SkipError("no GPU for --device cuda:" + std::to_string(gpu) + ": " + missing);
  gpu_registration.made = 0;
  if ((props.ptr_support & abi::kPtrDmaBuf) == 0)
    gpu_registration.no_dmabuf = "the plugin's ptrSupport has no NCCL_PTR_DMABUF";
  else
    gpu_registration.no_dmabuf = cuda::dmabuf_unavailable(gpu);
  return "CUDA device " + std::to_string(gpu) + " (" + cuda::device_name(gpu) +
         "), buffers registered with NCCL_PTR_CUDA" +
         (gpu_registration.no_dmabuf.empty()
              ? std::string(", every other one through a dmabuf (regMrDmaBuf)")
              : " by address only: " + gpu_registration.no_dmabuf) +
         "; every receive flushed (iflush), bytes checked on the host";
}

void flush_received(Plugin& plugin, void* recv_comm, std::span<Buffer* const> buffers,
                    const int* sizes, Rank& rank) {
  if (!memory().separate()) return;
  std::array<void*, 8> data{}, mhandles{};
  std::array<int, 8> flushed{};
  bool any = false;
  for (std::size_t i = 0; i < buffers.size() && i < data.size(); ++i) {
    data[i] = buffers[i]->wire();
    mhandles[i] = buffers[i]->mhandle();
    flushed[i] = sizes[i];
    any = any || sizes[i] > 0;
  }
  if (any) {  // NCCL flushes only what received bytes
    void* request = nullptr;
    check(plugin.iflush(recv_comm, static_cast<int>(buffers.size()), data.data(), flushed.data(),
                        mhandles.data(), &request),
          "iflush");
    if (request != nullptr) wait_done(plugin, request, nullptr, "iflush", rank);
  }
}

void after_receive(Plugin& plugin, void* recv_comm, std::span<Buffer* const> buffers,
                   const int* sizes, Rank& rank) {
  if (!memory().separate()) return;
  flush_received(plugin, recv_comm, buffers, sizes, rank);
  for (Buffer* buffer : buffers) buffer->download();
}

void after_receive(Plugin& plugin, void* recv_comm, Buffer& buffer, int size, Rank& rank) {
  Buffer* one = &buffer;
  after_receive(plugin, recv_comm, std::span<Buffer* const>(&one, 1), &size, rank);
}

void fill(std::uint8_t* data, std::size_t size, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    data[i] = static_cast<std::uint8_t>(x >> 24);
  }
}

void verify(const std::uint8_t* data, std::size_t size, std::uint32_t seed,
            const std::string& what) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    const auto expected = static_cast<std::uint8_t>(x >> 24);
    if (data[i] != expected) {
      char text[160];
      std::snprintf(text, sizeof(text), ": byte %zu of %zu is 0x%02x, expected 0x%02x", i, size,
                    data[i], expected);
      throw CheckError(what + text);
    }
  }
}

void* post_send(Plugin& plugin, void* comm, void* data, std::size_t size, int tag, void* mhandle,
                Rank& rank, std::size_t* retries) {
  while (true) {
    void* request = nullptr;
    check(plugin.isend(comm, data, size, tag, mhandle, &request), "isend");
    if (request != nullptr) return request;
    if (retries != nullptr) ++*retries;
    rank.keep_waiting("isend to return a request");
  }
}

void* post_recv(Plugin& plugin, void* comm, int n, void** data, std::size_t* sizes, int* tags,
                void** mhandles, Rank& rank, std::size_t* retries) {
  while (true) {
    void* request = nullptr;
    check(plugin.irecv(comm, n, data, sizes, tags, mhandles, &request), "irecv");
    if (request != nullptr) return request;
    if (retries != nullptr) ++*retries;
    rank.keep_waiting("irecv to return a request");
  }
}

abi::Result wait_result(Plugin& plugin, void* request, int* sizes, const std::string& what,
                        Rank& rank) {
  while (true) {
    int done = 0;
    const abi::Result result = plugin.test(request, &done, sizes);
    if (result != abi::kSuccess || done) return result;
    rank.keep_waiting(what);
  }
}

void wait_done(Plugin& plugin, void* request, int* sizes, const std::string& what, Rank& rank) {
  check(wait_result(plugin, request, sizes, what, rank), what);
}

namespace {

constexpr std::size_t kCanary = 64;
constexpr std::uint8_t kCanaryByte = 0xEE;

void check_canary(const std::uint8_t* data, std::size_t size, const std::string& what) {
  for (std::size_t i = 0; i < size; ++i)
    if (data[i] != kCanaryByte)
      throw CheckError(what + ": byte " + std::to_string(i) + " past the message was written");
}

// Rank 0 sends each size to rank 1 into a buffer 64 bytes larger; rank 1 checks the reported
// size, every byte and that nothing past the message changed.
void sizes_case(Plugin& plugin, Rank& rank, const Options& options) {
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, options.dev, peer, peer);
  ProgressThread progress;
  if (options.kill_in == "sizes" && rank.rank() == 1) ::raise(SIGKILL);
  for (std::size_t m = 0; m < options.sizes.size(); ++m) {
    const std::size_t size = options.sizes[m];
    const auto seed = static_cast<std::uint32_t>(m + 1);
    const int tag = static_cast<int>(m + 1);
    const std::string what = "message of " + std::to_string(size) + " bytes";
    if (rank.rank() == 0) {
      Buffer buffer(plugin, links[0].send, size);
      fill(buffer.data(), size, seed);
      buffer.upload();
      progress.run([&] {
        int sent = -1;
        void* request =
            post_send(plugin, links[0].send, buffer.wire(), size, tag, buffer.mhandle(), rank);
        wait_done(plugin, request, &sent, "isend of " + what, rank);
      });
    } else {
      Buffer buffer(plugin, links[0].recv, size + kCanary);
      std::memset(buffer.data(), kCanaryByte, buffer.size());
      buffer.upload();
      int got = -1;
      progress.run([&] {
        void* data = buffer.wire();
        std::size_t capacity = buffer.size();
        int recv_tag = tag;
        void* mh = buffer.mhandle();
        void* request = post_recv(plugin, links[0].recv, 1, &data, &capacity, &recv_tag, &mh, rank);
        wait_done(plugin, request, &got, "irecv of " + what, rank);
        after_receive(plugin, links[0].recv, buffer, got, rank);
      });
      if (got != static_cast<int>(size))
        throw CheckError(what + ": test() reported " + std::to_string(got) + " bytes");
      verify(buffer.data(), size, seed, what);
      check_canary(buffer.data() + size, kCanary, what);
      if (!options.quiet)
        std::printf("  %-10zu bytes into a %zu-byte buffer: size %d reported, every byte checked\n",
                    size, buffer.size(), got);
    }
  }
  rank.barrier();
  close_links(plugin, links);
}

// The order a grouped receive's sends come in: which buffer's message each send carries.
// Distinct tags: in order, reversed, shuffled; equal tags (two values over the group): the
// k-th send of a tag fills that tag's k-th buffer, as NCCL's IB transport matches them.
enum class SendOrder { kInOrder, kReversed, kShuffled, kEqualTags };
constexpr std::array<SendOrder, 4> kSendOrders = {SendOrder::kInOrder, SendOrder::kReversed,
                                                  SendOrder::kShuffled, SendOrder::kEqualTags};
const char* order_name(SendOrder order) {
  switch (order) {
    case SendOrder::kInOrder:
      return "in order";
    case SendOrder::kReversed:
      return "reversed";
    case SendOrder::kShuffled:
      return "shuffled";
    case SendOrder::kEqualTags:
      return "equal tags, shuffled";
  }
  return "?";
}

int group_tag(SendOrder order, int n, int i) {
  return order == SendOrder::kEqualTags ? 1000 * n + (i * 5 / 3) % 2 : 1000 * n + 7 * i;
}

// The buffer each send fills: a shuffle of the buffers for distinct tags; for equal tags, the
// first free buffer with the send's tag, for sends whose tags come in a shuffled order.
std::vector<int> send_plan(SendOrder order, int n) {
  std::vector<int> buffers(static_cast<std::size_t>(n));
  std::iota(buffers.begin(), buffers.end(), 0);
  std::mt19937 rng(static_cast<unsigned>(77 * n));
  if (order == SendOrder::kReversed) std::reverse(buffers.begin(), buffers.end());
  if (order == SendOrder::kInOrder || order == SendOrder::kReversed) return buffers;
  std::shuffle(buffers.begin(), buffers.end(), rng);
  if (order == SendOrder::kShuffled) return buffers;
  std::vector<bool> taken(static_cast<std::size_t>(n));
  std::vector<int> plan;
  for (int shuffled : buffers) {
    const int tag = group_tag(order, n, shuffled);
    int i = 0;
    while (taken[static_cast<std::size_t>(i)] || group_tag(order, n, i) != tag) ++i;
    taken[static_cast<std::size_t>(i)] = true;
    plan.push_back(i);
  }
  return plan;
}

// irecv of n = 2..8 buffers against n isends carrying the buffers' tags, posted in every order
// class (send_plan), sizes mixing eager and rendezvous messages, each buffer larger than its
// message: every message in the buffer its tag names.
void grouped_case(Plugin& plugin, Rank& rank, const Options& options) {
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, options.dev, peer, peer);
  ProgressThread progress;
  constexpr std::array<std::size_t, 8> kSizes = {1, 4096, 70000, 0, 300000, 17, 65536, 1 << 20};
  for (int n = 2; n <= 8; ++n) {
    for (SendOrder order : kSendOrders) {
      std::vector<std::unique_ptr<Buffer>> buffers;
      for (int i = 0; i < n; ++i)
        buffers.push_back(std::make_unique<Buffer>(plugin,
                                                   rank.rank() == 0 ? links[0].send : links[0].recv,
                                                   kSizes[static_cast<std::size_t>(i)] + kCanary));
      const int round = n * 8 + static_cast<int>(order);
      auto seed = [&](int i) { return static_cast<std::uint32_t>(100 * round + i); };
      auto tag = [&](int i) { return group_tag(order, n, i); };
      const std::string what =
          "grouped irecv n=" + std::to_string(n) + ", sends " + order_name(order);
      if (rank.rank() == 0) {
        progress.run([&] {
          std::vector<void*> requests;
          for (int i : send_plan(order, n)) {
            fill(buffers[i]->data(), kSizes[i], seed(i));
            buffers[i]->upload();
            requests.push_back(post_send(plugin, links[0].send, buffers[i]->wire(), kSizes[i],
                                         tag(i), buffers[i]->mhandle(), rank));
          }
          for (auto* r : requests) wait_done(plugin, r, nullptr, what + ": isend", rank);
        });
      } else {
        std::array<int, 8> got{};
        progress.run([&] {
          std::array<void*, 8> data{}, mhs{};
          std::array<std::size_t, 8> capacity{};
          std::array<int, 8> tags{};
          std::array<Buffer*, 8> posted{};
          for (int i = 0; i < n; ++i) {
            std::memset(buffers[i]->data(), kCanaryByte, buffers[i]->size());
            buffers[i]->upload();
            posted[i] = buffers[i].get();
            data[i] = buffers[i]->wire();
            capacity[i] = buffers[i]->size();
            tags[i] = tag(i);
            mhs[i] = buffers[i]->mhandle();
          }
          void* request = post_recv(plugin, links[0].recv, n, data.data(), capacity.data(),
                                    tags.data(), mhs.data(), rank);
          wait_done(plugin, request, got.data(), what, rank);
          after_receive(plugin, links[0].recv,
                        std::span<Buffer* const>(posted.data(), static_cast<std::size_t>(n)),
                        got.data(), rank);
        });
        for (int i = 0; i < n; ++i) {
          const std::string where =
              what + ": buffer " + std::to_string(i) + " (tag " + std::to_string(tag(i)) + ")";
          if (got[i] != static_cast<int>(kSizes[i]))
            throw CheckError(where + ": size " + std::to_string(got[i]) + ", sent " +
                             std::to_string(kSizes[i]));
          verify(buffers[i]->data(), kSizes[i], seed(i), where);
          check_canary(buffers[i]->data() + kSizes[i], kCanary, where);
        }
      }
    }
    if (!options.quiet && rank.rank() == 1)
      std::printf(
          "  irecv n=%d: sends in order, reversed, shuffled and with equal tags; sizes "
          "and bytes checked\n",
          n);
  }
  rank.barrier();
  close_links(plugin, links);
}

// 32 requests in flight per comm over 256 messages, then a burst posted without testing until
// the plugin answers with NULL requests (its limit), retried after testing the oldest.
void window_case(Plugin& plugin, Rank& rank, const Options& options) {
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, options.dev, peer, peer);
  ProgressThread progress;
  constexpr std::size_t kMessages = 448;
  constexpr std::size_t kWindow = 32;
  constexpr std::size_t kSize = 4096;
  const bool sender = rank.rank() == 0;
  void* comm = sender ? links[0].send : links[0].recv;
  std::vector<std::unique_ptr<Buffer>> slots;
  for (std::size_t i = 0; i < 256; ++i)
    slots.push_back(std::make_unique<Buffer>(plugin, comm, kSize + 8));
  std::size_t retries = 0;
  std::size_t most_in_flight = 0;
  progress.run([&] {
    std::vector<std::pair<void*, std::size_t>> pending;  // request, message
    auto complete_oldest = [&] {
      int got = -1;
      const auto [request, m] = pending.front();
      wait_done(plugin, request, &got, "message " + std::to_string(m), rank);
      const std::size_t size = kSize - m % 7;
      if (got != static_cast<int>(size))
        throw CheckError("message " + std::to_string(m) + ": size " + std::to_string(got));
      if (!sender) {
        Buffer& slot = *slots[m % slots.size()];
        after_receive(plugin, comm, slot, got, rank);
        verify(slot.data(), size, static_cast<std::uint32_t>(m), "message " + std::to_string(m));
      }
      pending.erase(pending.begin());
    };
    for (std::size_t m = 0; m < kMessages; ++m) {
      const bool burst = m >= 256;
      while (!burst && pending.size() >= kWindow) complete_oldest();
      if (pending.size() >= slots.size()) complete_oldest();
      Buffer& buffer = *slots[m % slots.size()];
      const std::size_t size = kSize - m % 7;
      void* request = nullptr;
      while (request == nullptr) {
        if (sender) {
          fill(buffer.data(), size, static_cast<std::uint32_t>(m));
          buffer.upload();
          check(plugin.isend(comm, buffer.wire(), size, 5, buffer.mhandle(), &request), "isend");
        } else {
          void* data = buffer.wire();
          std::size_t capacity = buffer.size();
          int tag = 5;
          void* mh = buffer.mhandle();
          check(plugin.irecv(comm, 1, &data, &capacity, &tag, &mh, &request), "irecv");
        }
        if (request == nullptr) {  // the plugin's limit: NCCL tests and posts again later
          ++retries;
          if (pending.empty()) throw CheckError("NULL request with nothing in flight");
          complete_oldest();
        }
      }
      pending.emplace_back(request, m);
      most_in_flight = std::max(most_in_flight, pending.size());
    }
    while (!pending.empty()) complete_oldest();
  });
  if (!options.quiet)
    std::printf("  %s: %zu messages, up to %zu in flight, %zu NULL-request retries\n",
                sender ? "sender" : "receiver", kMessages, most_in_flight, retries);
  slots.clear();  // deregister before the comm closes
  rank.barrier();
  close_links(plugin, links);
}

// 8192 bytes sent into a 4096-byte buffer: the receive must fail, not deliver 4096 bytes.
void truncation_case(Plugin& plugin, Rank& rank, const Options& options) {
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, options.dev, peer, peer);
  ProgressThread progress;
  constexpr std::size_t kMessage = 8192, kBuffer = 4096;
  if (rank.rank() == 0) {
    Buffer buffer(plugin, links[0].send, kMessage);
    fill(buffer.data(), kMessage, 9);
    buffer.upload();
    abi::Result result = abi::kSuccess;
    progress.run([&] {
      void* request =
          post_send(plugin, links[0].send, buffer.wire(), kMessage, 3, buffer.mhandle(), rank);
      result = wait_result(plugin, request, nullptr, "isend of the oversized message", rank);
    });
    if (!options.quiet) std::printf("  sender: %s\n", result_name(result));
  } else {
    Buffer buffer(plugin, links[0].recv, kBuffer);
    std::memset(buffer.data(), kCanaryByte, kBuffer);
    buffer.upload();
    int got = -1;
    abi::Result result = abi::kSuccess;
    progress.run([&] {
      void* data = buffer.wire();
      std::size_t capacity = kBuffer;
      int tag = 3;
      void* mh = buffer.mhandle();
      void* request = post_recv(plugin, links[0].recv, 1, &data, &capacity, &tag, &mh, rank);
      result = wait_result(plugin, request, &got, "irecv into the small buffer", rank);
    });
    if (result == abi::kSuccess)
      throw CheckError("an 8192-byte message into a 4096-byte buffer completed (size " +
                       std::to_string(got) + "): a truncation, not an error");
    buffer.download();  // a failed receive is not flushed: nothing of it is to be read
    bool untouched = true;
    for (std::size_t i = 0; i < kBuffer; ++i)
      untouched = untouched && buffer.data()[i] == kCanaryByte;
    if (!options.quiet)
      std::printf("  receiver: %s; buffer %s\n", result_name(result),
                  untouched ? "untouched" : "partly written");
  }
  rank.barrier();
  close_links(plugin, links);
}

// How long the idle-peer case keeps a rank away from the plugin: 3 x LOOM_PEER_TIMEOUT_MS where
// it is set (loom's peer timeout), else 3 s.
std::chrono::milliseconds idle_time() {
  const char* timeout = std::getenv("LOOM_PEER_TIMEOUT_MS");
  const long ms = timeout != nullptr ? std::strtol(timeout, nullptr, 10) : 0;
  return std::chrono::milliseconds(ms > 0 ? 3 * ms : 3000);
}

// A rank whose NCCL calls nothing on a connection for a while (an idle rank of a job) is not a
// dead peer: each side in turn posts a 1 MiB message and waits while the other calls nothing of
// the plugin for idle_time(); both requests must complete, every byte checked.
void idle_peer_case(Plugin& plugin, Rank& rank, const Options& options) {
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, options.dev, peer, peer);
  ProgressThread progress;
  constexpr std::size_t kSize = 1 << 20;
  const bool sender = rank.rank() == 0;
  const auto idle = idle_time();
  for (int idler = 0; idler < 2; ++idler) {
    const std::string what = std::string(idler == 0 ? "the sender" : "the receiver") + " idle " +
                             std::to_string(idle.count()) + " ms";
    Buffer buffer(plugin, sender ? links[0].send : links[0].recv, kSize);
    const auto seed = static_cast<std::uint32_t>(600 + idler);
    if (sender) fill(buffer.data(), kSize, seed);
    if (!sender) std::memset(buffer.data(), kCanaryByte, kSize);
    buffer.upload();
    if (rank.rank() == idler) std::this_thread::sleep_for(idle);  // nothing of the plugin
    int got = -1;
    progress.run([&] {
      void* data = buffer.wire();
      void* mh = buffer.mhandle();
      if (sender) {
        void* request = post_send(plugin, links[0].send, data, kSize, 5, mh, rank);
        wait_done(plugin, request, nullptr, what + ": isend", rank);
      } else {
        std::size_t capacity = kSize;
        int tag = 5;
        void* request = post_recv(plugin, links[0].recv, 1, &data, &capacity, &tag, &mh, rank);
        wait_done(plugin, request, &got, what + ": irecv", rank);
        after_receive(plugin, links[0].recv, buffer, got, rank);
      }
    });
    if (!sender) {
      if (got != static_cast<int>(kSize))
        throw CheckError(what + ": size " + std::to_string(got) + " reported");
      verify(buffer.data(), kSize, seed, what);
      if (!options.quiet) std::printf("  %s: the other side's request completed\n", what.c_str());
    }
    rank.barrier();
  }
  close_links(plugin, links);
}

// What a plugin must refuse with an error result (ncclInvalidArgument or ncclSystemError) and
// a WARN line of its own saying why, never a crash nor a registration: an unknown memory type,
// host memory claimed as NCCL_PTR_CUDA, regMrDmaBuf with a negative fd, with an fd that is not
// open, through a descriptor that is no dmabuf, of NCCL_PTR_HOST memory. The comm still
// registers and transfers afterwards.
void reg_args_case(Plugin& plugin, Rank& rank, const Options& options) {
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, options.dev, peer, peer);
  void* comm = rank.rank() == 0 ? links[0].send : links[0].recv;
  std::vector<std::uint8_t> host(4096);
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) throw CheckError(std::string("open /dev/null: ") + std::strerror(errno));
  constexpr int kNotOpen = 1 << 20;  // above any descriptor limit: never an open one
  struct Refusal {
    std::string what;
    std::function<abi::Result(void**)> call;
  };
  const auto reg = [&](int type) {
    return [&, type](void** mh) { return plugin.reg_mr(comm, host.data(), host.size(), type, mh); };
  };
  const auto reg_dmabuf = [&](int type, int fd) {
    return [&, type, fd](void** mh) {
      return plugin.reg_mr_dmabuf(comm, host.data(), host.size(), type, 0, fd, mh);
    };
  };
  const std::vector<Refusal> refusals = {
      {"regMr of memory type 0x40 (none of NCCL's)", reg(0x40)},
      {"regMr of host memory as NCCL_PTR_CUDA", reg(abi::kPtrCuda)},
      {"regMrDmaBuf with fd -5", reg_dmabuf(abi::kPtrCuda, -5)},
      {"regMrDmaBuf with an fd that is not open", reg_dmabuf(abi::kPtrCuda, kNotOpen)},
      {"regMrDmaBuf of host memory through /dev/null", reg_dmabuf(abi::kPtrCuda, devnull)},
      {"regMrDmaBuf of NCCL_PTR_HOST memory", reg_dmabuf(abi::kPtrHost, devnull)},
  };
  std::string failure;
  for (const Refusal& r : refusals) {
    const std::size_t mark = log_mark();
    void* mh = nullptr;
    const abi::Result result = r.call(&mh);
    std::string warning;
    for (const LogLine& line : log_since(mark))
      if (line.level == abi::kLogWarn) warning = line.text;
    if (result == abi::kSuccess) {
      plugin.dereg_mr(comm, mh);
      failure = r.what + ": accepted";
    } else if (result != abi::kInvalidArgument && result != abi::kSystemError) {
      failure = r.what + ": " + result_name(result) + " (ncclInvalidArgument or ncclSystemError)";
    } else if (warning.empty()) {
      failure = r.what + ": " + result_name(result) + " without a WARN line saying why";
    }
    if (!failure.empty()) break;
    if (!options.quiet && rank.rank() == 0)
      std::printf("  %s: %s: %s\n", r.what.c_str(), result_name(result), warning.c_str());
  }
  ::close(devnull);
  if (!failure.empty()) throw CheckError(failure);
  // The refusals changed nothing: a registration and a transfer still work.
  ProgressThread progress;
  constexpr std::size_t kSize = 65536;
  Buffer buffer(plugin, comm, kSize);
  progress.run([&] {
    if (rank.rank() == 0) {
      fill(buffer.data(), kSize, 41);
      buffer.upload();
      void* request = post_send(plugin, comm, buffer.wire(), kSize, 4, buffer.mhandle(), rank);
      wait_done(plugin, request, nullptr, "isend after the refusals", rank);
    } else {
      void* data = buffer.wire();
      std::size_t capacity = kSize;
      int tag = 4;
      void* mh = buffer.mhandle();
      int got = -1;
      void* request = post_recv(plugin, comm, 1, &data, &capacity, &tag, &mh, rank);
      wait_done(plugin, request, &got, "irecv after the refusals", rank);
      after_receive(plugin, comm, buffer, got, rank);
      verify(buffer.data(), kSize, 41, "the message after the refusals");
    }
  });
  rank.barrier();
  buffer.deregister();
  close_links(plugin, links);
}

}  // namespace

std::vector<Case> single_comm_cases() {
  return {
      {"sizes", 2, "sizes 0..64 MiB+3 into larger buffers, every byte and size checked",
       sizes_case},
      {"grouped", 2, "irecv of n = 2..8 buffers against n tagged isends in any order",
       grouped_case},
      {"idle-peer", 2, "each side waits while the other calls nothing for 3 x the peer timeout",
       idle_peer_case},
      {"window", 2, "32 requests in flight, then a burst to the NULL-request limit", window_case},
      {"truncation", 2, "a message larger than its receive buffer is an error", truncation_case},
      {"reg-args", 2, "bad regMr/regMrDmaBuf arguments refused with an error and a WARN line",
       reg_args_case},
  };
}

}  // namespace ncclnet
