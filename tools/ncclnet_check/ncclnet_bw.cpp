// ncclnet_check's bandwidth mode: fabtests' bandwidth loop through a plugin. Rank 0 (client)
// sends a window of messages and waits for rank 1's 4-byte ack; rank 1 keeps the next
// window's receives posted while one arrives (as fi_p2p_bw's server does), so the two tools
// measure the same exchange. Every message of a window goes from one buffer into one buffer,
// 2 MiB-aligned and advised MADV_HUGEPAGE, as fi_p2p_bw's.
#include "ncclnet_bw.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <span>

#include <nlohmann/json.hpp>
#include <sched.h>
#include <sys/mman.h>

#include "ncclnet_cases.hpp"
#include "ncclnet_cuda.hpp"

namespace ncclnet {
namespace {

constexpr std::size_t kHuge = 2u << 20;
const std::string kSendWait = "bw isend", kRecvWait = "bw irecv", kAckWait = "bw ack";

// An anonymous 2 MiB-aligned mapping.
class HugeBuffer {
 public:
  explicit HugeBuffer(std::size_t size)
      : size_((std::max<std::size_t>(size, 1) + kHuge - 1) / kHuge * kHuge) {
    void* p =
        ::mmap(nullptr, size_ + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw CheckError("mmap of " + std::to_string(size_) + " bytes failed");
    base_ = p;
    data_ = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) /
                                            kHuge * kHuge);
    ::madvise(data_, size_, MADV_HUGEPAGE);
    std::fill(data_, data_ + size_, std::uint8_t{0x5A});
  }
  ~HugeBuffer() { ::munmap(base_, size_ + kHuge); }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  [[nodiscard]] std::uint8_t* data() const noexcept { return data_; }

 private:
  std::size_t size_;
  void* base_ = nullptr;
  std::uint8_t* data_ = nullptr;
};

std::string size_text(std::size_t size) {
  if (size >= (1u << 20) && size % (1u << 20) == 0) return std::to_string(size >> 20) + "m";
  if (size >= 1024 && size % 1024 == 0) return std::to_string(size >> 10) + "k";
  return std::to_string(size);
}

struct Row {
  std::size_t size = 0;
  std::size_t iterations = 0;
  double seconds = 0;
};

class Mr {
 public:
  Mr(Plugin& plugin, void* comm, void* data, std::size_t size) : plugin_(plugin), comm_(comm) {
    check(plugin_.reg_mr(comm, data, size, &mhandle_), "regMr");
  }
  ~Mr() { plugin_.dereg_mr(comm_, mhandle_); }
  Mr(const Mr&) = delete;
  Mr& operator=(const Mr&) = delete;
  [[nodiscard]] void* get() const noexcept { return mhandle_; }

 private:
  Plugin& plugin_;
  void* comm_;
  void* mhandle_ = nullptr;
};

// The buffer messages go from and into: fi_p2p_bw's 2 MiB-aligned host mapping, or GPU memory
// (--device cuda, a Buffer registered as the cases' are). The 4-byte acks stay in host memory.
class DataBuffer {
 public:
  DataBuffer(Plugin& plugin, void* comm, std::size_t size) {
    if (memory().separate()) {
      gpu_ = std::make_unique<Buffer>(plugin, comm, size);
    } else {
      host_ = std::make_unique<HugeBuffer>(size);
      mr_ = std::make_unique<Mr>(plugin, comm, host_->data(), size);
    }
  }
  [[nodiscard]] void* data() const noexcept { return gpu_ ? gpu_->wire() : host_->data(); }
  [[nodiscard]] void* mhandle() const noexcept { return gpu_ ? gpu_->mhandle() : mr_->get(); }
  // GPU memory: each receive is flushed, as NCCL flushes GPU memory it received into.
  void flush(Plugin& plugin, void* comm, std::size_t size, Rank& rank) {
    if (!gpu_) return;
    Buffer* one = gpu_.get();
    const int sizes[] = {static_cast<int>(size)};
    flush_received(plugin, comm, std::span<Buffer* const>(&one, 1), sizes, rank);
  }

 private:
  std::unique_ptr<Buffer> gpu_;
  std::unique_ptr<HugeBuffer> host_;
  std::unique_ptr<Mr> mr_;  // declared after host_: deregistered before it is unmapped
};

void client(Plugin& plugin, Rank& rank, Link& link, const BwOptions& o, std::vector<Row>& rows) {
  const std::size_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  DataBuffer buffer(plugin, link.send, largest);
  HugeBuffer ack(4096);
  Mr ack_mr(plugin, link.recv, ack.data(), 4096);
  ProgressThread progress;
  for (const std::size_t size : o.sizes) {
    const std::size_t iterations = o.iterations > 0 ? o.iterations : default_iterations(size);
    Row row{size, iterations, 0};
    progress.run([&] {
      // As fi_p2p_bw: the ack's receive is posted first and waited for last.
      std::array<void*, 1024> requests{};
      auto window = [&](std::size_t count) {
        void* data = ack.data();
        std::size_t capacity = 4;
        int tag = 2;
        void* mh = ack_mr.get();
        void* ack_request = post_recv(plugin, link.recv, 1, &data, &capacity, &tag, &mh, rank);
        for (std::size_t i = 0; i < count; ++i)
          requests[i] =
              post_send(plugin, link.send, buffer.data(), size, 1, buffer.mhandle(), rank);
        for (std::size_t i = 0; i < count; ++i)
          wait_done(plugin, requests[i], nullptr, kSendWait, rank);
        wait_done(plugin, ack_request, nullptr, kAckWait, rank);
      };
      for (std::size_t done = 0; done < o.warmup;) {
        const std::size_t n = std::min(o.window, o.warmup - done);
        window(n);
        done += n;
      }
      const auto start = Clock::now();
      for (std::size_t done = 0; done < iterations;) {
        const std::size_t n = std::min(o.window, iterations - done);
        window(n);
        done += n;
      }
      row.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    });
    rows.push_back(row);
    const double bytes = static_cast<double>(size) * static_cast<double>(iterations);
    const double us = row.seconds * 1e6;
    std::printf("%-8s %-8zu %-10s %-9.2f %-10.2f %-10.2f %-11.3f\n", size_text(size).c_str(),
                iterations, size_text(static_cast<std::size_t>(bytes)).c_str(), row.seconds,
                bytes / row.seconds / 1e6, us / static_cast<double>(iterations),
                static_cast<double>(iterations) / us);
    std::fflush(stdout);
  }
}

void server(Plugin& plugin, Rank& rank, Link& link, const BwOptions& o) {
  const std::size_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  DataBuffer buffer(plugin, link.recv, largest);
  HugeBuffer ack(4096);
  Mr ack_mr(plugin, link.send, ack.data(), 4096);
  ProgressThread progress;
  // Two windows posted at once unless that exceeds the requests a comm may hold.
  const std::size_t ahead = 2 * o.window <= 128 ? 2 : 1;
  for (const std::size_t size : o.sizes) {
    const std::size_t iterations = o.iterations > 0 ? o.iterations : default_iterations(size);
    progress.run([&] {
      std::deque<std::size_t> windows;  // message count of each window, posted in order
      for (std::size_t left = o.warmup; left > 0;) {
        windows.push_back(std::min(o.window, left));
        left -= windows.back();
      }
      for (std::size_t left = iterations; left > 0;) {
        windows.push_back(std::min(o.window, left));
        left -= windows.back();
      }
      std::deque<std::vector<void*>> posted;
      std::size_t next = 0;
      auto post = [&] {
        std::vector<void*> requests;
        for (std::size_t i = 0; i < windows[next]; ++i) {
          void* data = buffer.data();
          std::size_t capacity = size;
          int tag = 1;
          void* mh = buffer.mhandle();
          requests.push_back(post_recv(plugin, link.recv, 1, &data, &capacity, &tag, &mh, rank));
        }
        posted.push_back(std::move(requests));
        ++next;
      };
      while (next < windows.size() && posted.size() < ahead) post();
      // As fi_p2p_bw: wait for a window, ack it, then post the one after the next.
      while (!posted.empty()) {
        for (void* r : posted.front()) {
          wait_done(plugin, r, nullptr, kRecvWait, rank);
          buffer.flush(plugin, link.recv, size, rank);
        }
        posted.pop_front();
        void* request = post_send(plugin, link.send, ack.data(), 4, 2, ack_mr.get(), rank);
        wait_done(plugin, request, nullptr, kAckWait, rank);
        while (next < windows.size() && posted.size() < ahead) post();
      }
    });
  }
}

}  // namespace

std::size_t default_iterations(std::size_t size) {
  if (size < (64u << 10)) return 20000;
  if (size < (1u << 20)) return 2000;
  return 200;
}

std::string run_bandwidth(const BwOptions& o) {
  std::printf("# ncclnet_check bw: plugin %s, window %zu, warmup %zu\n", o.plugin.c_str(), o.window,
              o.warmup);
  std::printf("%-8s %-8s %-10s %-9s %-10s %-10s %-11s\n", "bytes", "iters", "total", "time",
              "MB/sec", "usec/xfer", "Mxfers/sec");
  std::fflush(stdout);
  return run_ranks("bw", 2, o.timeout, [&](Rank& rank) {
    const std::size_t pin = rank.rank() == 1 ? 0 : 1;
    if (pin < o.pin.size()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(o.pin[pin], &set);
      ::sched_setaffinity(0, sizeof(set), &set);
    }
    Plugin plugin(o.plugin, o.version);
    plugin.init();
    prepare_memory(plugin, o.dev);
    const int peer = 1 - rank.rank();
    auto links = establish(plugin, rank, o.dev, peer, peer);
    std::vector<Row> rows;
    if (rank.rank() == 0)
      client(plugin, rank, links[0], o, rows);
    else
      server(plugin, rank, links[0], o);
    rank.barrier();
    close_links(plugin, links);
    if (rank.rank() != 0 || o.json.empty()) return;
    nlohmann::json records = nlohmann::json::array();
    for (const Row& r : rows) {
      const double bytes = static_cast<double>(r.size) * static_cast<double>(r.iterations);
      const double us = r.seconds * 1e6;
      records.push_back({{"bytes", r.size},
                         {"iterations", r.iterations},
                         {"total_bytes", static_cast<std::uint64_t>(bytes)},
                         {"seconds", r.seconds},
                         {"mb_per_sec", bytes / r.seconds / 1e6},
                         {"usec_per_xfer", us / static_cast<double>(r.iterations)},
                         {"mxfers_per_sec", static_cast<double>(r.iterations) / us},
                         {"gb_per_sec", bytes / r.seconds / 1e9}});
    }
    nlohmann::json document = {{"tool", "ncclnet_check"},
                               {"config",
                                {{"plugin", o.plugin},
                                 {"plugin_name", plugin.name()},
                                 {"ncclnet_version", plugin.version()},
                                 {"window", o.window},
                                 {"warmup", o.warmup}}},
                               {"results", records}};
    std::ofstream out(o.json);
    if (!out) throw CheckError("cannot write " + o.json);
    out << document.dump(2) << "\n";
  });
}

}  // namespace ncclnet
