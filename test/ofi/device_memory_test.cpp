// Device memory without a GPU: the hints with and without FI_HMEM, why a provider gives none,
// the API version, how a registration is described to fi_mr_regattr (memory interface, device,
// dmabuf or address) and the check of a pointer against what it is registered as, with the
// driver's answer given by the test. The [local] cases open the provider under test.
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "loom/error.hpp"
#include "loom_build_config.h"
#include "ofi/memory_registration.hpp"
#include "ofi/mr_attributes.hpp"
#include "ofi/nic.hpp"
#include "ofi/selection.hpp"
#include "support/rails.hpp"
#include "util/cuda_driver.hpp"

namespace loom::test {
namespace {

using ofi::RegistrationPath;
using util::cuda::PointerInfo;
using util::cuda::PointerKind;

// A chain of fi_info entries as fi_getinfo lists them, built by hand.
struct InfoList {
  ofi::InfoPtr head;
  fi_info* tail = nullptr;

  fi_info& add(const char* provider, const char* domain, std::uint64_t caps, int mr_mode = 0) {
    fi_info* info = fi_allocinfo();
    REQUIRE(info != nullptr);
    info->fabric_attr->prov_name = strdup(provider);
    info->domain_attr->name = strdup(domain);
    info->ep_attr->type = FI_EP_RDM;
    info->caps = caps;
    info->domain_attr->mr_mode = mr_mode;
    if (tail == nullptr) {
      head.reset(info);
    } else {
      tail->next = info;
    }
    tail = info;
    return *info;
  }
};

ofi::DmabufFacts all_dmabuf_facts() {
  return ofi::DmabufFacts{.compiled = true,
                          .linked_version = FI_VERSION(1, 20),
                          .enabled = true,
                          .device = true,
                          .refused = false};
}

}  // namespace

TEST_CASE("device memory: hints ask for FI_HMEM and FI_MR_HMEM only for device memory", "[hmem]") {
  Config config;
  config.provider = "shm";
  const ofi::InfoPtr host = ofi::make_hints(config, false);
  const ofi::InfoPtr device = ofi::make_hints(config, true);
  CHECK((host->caps & FI_HMEM) == 0);
  CHECK((host->domain_attr->mr_mode & FI_MR_HMEM) == 0);
  CHECK((device->caps & FI_HMEM) != 0);
  CHECK((device->domain_attr->mr_mode & FI_MR_HMEM) != 0);
  // Everything else is the same.
  CHECK((device->caps & ~FI_HMEM) == host->caps);
  CHECK((device->domain_attr->mr_mode & ~FI_MR_HMEM) == host->domain_attr->mr_mode);
  CHECK((host->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0);
  CHECK(device->mode == host->mode);
  CHECK(device->ep_attr->type == FI_EP_RDM);
  CHECK(std::strcmp(device->fabric_attr->prov_name, "shm") == 0);
}

TEST_CASE("device memory: the reason a provider gives none", "[hmem]") {
  InfoList list;
  list.add("tcp;ofi_rxm", "lo", FI_MSG | FI_TAGGED);
  list.add("shm", "shm", FI_MSG | FI_HMEM, FI_MR_HMEM | FI_MR_VIRT_ADDR);
  list.add("odd", "odd0", FI_MSG | FI_HMEM, FI_MR_HMEM | FI_MR_RAW);
  const fi_info* all = list.head.get();

  CHECK_THAT(
      ofi::device_memory_refusal(all, "tcp;ofi_rxm", "lo"),
      Catch::Contains("tcp;ofi_rxm on lo offers no FI_HMEM") && Catch::Contains("--with-cuda"));
  CHECK_THAT(ofi::device_memory_refusal(all, "tcp;ofi_rxm", "eth9"),
             Catch::Contains("is not listed with FI_HMEM"));
  CHECK_THAT(ofi::device_memory_refusal(all, "odd", "odd0"),
             Catch::Contains("MR mode bits loom does not handle") && Catch::Contains("RAW"));
  CHECK_THAT(ofi::device_memory_refusal(all, "shm", "shm"),
             Catch::Contains("offers FI_HMEM, but not together with loom's other hints"));
}

TEST_CASE("device memory: API 1.20 only where the headers and the library both have dmabufs",
          "[hmem]") {
  const bool dmabuf = LOOM_FI_DMABUF && fi_version() >= ofi::kDmabufApiVersion;
  CHECK(ofi::api_version() == (dmabuf ? FI_VERSION(1, 20) : FI_VERSION(1, 17)));
  CHECK(ofi::version_text(FI_VERSION(1, 20)) == "1.20");
}

TEST_CASE("device memory: the registration path follows the memory type and dmabuf facts",
          "[hmem]") {
  ofi::DmabufFacts facts = all_dmabuf_facts();
  CHECK(ofi::choose_path(MemoryType::kHost, facts) == RegistrationPath::kHostAddress);
  CHECK(ofi::choose_path(MemoryType::kCuda, facts) == RegistrationPath::kCudaDmabuf);
  CHECK(ofi::dmabuf_refusal(facts).empty());

  struct Case {
    const char* what;
    void (*change)(ofi::DmabufFacts&);
    const char* reason;
  };
  const Case cases[] = {
      {"headers before 1.20", [](ofi::DmabufFacts& f) { f.compiled = false; }, "no FI_MR_DMABUF"},
      {"library 1.17", [](ofi::DmabufFacts& f) { f.linked_version = FI_VERSION(1, 17); },
       "the libfabric loaded is 1.17, older than 1.20"},
      {"LOOM_CUDA_DMABUF=0", [](ofi::DmabufFacts& f) { f.enabled = false; }, "LOOM_CUDA_DMABUF=0"},
      {"no driver support", [](ofi::DmabufFacts& f) { f.device = false; },
       "cuMemGetHandleForAddressRange"},
      {"refused before", [](ofi::DmabufFacts& f) { f.refused = true; }, "refused a dmabuf"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    ofi::DmabufFacts changed = all_dmabuf_facts();
    c.change(changed);
    CHECK(ofi::choose_path(MemoryType::kCuda, changed) == RegistrationPath::kCudaAddress);
    CHECK_THAT(ofi::dmabuf_refusal(changed), Catch::Contains(c.reason));
    CHECK(ofi::choose_path(MemoryType::kHost, changed) == RegistrationPath::kHostAddress);
  }
  // What this build can do: no dmabuf without the headers for it.
  if (!LOOM_FI_DMABUF) {
    CHECK(ofi::choose_path(MemoryType::kCuda,
                           ofi::DmabufFacts{.linked_version = fi_version(), .device = true}) ==
          RegistrationPath::kCudaAddress);
  }
}

TEST_CASE("device memory: fi_mr_attr for host, CUDA by address and CUDA by dmabuf", "[hmem]") {
  std::vector<std::byte> memory(8192);
  const void* base = memory.data() + 100;
  constexpr std::uint64_t kAccess = FI_SEND | FI_RECV | FI_REMOTE_WRITE;

  ofi::MrArguments host;
  ofi::fill_mr_arguments(host, RegistrationPath::kHostAddress, base, 4000, 3, kAccess, 17);
  CHECK(host.attr.iface == FI_HMEM_SYSTEM);
  CHECK(host.attr.device.reserved == 0);
  CHECK(host.flags == 0);
  CHECK(host.attr.iov_count == 1);
  CHECK(host.attr.mr_iov == &host.iov);
  CHECK(host.iov.iov_base == base);
  CHECK(host.iov.iov_len == 4000);
  CHECK(host.attr.access == kAccess);
  CHECK(host.attr.requested_key == 17);

  ofi::MrArguments cuda;
  ofi::fill_mr_arguments(cuda, RegistrationPath::kCudaAddress, base, 4000, 3, kAccess, 0);
  CHECK(cuda.attr.iface == FI_HMEM_CUDA);
  CHECK(cuda.attr.device.cuda == 3);
  CHECK(cuda.flags == 0);
  CHECK(cuda.attr.mr_iov == &cuda.iov);
  CHECK(cuda.iov.iov_base == base);

  // cuMemAlloc'd memory says so: shm copies it device to device (CUDA IPC) only then.
  ofi::MrArguments device_only;
  ofi::fill_mr_arguments(device_only, RegistrationPath::kCudaAddress, base, 4000, 3, kAccess, 0,
                         nullptr, true);
  CHECK(device_only.attr.iface == FI_HMEM_CUDA);
  CHECK(device_only.flags == FI_HMEM_DEVICE_ONLY);
  ofi::MrArguments host_only_flag;
  ofi::fill_mr_arguments(host_only_flag, RegistrationPath::kHostAddress, base, 4000, 3, kAccess, 0,
                         nullptr, true);
  CHECK(host_only_flag.flags == 0);  // never for host memory

  const ofi::DmabufSource source{.fd = 42, .offset = 100, .start = memory.data()};
  // A caller's dmabuf (loom::Dmabuf, an NCCL plugin's regMrDmaBuf) describes the same thing.
  const ofi::DmabufSource caller = ofi::caller_dmabuf(base, Dmabuf{.fd = 42, .offset = 100});
  CHECK(caller.fd == source.fd);
  CHECK(caller.offset == source.offset);
  CHECK(caller.start == source.start);
  ofi::MrArguments dmabuf;
#if LOOM_FI_DMABUF
  ofi::fill_mr_arguments(dmabuf, RegistrationPath::kCudaDmabuf, base, 4000, 3, kAccess, 0, &source);
  CHECK(dmabuf.attr.iface == FI_HMEM_CUDA);
  CHECK(dmabuf.attr.device.cuda == 3);
  CHECK(dmabuf.flags == FI_MR_DMABUF);
  CHECK(dmabuf.attr.dmabuf == &dmabuf.dmabuf);
  CHECK(dmabuf.dmabuf.fd == 42);
  CHECK(dmabuf.dmabuf.offset == 100);
  CHECK(dmabuf.dmabuf.len == 4000);
  CHECK(dmabuf.dmabuf.base_addr == memory.data());
  ofi::MrArguments dmabuf_device_only;
  ofi::fill_mr_arguments(dmabuf_device_only, RegistrationPath::kCudaDmabuf, base, 4000, 3, kAccess,
                         0, &source, true);
  CHECK(dmabuf_device_only.flags == (FI_MR_DMABUF | FI_HMEM_DEVICE_ONLY));
  CHECK_THROWS_WITH(ofi::fill_mr_arguments(dmabuf, RegistrationPath::kCudaDmabuf, base, 4000, 3,
                                           kAccess, 0, nullptr),
                    Catch::Contains("without a dmabuf"));
#else
  CHECK_THROWS_WITH(ofi::fill_mr_arguments(dmabuf, RegistrationPath::kCudaDmabuf, base, 4000, 3,
                                           kAccess, 0, &source),
                    Catch::Contains("libfabric 1.20 headers"));
#endif
}

TEST_CASE("device memory: a pointer registered as what it is not is an error", "[hmem]") {
  std::vector<std::byte> memory(64);
  const void* base = memory.data();
  const PointerInfo device0{PointerKind::kDevice, 0};
  const PointerInfo host{PointerKind::kHost, -1};
  const PointerInfo unknown{};

  CHECK_THAT(ofi::memory_type_mismatch(MemoryType::kHost, 0, device0, base, 64),
             Catch::Contains("is CUDA device memory (device 0) but was registered as host "
                             "memory") &&
                 Catch::Contains("64 bytes at"));
  CHECK_THAT(ofi::memory_type_mismatch(MemoryType::kCuda, 0, host, base, 64),
             Catch::Contains("is host memory but was registered as CUDA device memory"));
  CHECK_THAT(ofi::memory_type_mismatch(MemoryType::kCuda, 1, device0, base, 64),
             Catch::Contains("lies on CUDA device 0 but was registered for device 1"));
  CHECK(ofi::memory_type_mismatch(MemoryType::kCuda, 0, device0, base, 64).empty());
  CHECK(ofi::memory_type_mismatch(MemoryType::kHost, 0, host, base, 64).empty());
  // Without a driver's answer nothing is refused.
  CHECK(ofi::memory_type_mismatch(MemoryType::kHost, 0, unknown, base, 64).empty());
  CHECK(ofi::memory_type_mismatch(MemoryType::kCuda, 0, unknown, base, 64).empty());
}

TEST_CASE("device memory: each NIC says whether it takes device memory, and why not", "[local]") {
  TestFabric fabric(1, 1);
  const ofi::NicAttributes& nic = fabric.nic();
  INFO(nic.provider << ": " << nic.device_memory_note);
  if (!LOOM_HAVE_CUDA) {
    CHECK_FALSE(nic.device_memory);
    CHECK_THAT(nic.device_memory_note, Catch::Contains("-Dcuda=enabled"));
  } else {
    CHECK(nic.device_memory != !nic.device_memory_note.empty());
  }
  CHECK(nic.api_version == ofi::api_version());
  Config host_only = Config::from_env();
  host_only.device_memory = false;  // LOOM_DEVICE_MEMORY=0: never asked for FI_HMEM
  for (const auto& opened : ofi::open_nics(host_only)) {
    CHECK_FALSE(opened->attributes().device_memory);
    CHECK_THAT(opened->attributes().device_memory_note,
               Catch::Contains(LOOM_HAVE_CUDA ? "LOOM_DEVICE_MEMORY=0" : "-Dcuda=enabled"));
  }
  std::vector<std::byte> buffer(4096);
  // Host memory where no driver is loaded: registered as before.
  ofi::MemoryRegistration host(ofi::registration_targets(fabric.rails->rails()), buffer.data(),
                               buffer.size());
  CHECK_FALSE(host.through_dmabuf());
  // CUDA memory claimed for a host buffer: refused, naming why (no CUDA in the build, no
  // driver, no device memory on the NIC, or the pointer is host memory).
  CHECK_THROWS_WITH(ofi::MemoryRegistration(ofi::registration_targets(fabric.rails->rails()),
                                            buffer.data(), buffer.size(), MemoryType::kCuda, 0),
                    Catch::Contains("CUDA", Catch::CaseSensitive::No));
  // A caller's dmabuf: CUDA memory only, and a descriptor that can be one.
  const Dmabuf dmabuf{.fd = 0, .offset = 0};
  CHECK_THROWS_WITH(
      ofi::MemoryRegistration(ofi::registration_targets(fabric.rails->rails()), buffer.data(),
                              buffer.size(), MemoryType::kHost, 0, &dmabuf),
      Catch::Contains("a dmabuf registration is for CUDA memory"));
  const Dmabuf negative{.fd = -3, .offset = 0};
  CHECK_THROWS_WITH(
      ofi::MemoryRegistration(ofi::registration_targets(fabric.rails->rails()), buffer.data(),
                              buffer.size(), MemoryType::kCuda, 0, &negative),
      Catch::Contains("dmabuf file descriptor -3"));
  // Whether the NIC takes dmabufs: never without device memory, nor with libfabric < 1.20.
  for (const auto& opened : ofi::open_nics(Config::from_env())) {
    const std::string note = opened->dmabuf_note();
    INFO(opened->attributes().domain << ": " << note);
    if (!opened->attributes().device_memory) {
      CHECK(note == opened->attributes().device_memory_note);
    } else if (!LOOM_FI_DMABUF || fi_version() < ofi::kDmabufApiVersion) {
      CHECK_THAT(note, Catch::Contains("1.20"));
    }
  }
}

}  // namespace loom::test
