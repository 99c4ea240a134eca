// Cases with several communicators or plugin loads: a ring of 4 processes, 32 comms to one
// peer driven by 4 progress threads at once, close with requests in flight, several accepts
// on one listen comm, dlopen/dlclose cycles.
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <dirent.h>
#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include "ncclnet_cases.hpp"

namespace ncclnet {
// GCC defines __SANITIZE_ADDRESS__; clang answers __has_feature (which GCC 12's preprocessor
// cannot even parse behind a defined() test, hence the nesting).
#if defined(__SANITIZE_ADDRESS__)
#define LOOM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_ASAN 1
#endif
#endif
#ifdef LOOM_ASAN
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

namespace {

// One verified message each way on a link (sizes chosen by the caller).
void exchange(Plugin& plugin, Rank& rank, Link& link, std::size_t size, std::uint32_t send_seed,
              std::uint32_t recv_seed, const std::string& what) {
  Buffer out(plugin, link.send, size);
  Buffer in(plugin, link.recv, size);
  fill(out.data(), size, send_seed);
  out.upload();
  void* data = in.wire();
  std::size_t capacity = in.size();
  int tag = 1;
  void* mh = in.mhandle();
  void* recv = post_recv(plugin, link.recv, 1, &data, &capacity, &tag, &mh, rank);
  void* send = post_send(plugin, link.send, out.wire(), size, 1, out.mhandle(), rank);
  int got = -1;
  wait_done(plugin, send, nullptr, what + " isend", rank);
  wait_done(plugin, recv, &got, what + " irecv", rank);
  after_receive(plugin, link.recv, in, got, rank);
  if (got != static_cast<int>(size))
    throw CheckError(what + ": size " + std::to_string(got) + ", expected " + std::to_string(size));
  verify(in.data(), size, recv_seed, what);
}

// listen, give the handle to the previous rank, connect to the next, accept from the previous.
void ring_case(Plugin& plugin, Rank& rank, const Options& options) {
  const int next = (rank.rank() + 1) % rank.size();
  const int prev = (rank.rank() + rank.size() - 1) % rank.size();
  auto links = establish(plugin, rank, options.dev, next, prev);
  ProgressThread progress;
  // Sends go to `next`, receives come from `prev`: the seeds name the sender.
  const std::array<std::size_t, 3> sizes = {4096, 1 << 20, 0};
  progress.run([&] {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Buffer out(plugin, links[0].send, sizes[i]);
      Buffer in(plugin, links[0].recv, sizes[i] + 16);
      fill(out.data(), sizes[i], static_cast<std::uint32_t>(rank.rank() * 10 + i));
      out.upload();
      void* data = in.wire();
      std::size_t capacity = in.size();
      int tag = static_cast<int>(i);
      void* mh = in.mhandle();
      void* recv = post_recv(plugin, links[0].recv, 1, &data, &capacity, &tag, &mh, rank);
      void* send = post_send(plugin, links[0].send, out.wire(), sizes[i], tag, out.mhandle(), rank);
      int got = -1;
      wait_done(plugin, send, nullptr, "ring isend", rank);
      wait_done(plugin, recv, &got, "ring irecv", rank);
      after_receive(plugin, links[0].recv, in, got, rank);
      const std::string what =
          "ring message " + std::to_string(i) + " from rank " + std::to_string(prev);
      if (got != static_cast<int>(sizes[i]))
        throw CheckError(what + ": size " + std::to_string(got));
      verify(in.data(), sizes[i], static_cast<std::uint32_t>(prev * 10 + i), what);
    }
  });
  if (!options.quiet && rank.rank() == 0)
    std::printf("  4 ranks: each sent to the next and checked the previous\n");
  rank.barrier();
  close_links(plugin, links);
}

// 32 comms each way to one peer, set up at once, then 4 progress threads each driving 8 of
// them concurrently (several communicators' threads inside the plugin at the same time).
void comms32_case(Plugin& plugin, Rank& rank, const Options& options) {
  constexpr int kComms = 32, kThreads = 4, kMessages = 4;
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, options.dev, peer, peer, kComms);
  std::array<ProgressThread, kThreads> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads[t].start([&, t] {
      for (int c = t; c < kComms; c += kThreads)
        for (int m = 0; m < kMessages; ++m) {
          const std::size_t size =
              65536 + 1000 * static_cast<std::size_t>(c) + static_cast<std::size_t>(m);
          const auto mine = static_cast<std::uint32_t>(rank.rank() * 100000 + c * 100 + m);
          const auto theirs = static_cast<std::uint32_t>(peer * 100000 + c * 100 + m);
          exchange(plugin, rank, links[static_cast<std::size_t>(c)], size, mine, theirs,
                   "comm " + std::to_string(c) + " message " + std::to_string(m));
        }
    });
  }
  // Meanwhile the service thread registers and deregisters on the same comms, as NCCL does
  // for user buffers while their channels carry traffic.
  std::vector<std::uint8_t> extra(1 << 16);
  for (int round = 0; round < 4; ++round)
    for (auto& link : links) {
      Buffer a(plugin, link.send, 0);
      Buffer b(plugin, link.recv, 0);
      void* mh = nullptr;
      check(plugin.reg_mr(link.recv, extra.data(), extra.size(), &mh), "regMr beside traffic");
      check(plugin.dereg_mr(link.recv, mh), "deregMr beside traffic");
    }
  for (auto& t : threads) t.join();
  if (!options.quiet && rank.rank() == 0)
    std::printf(
        "  %d comms each way, %d progress threads, %d verified messages per comm and direction\n",
        kComms, kThreads, kMessages);
  rank.barrier();
  close_links(plugin, links);
}

// Receives that nothing will match and large sends in flight, then close: no crash, no hang,
// and the plugin still connects and transfers afterwards.
void close_inflight_case(Plugin& plugin, Rank& rank, const Options& options) {
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, options.dev, peer, peer);
  {
    ProgressThread progress;
    Buffer big(plugin, links[0].send, 4 << 20);
    Buffer sink(plugin, links[0].recv, 1 << 20);
    progress.run([&] {
      for (int i = 0; i < 6; ++i) {
        void* data = sink.wire();
        std::size_t capacity = sink.size();
        int tag = 2;
        void* mh = sink.mhandle();
        post_recv(plugin, links[0].recv, 1, &data, &capacity, &tag, &mh, rank);
      }
      if (rank.rank() == 0)
        for (int i = 0; i < 4; ++i)
          post_send(plugin, links[0].send, big.wire(), i % 2 ? 1024 : big.size(), 9, big.mhandle(),
                    rank);
    });
    // Both posted before either closes: an irecv posted after its peer closed is refused (the
    // plugin says "the peer closed the communicator"), which a loaded machine once made happen.
    rank.barrier();
    big.deregister();  // as NCCL's teardown does: deregister, then close
    sink.deregister();
    close_links(plugin, links);  // with every request above still pending
  }
  rank.barrier();
  auto again = establish(plugin, rank, options.dev, peer, peer);
  ProgressThread progress;
  progress.run(
      [&] { exchange(plugin, rank, again[0], 65536, rank.rank() + 1u, peer + 1u, "after close"); });
  if (!options.quiet && rank.rank() == 0)
    std::printf("  closed with receives and sends in flight; a new comm then worked\n");
  rank.barrier();
  close_links(plugin, again);
}

// Rank 1 connects 3 times to one listen comm of rank 0, which accepts 3 times; each message
// says which connect it came through.
void multi_accept_case(Plugin& plugin, Rank& rank, const Options& options) {
  constexpr int kConnects = 3;
  ProgressThread progress;
  if (rank.rank() == 0) {
    std::array<std::uint8_t, abi::kHandleMaxBytes> handle{};
    void* listen = nullptr;
    check(plugin.listen(options.dev, handle.data(), &listen), "listen");
    rank.send(1, handle.data(), handle.size());
    std::vector<void*> comms;
    while (static_cast<int>(comms.size()) < kConnects) {
      void* comm = nullptr;
      check(plugin.accept(listen, &comm), "accept");
      if (comm != nullptr) comms.push_back(comm);
      rank.keep_waiting("accept " + std::to_string(comms.size() + 1));
    }
    std::array<bool, kConnects> seen{};
    progress.run([&] {
      for (void* comm : comms) {
        Buffer in(plugin, comm, 4096);
        void* data = in.wire();
        std::size_t capacity = in.size();
        int tag = 1;
        void* mh = in.mhandle();
        int got = -1;
        void* request = post_recv(plugin, comm, 1, &data, &capacity, &tag, &mh, rank);
        wait_done(plugin, request, &got, "irecv on an accepted comm", rank);
        after_receive(plugin, comm, in, got, rank);
        const int which = got - 1000;
        if (which < 0 || which >= kConnects || seen[which])
          throw CheckError("accepted comm delivered " + std::to_string(got) + " bytes");
        seen[which] = true;
        verify(in.data(), static_cast<std::size_t>(got), static_cast<std::uint32_t>(which),
               "connect " + std::to_string(which));
      }
    });
    rank.barrier();  // as NCCL: nobody closes before every peer received
    for (void* comm : comms) check(plugin.close_recv(comm), "closeRecv");
    check(plugin.close_listen(listen), "closeListen");
    if (!options.quiet)
      std::printf("  %d accepts on one listen comm, each comm its own peer connect\n", kConnects);
  } else {
    std::array<std::uint8_t, abi::kHandleMaxBytes> received{};
    rank.recv(0, received.data(), received.size());
    std::array<std::array<std::uint8_t, abi::kHandleMaxBytes>, kConnects> handles{};
    std::array<void*, kConnects> comms{};
    int up = 0;
    for (auto& h : handles) h = received;
    while (up < kConnects) {
      for (int i = 0; i < kConnects; ++i)
        if (comms[i] == nullptr) {
          check(plugin.connect(options.dev, handles[i].data(), &comms[i]), "connect");
          if (comms[i] != nullptr) ++up;
        }
      rank.keep_waiting("connects");
    }
    progress.run([&] {
      for (int i = 0; i < kConnects; ++i) {
        const std::size_t size = 1000 + static_cast<std::size_t>(i);
        Buffer out(plugin, comms[i], size);
        fill(out.data(), size, static_cast<std::uint32_t>(i));
        out.upload();
        void* request = post_send(plugin, comms[i], out.wire(), size, 1, out.mhandle(), rank);
        wait_done(plugin, request, nullptr, "isend", rank);
      }
    });
    rank.barrier();
    for (void* comm : comms) check(plugin.close_send(comm), "closeSend");
  }
}

// v9+: makeVDevice fusing device `dev` (every device, up to vProps' room: 4, or 8 in v12), then
// a transfer over the virtual device; its properties must list the fused devices.
void vdevice_case(Plugin& plugin, Rank& rank, const Options& options) {
  if (plugin.version() < 9) {
    if (!options.quiet && rank.rank() == 0)
      std::printf("  skipped: ncclNet v%d has no makeVDevice\n", plugin.version());
    return;
  }
  std::vector<int> devs;
  const int n = plugin.devices();
  for (int d = 0; d < n && devs.size() < plugin.vdevice_capacity(); ++d) devs.push_back(d);
  const int vdev = plugin.make_vdevice(devs);
  const DeviceProps props = plugin.properties(vdev);
  if (props.vdevs.size() != devs.size())
    throw CheckError("virtual device " + std::to_string(vdev) + " lists " +
                     std::to_string(props.vdevs.size()) + " devices, fused " +
                     std::to_string(devs.size()));
  const int peer = 1 - rank.rank();
  auto links = establish(plugin, rank, vdev, peer, peer);
  ProgressThread progress;
  progress.run([&] {
    exchange(plugin, rank, links[0], 1 << 20, rank.rank() + 7u, peer + 7u, "virtual device");
  });
  if (!options.quiet && rank.rank() == 0)
    std::printf("  device %d fuses %zu device(s) (%s); 1 MiB each way checked\n", vdev, devs.size(),
                props.name.c_str());
  rank.barrier();
  close_links(plugin, links);
}

std::size_t count_entries(const char* dir) {
  std::size_t n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

// Resident memory once the allocator gave back what it caches (a leak stays resident).
std::size_t rss_kib() {
  ::malloc_trim(0);
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) / 1024;
}

// load -> init -> connect -> transfer -> close -> dlclose, `cycles` times in one process.
void cycles_case(Rank& rank, const Options& options) {
  const int peer = 1 - rank.rank();
  ProgressThread progress;
  std::size_t threads0 = 0, fds0 = 0, rss0 = 0;
  bool unloaded = true;
  constexpr int kWarm = 3;
  // A fixed mmap threshold: glibc's own rises with the first large block freed, after which a
  // block that size comes from the freeing thread's heap, whose freed top malloc_trim leaves
  // resident. In the default build that kept ~16 MiB (one 18 MiB heap of a thread arena) from
  // some cycle on, 3 runs of 3: a step, not growth (8.4 -> 8.6 MiB over 50 cycles with it).
  ::mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  for (int c = 0; c < options.cycles; ++c) {
    {
      Plugin plugin(options.plugin, options.version);
      plugin.init();
      prepare_memory(plugin, options.dev);
      auto links = establish(plugin, rank, options.dev, peer, peer);
      progress.run([&] {
        exchange(plugin, rank, links[0], 65536 + static_cast<std::size_t>(c),
                 rank.rank() * 1000u + c, peer * 1000u + c, "cycle " + std::to_string(c));
      });
      rank.barrier();
      // Odd cycles finalize (v11) before closing: the plugin must keep what open comms use.
      if (c % 2 == 1) plugin.finalize();
      close_links(plugin, links);
    }
    unloaded = unloaded && ::dlopen(options.plugin.c_str(), RTLD_NOW | RTLD_NOLOAD) == nullptr;
    if (c + 1 == kWarm) {
      threads0 = count_entries("/proc/self/task");
      fds0 = count_entries("/proc/self/fd");
      rss0 = rss_kib();
    }
  }
  const std::size_t threads = count_entries("/proc/self/task"),
                    fds = count_entries("/proc/self/fd");
  const std::size_t rss = rss_kib();
  if (!options.quiet)
    std::printf(
        "  rank %d: %d cycles; after cycle %d -> end: threads %zu -> %zu, fds %zu -> %zu, "
        "RSS %zu -> %zu KiB; plugin %s after dlclose\n",
        rank.rank(), options.cycles, kWarm, threads0, threads, fds0, fds, rss0, rss,
        unloaded ? "unloaded" : "still mapped");
  if (options.cycles > kWarm) {
    if (threads > threads0)
      throw CheckError("threads grew from " + std::to_string(threads0) + " to " +
                       std::to_string(threads));
    if (fds > fds0)
      throw CheckError("fds grew from " + std::to_string(fds0) + " to " + std::to_string(fds));
    constexpr std::size_t kRssSlackKiB = kAddressSanitizer ? 256 * 1024  // its quarantine
                                                           : 16 * 1024;
    if (rss > rss0 + kRssSlackKiB)
      throw CheckError("RSS grew from " + std::to_string(rss0) + " to " + std::to_string(rss) +
                       " KiB");
  }
}

}  // namespace

std::vector<Case> multi_comm_cases() {
  return {
      {"ring4", 4, "ring of 4 processes: listen, connect to next, accept from previous", ring_case},
      {"comms32", 2, "32 comms each way to one peer, 4 progress threads at once, regMr beside them",
       comms32_case},
      {"close-inflight", 2, "close with requests in flight, then connect again",
       close_inflight_case},
      {"vdevice", 2, "makeVDevice (v9+) and a transfer over the virtual device", vdevice_case},
      {"multi-accept", 2, "3 accepts on one listen comm", multi_accept_case},
      {"cycles", 2, "dlopen -> init -> connect -> transfer -> close -> dlclose cycles", nullptr,
       cycles_case},
  };
}

}  // namespace ncclnet
