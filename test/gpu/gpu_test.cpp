// Device memory end to end, on one GPU shared by two processes: CUDA buffers over the p2p API
// (every byte verified through the driver), iflush through every data rail, registration by
// dmabuf where libfabric, the driver and the GPU allow it, and the errors for memory registered
// as what it is not. Every case runs in fresh processes (gpu_support.hpp); failures inside them
// use require(), which the parent reports.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <catch2/catch.hpp>

#include "gpu/gpu_support.hpp"
#include "loom/error.hpp"
#include "ofi/memory_registration.hpp"
#include "ofi/mr_attributes.hpp"
#include "ofi/nic.hpp"
#include "ofi/rail_set.hpp"
#include "ofi/selection.hpp"
#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"
#include "support/rails.hpp"
#include "util/cuda_driver.hpp"

namespace loom::test {
namespace {

constexpr std::size_t kSizes[] = {
    0, 1, 4095, 16384, 65537, std::size_t{1} << 20, (std::size_t{16} << 20) + 3};
constexpr std::size_t kLargest = (std::size_t{16} << 20) + 3;

std::vector<std::byte> pattern_bytes(std::size_t size, std::uint64_t seed) {
  std::vector<std::byte> bytes(size);
  fill_pattern(bytes, seed);
  return bytes;
}

void expect_error(const std::function<void()>& action, const std::string& text) {
  try {
    action();
  } catch (const Error& e) {
    const std::string what = e.what();
    require(what.find(text) != std::string::npos,
            "expected an error saying \"" + text + "\", got: " + what);
    std::printf("refused as expected: %s\n", what.c_str());
    return;
  }
  throw Failure("expected an error saying \"" + text + "\", but it succeeded");
}

// Whether the provider under test takes device memory, asked in a child process (it opens the
// fabric, which may initialize CUDA inside libfabric). Where it does not (libfabric's tcp has
// no FI_HMEM in any version up to 2.6), the child checks that registering CUDA memory fails
// naming why, and the reason comes back: the case then reports the provider as unsupported.
std::string device_memory_refused() {
  if (host_mode()) return {};
  std::string refusal;
  const std::string failure = run_pair(
      [&](Channel& channel) {
        const auto bytes = channel.recv_bytes();
        refusal.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      [](Channel& channel) {
        TestFabric fabric(1, 1);
        std::string note;
        if (!fabric.nic().device_memory) {
          note = fabric.nic().provider + ": " + fabric.nic().device_memory_note;
          CudaBuffer device(0, 4096);
          expect_error(
              [&] {
                ofi::MemoryRegistration(ofi::registration_targets(fabric.rails->rails()),
                                        device.data(), 4096, MemoryType::kCuda, 0);
              },
              "has no device-memory support");
        }
        channel.send_bytes({reinterpret_cast<const std::byte*>(note.data()), note.size()});
      });
  require(failure.empty(), "probing the provider for device memory: " + failure);
  return refusal;
}

// True (after saying so) when the provider under test takes no device memory.
bool unsupported_here() {
  const std::string refusal = device_memory_refused();
  if (refusal.empty()) return false;
  std::printf("NOT SUPPORTED: %s; CUDA registrations are refused with that reason\n",
              refusal.c_str());
  return true;
}

struct Transfer {
  unsigned rails = 1;
  bool gpu_flush = true;
};

void receive_sizes(Channel& channel, Transfer how) {
  Config config = test_config(how.rails);
  config.gpu_flush = how.gpu_flush;
  Context context(config);
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  auto comm = accept_one(listener);
  TestBuffer buffer(kLargest + 4096);
  const CloseOnUnwind guard{comm.get()};  // a failure frees `buffer` before `comm`
  MemoryRegion region =
      comm->register_memory(buffer.data(), buffer.size(), buffer.type(), buffer.device());
  std::uint64_t seed = how.rails * 100;
  for (std::size_t size : kSizes) {
    ++seed;
    RecvBuffer target{buffer.data(), size, static_cast<Tag>(seed), region};
    Request request;
    require(post_into(comm->irecv({&target, 1}), request) == Status::kOk,
            "irecv: " + comm->last_error());
    const std::size_t delivered = finish(*comm, request);
    require(delivered == size,
            std::to_string(size) + " bytes delivered as " + std::to_string(delivered));
    // As NCCL does before a kernel reads what arrived.
    const auto reads_before = data_rail_reads(context);
    Request flush;
    require(post_into(comm->iflush({&target, 1}), flush) == Status::kOk,
            "iflush: " + comm->last_error());
    finish(*comm, flush);
    const bool flush_expected = !host_mode() && how.gpu_flush && size != 0;
    const bool read = data_rail_reads(context) != reads_before;
    require(read == flush_expected, std::string("iflush ") + (read ? "posted" : "skipped") +
                                        " its reads for " + std::to_string(size) +
                                        " bytes (LOOM_GPU_FLUSH=" + (how.gpu_flush ? "1" : "0") +
                                        ")");
    const std::string error = check_pattern(buffer.read(0, size), seed);
    require(error.empty(), std::to_string(size) + "-byte message: " + error);
  }
  comm->deregister(region);
  channel.barrier();
}

void send_sizes(Channel& channel, Transfer how) {
  Context context(test_config(how.rails));
  auto comm = connect_one(context, recv_handle(channel));
  TestBuffer buffer(kLargest + 4096);
  const CloseOnUnwind guard{comm.get()};  // a failure frees `buffer` before `comm`
  MemoryRegion region =
      comm->register_memory(buffer.data(), buffer.size(), buffer.type(), buffer.device());
  std::uint64_t seed = how.rails * 100;
  for (std::size_t size : kSizes) {
    ++seed;
    buffer.write(0, pattern_bytes(size, seed));
    Request request;
    require(post_into(comm->isend(buffer.data(), size, static_cast<Tag>(seed), region), request) ==
                Status::kOk,
            "isend: " + comm->last_error());
    finish(*comm, request);
  }
  comm->deregister(region);
  channel.barrier();
}

}  // namespace

TEST_CASE("gpu: device buffers move over p2p, every byte verified, then flushed", "[gpu]") {
  if (unsupported_here()) return;
  for (Transfer how : {Transfer{1, true}, Transfer{2, true}, Transfer{1, false}}) {
    INFO("data rails " << how.rails << ", LOOM_GPU_FLUSH " << how.gpu_flush);
    REQUIRE_NOTHROW(in_fresh_process([how] {
      const std::string failure = run_pair([how](Channel& c) { receive_sizes(c, how); },
                                           [how](Channel& c) { send_sizes(c, how); });
      require(failure.empty(), failure);
    }));
  }
}

TEST_CASE("gpu: iflush reads through every data rail that carried the message", "[gpu]") {
  if (unsupported_here()) return;
  constexpr unsigned kRails = 3;
  constexpr std::size_t kSize = std::size_t{3} << 20;  // 3 stripes of 1 MiB: every rail
  REQUIRE_NOTHROW(in_fresh_process([] {
    const std::string failure = run_pair(
        [](Channel& channel) {
          Config config = test_config(kRails);
          config.force_flush = host_mode();  // host memory needs no flush otherwise
          Context context(config);
          Listener listener = context.listen();
          send_handle(channel, listener.handle());
          auto comm = accept_one(listener);
          TestBuffer buffer(kSize);
          const CloseOnUnwind guard{comm.get()};
          MemoryRegion region =
              comm->register_memory(buffer.data(), buffer.size(), buffer.type(), buffer.device());
          RecvBuffer target{buffer.data(), kSize, 9, region};
          Request request;
          require(post_into(comm->irecv({&target, 1}), request) == Status::kOk, comm->last_error());
          finish(*comm, request);
          const auto reads = flush_reads(context, *comm, target, kRails);
          for (unsigned r = 0; r < kRails; ++r) {
            require(reads[r] > 0, "data rail " + std::to_string(r) + " read nothing");
          }
          const std::string error = check_pattern(buffer.read(0, kSize), 77);
          require(error.empty(), error);
          comm->deregister(region);
          channel.barrier();
        },
        [](Channel& channel) {
          Context context(test_config(kRails));
          auto comm = connect_one(context, recv_handle(channel));
          TestBuffer buffer(kSize);
          const CloseOnUnwind guard{comm.get()};
          buffer.write(0, pattern_bytes(kSize, 77));
          MemoryRegion region =
              comm->register_memory(buffer.data(), buffer.size(), buffer.type(), buffer.device());
          Request request;
          require(post_into(comm->isend(buffer.data(), kSize, 9, region), request) == Status::kOk,
                  comm->last_error());
          finish(*comm, request);
          comm->deregister(region);
          channel.barrier();
        });
    require(failure.empty(), failure);
  }));
}

TEST_CASE("gpu: registration goes through a dmabuf exactly where everything allows it", "[gpu]") {
  if (unsupported_here()) return;
  for (bool dmabuf_enabled : {true, false}) {
    INFO("LOOM_CUDA_DMABUF " << dmabuf_enabled);
    REQUIRE_NOTHROW(in_fresh_process([dmabuf_enabled] {
      Config config = Config::from_env();
      config.cuda_dmabuf = dmabuf_enabled;
      auto nics = ofi::open_nics(config);
      std::vector<ofi::Nic*> pointers;
      for (auto& nic : nics) pointers.push_back(nic.get());
      ofi::RailSet rails(pointers, ofi::RailSetShape{.data_rails = 2, .control_rails = 1});
      TestBuffer buffer(std::size_t{4} << 20);
      ofi::MemoryRegistration registration(ofi::registration_targets(rails.rails()), buffer.data(),
                                           buffer.size(), buffer.type(), buffer.device());
      if (host_mode()) {
        require(!registration.through_dmabuf(), "host memory registered through a dmabuf");
        return;
      }
      const ofi::NicAttributes& nic = pointers.front()->attributes();
      ofi::DmabufFacts facts{.linked_version = fi_version(),
                             .enabled = nic.cuda_dmabuf,
                             .device = util::cuda::Driver::instance().dmabuf_supported(0),
                             .refused = pointers.front()->dmabuf_refused()};
      facts.compiled = facts.compiled && nic.api_version >= ofi::kDmabufApiVersion;
      const std::string refusal = ofi::dmabuf_refusal(facts);
      std::printf("%s: registered %s%s%s\n", nic.provider.c_str(),
                  registration.through_dmabuf() ? "through a dmabuf" : "by address",
                  refusal.empty() ? "" : "; no dmabuf because ", refusal.c_str());
      require(registration.through_dmabuf() == refusal.empty(),
              std::string("through_dmabuf() is ") +
                  (registration.through_dmabuf() ? "true" : "false") + " where the facts say " +
                  (refusal.empty() ? "a dmabuf" : refusal));
      require(dmabuf_enabled || !registration.through_dmabuf(),
              "LOOM_CUDA_DMABUF=0 still registered through a dmabuf");
    }));
  }
}

TEST_CASE("gpu: memory registered as what it is not is refused", "[gpu]") {
  if (host_mode()) {
    SUCCEED("needs the CUDA driver: the pointer's type comes from it");
    return;
  }
  if (unsupported_here()) return;
  REQUIRE_NOTHROW(in_fresh_process([] {
    TestFabric fabric(1, 1);
    CudaBuffer device(0, 65536);
    std::vector<std::byte> host(65536);
    expect_error(
        [&] {
          ofi::MemoryRegistration(ofi::registration_targets(fabric.rails->rails()), device.data(),
                                  4096, MemoryType::kHost);
        },
        "registered as host memory");
    expect_error(
        [&] {
          ofi::MemoryRegistration(ofi::registration_targets(fabric.rails->rails()), host.data(),
                                  4096, MemoryType::kCuda, 0);
        },
        "is host memory but was registered as CUDA device memory");
    if (cuda_devices().size() > 1) {
      expect_error(
          [&] {
            ofi::MemoryRegistration(ofi::registration_targets(fabric.rails->rails()), device.data(),
                                    4096, MemoryType::kCuda, 1);
          },
          "lies on CUDA device 0");
    }
  }));
}

}  // namespace loom::test
