// lib/topo: loading topologies (XML fixtures, this machine), CPU sets and their errors.
#include "topo/topology.hpp"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "loom/error.hpp"
#include "topo/nic_rank.hpp"

namespace loom::topo {
namespace {

std::string fixture(const char* name) {
  return std::string(LOOM_TOPO_FIXTURES) + "/" + name;
}

// Runs `load` and returns the loom::Error it throws (fails the test when it throws none).
template <typename F>
Error error_of(F&& load) {
  try {
    load();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no loom::Error thrown");
  return Error("", "", 0, "");
}

}  // namespace

TEST_CASE("topology: XML fixtures load with their PCI devices", "[load]") {
  const Topology dgx(fixture("dgx-2s-8gpu-4nic.xml"));
  CHECK(dgx.source() == fixture("dgx-2s-8gpu-4nic.xml"));
  CHECK_FALSE(dgx.is_this_system());
  CHECK(hwloc_get_nbobjs_by_type(dgx.get(), HWLOC_OBJ_PACKAGE) == 2);
  CHECK(hwloc_get_nbobjs_by_type(dgx.get(), HWLOC_OBJ_NUMANODE) == 2);
  CHECK(hwloc_get_nbobjs_by_type(dgx.get(), HWLOC_OBJ_PCI_DEVICE) == 13);  // 8 GPUs, 5 NICs
  CHECK(dgx.machine_cpuset().to_string() == "0-15");
  // An XML box is not the one this thread runs on: its "binding" is the whole box.
  CHECK(dgx.thread_cpuset().to_string() == "0-15");

  hwloc_obj_t nic = dgx.pci_device("0000:15:00.0");
  REQUIRE(nic != nullptr);
  CHECK(pci_bus_id_of(nic) == "0000:15:00.0");
  CHECK(dgx.pci_device("15:00.0") == nic);           // domain optional
  CHECK(dgx.pci_device("00000000:15:00.0") == nic);  // CUDA's spelling
  CHECK(pci_bus_id_of(dgx.pci_device("0000:B5:00.0")) == "0000:b5:00.0");
  CHECK(dgx.os_device("mlx5_0")->parent == nic);
  CHECK(dgx.os_device("ibp21s0")->parent == nic);
  CHECK(dgx.pci_device("0000:15:00.1") == nullptr);
  CHECK(dgx.pci_device("not a bus id") == nullptr);
  CHECK(dgx.pci_device("") == nullptr);
  CHECK(dgx.os_device("lo") == nullptr);
  CHECK(dgx.os_device("") == nullptr);

  const Topology single(fixture("single-1s-1nic.xml"));
  CHECK(hwloc_get_nbobjs_by_type(single.get(), HWLOC_OBJ_PCI_DEVICE) == 1);
  CHECK(single.os_device("ens1f0np0") != nullptr);
}

TEST_CASE("topology: a missing XML file is an error naming the file", "[load]") {
  const std::string path = fixture("no-such-topology.xml");
  const Error e = error_of([&] { Topology t(path); });
  CHECK(e.operation() == "topology");
  CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("does not exist") &&
                           Catch::Contains("LOOM_TOPOLOGY_XML"));
}

TEST_CASE("topology: a directory given as XML file is an error naming it", "[load]") {
  const Error e = error_of([&] { Topology t(LOOM_TOPO_FIXTURES); });
  CHECK(e.operation() == "topology");
  CHECK_THAT(e.what(),
             Catch::Contains(LOOM_TOPO_FIXTURES) && Catch::Contains("not a regular file"));
}

TEST_CASE("topology: a malformed XML file is an error naming the file", "[load]") {
  // A truncated export (fixtures/malformed.xml) and a file that is not XML at all.
  for (const char* name : {"malformed.xml", "make_fixtures.py"}) {
    const std::string path = fixture(name);
    const Error e = error_of([&] { Topology t(path); });
    CHECK(e.operation() == "topology");
    CHECK_THAT(e.what(), Catch::Contains("'" + path + "'") && Catch::Contains("malformed"));
  }
}

TEST_CASE("topology: this machine loads and lo has no locality", "[load][machine]") {
  const Topology here;
  CHECK(here.source() == "this machine");
  CHECK(here.is_this_system());
  const CpuSet machine = here.machine_cpuset();
  const CpuSet thread = here.thread_cpuset();
  CHECK_FALSE(machine.empty());
  CHECK_FALSE(thread.empty());
  CHECK(hwloc_bitmap_isincluded(thread.get(), machine.get()));

  const std::vector<NicCandidate> nics{{"lo", ""}, {"veth-loom-none", ""}};
  const NicRanking ranking = rank_nics(here, nics);
  REQUIRE(ranking.nics.size() == 2);
  CHECK(ranking.nics[0].name == "lo");
  CHECK(ranking.nics[0].locality == Locality::kNoLocality);
  CHECK(ranking.nics[0].pci_bus_id.empty());
  CHECK(ranking.nics[1].name == "veth-loom-none");
  CHECK(ranking.nics[1].locality == Locality::kNoLocality);
  CHECK(ranking.topology == "this machine");

  // Whatever network or verbs devices this machine has on PCI are found by name.
  std::vector<NicCandidate> real;
  for (hwloc_obj_t dev = hwloc_get_next_osdev(here.get(), nullptr); dev != nullptr;
       dev = hwloc_get_next_osdev(here.get(), dev)) {
    const auto type = dev->attr->osdev.type;
    if (type == HWLOC_OBJ_OSDEV_NETWORK || type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      real.push_back({dev->name, ""});
    }
  }
  real.push_back({"lo", ""});
  const NicRanking found = rank_nics(here, real);
  UNSCOPED_INFO(describe(found));
  for (const auto& nic : found.nics) {
    INFO(nic.name);
    CHECK((nic.locality == Locality::kNoLocality) == (nic.name == "lo"));
  }
  CHECK(found.nics.back().name == "lo");
  UNSCOPED_INFO(describe(ranking));
  CHECK_THAT(describe(ranking), Catch::Contains("lo (no locality), veth-loom-none (no locality)"));
}

TEST_CASE("topology: the calling thread's binding is the default CPU set", "[load][machine]") {
  const Topology here;
  const int first = hwloc_bitmap_first(here.machine_cpuset().get());
  REQUIRE(first >= 0);
  // Bind a scratch thread only, so the test runner's own threads stay unbound.
  std::string seen, target;
  bool bound = false;
  std::thread([&] {
    CpuSet one;
    hwloc_bitmap_only(one.get(), static_cast<unsigned>(first));
    bound = hwloc_set_cpubind(here.get(), one.get(), HWLOC_CPUBIND_THREAD) == 0;
    seen = here.thread_cpuset().to_string();
    target = rank_nics(here, std::vector<NicCandidate>{{"lo", ""}}).target;
  }).join();
  if (!bound) {
    WARN("cannot bind a thread here; binding not checked");
    return;
  }
  CHECK(seen == std::to_string(first));
  if (hwloc_bitmap_weight(here.machine_cpuset().get()) > 1) {
    CHECK(target == "this thread's CPUs " + std::to_string(first));
  }
}

TEST_CASE("topology: CPU sets parse from lists and masks", "[load]") {
  CHECK(CpuSet::parse("0-3,8").to_string() == "0-3,8");
  CHECK(CpuSet::parse("0xff").to_string() == "0-7");
  CpuSet copy = CpuSet::parse("4-5");
  const CpuSet other = copy;
  copy = CpuSet::parse("1");
  CHECK(other.to_string() == "4-5");
  CHECK(copy.to_string() == "1");
  const CpuSet taken = std::move(copy);
  copy = other;  // a moved-from set takes a new value
  CHECK(copy.to_string() == "4-5");
  CHECK(taken.to_string() == "1");
  CHECK(CpuSet().empty());
  for (const char* bad : {"", "x", "0-3,zz"}) {
    const Error e = error_of([&] { (void)CpuSet::parse(bad); });
    CHECK(e.operation() == "topology");
    CHECK_THAT(e.what(), Catch::Contains("is not a CPU set"));
  }
}

}  // namespace loom::topo
