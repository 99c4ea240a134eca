// lib/topo: NIC order by closeness to a GPU or to CPUs, on recorded boxes (fixtures/*.xml,
// made by fixtures/make_fixtures.py; the layouts are described there).
#include "topo/nic_rank.hpp"

#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "loom/error.hpp"
#include "topo/topology.hpp"

namespace loom::topo {
namespace {

std::string fixture(const char* name) {
  return std::string(LOOM_TOPO_FIXTURES) + "/" + name;
}

using Names = std::vector<std::string>;
using Levels = std::vector<Locality>;

Names names(const NicRanking& r) {
  Names out;
  for (const auto& nic : r.nics) out.push_back(nic.name);
  return out;
}
Levels levels(const NicRanking& r) {
  Levels out;
  for (const auto& nic : r.nics) out.push_back(nic.locality);
  return out;
}
std::vector<std::uint64_t> distances(const NicRanking& r) {
  std::vector<std::uint64_t> out;
  for (const auto& nic : r.nics) out.push_back(nic.distance);
  return out;
}

// dgx-2s-8gpu-4nic.xml: socket 0 (CPUs 0-7) holds switches 0 and 1, socket 1 (CPUs 8-15)
// switches 2 and 3; switch s has GPUs 2s and 2s+1 and NIC mlx5_s.
const std::map<std::string, std::string> kDgxNicBus{{"mlx5_0", "0000:15:00.0"},
                                                    {"mlx5_1", "0000:35:00.0"},
                                                    {"mlx5_2", "0000:95:00.0"},
                                                    {"mlx5_3", "0000:b5:00.0"}};
const std::vector<std::string> kDgxGpuBus{"0000:13:00.0", "0000:14:00.0", "0000:33:00.0",
                                          "0000:34:00.0", "0000:93:00.0", "0000:94:00.0",
                                          "0000:b3:00.0", "0000:b4:00.0"};

// The NICs as a verbs provider reports them (name and bus id), in the order given.
std::vector<NicCandidate> dgx_nics(const Names& order, bool with_bus_id = true) {
  std::vector<NicCandidate> out;
  for (const auto& name : order) out.push_back({name, with_bus_id ? kDgxNicBus.at(name) : ""});
  return out;
}

constexpr auto kSwitch = Locality::kSamePcieSwitch;
constexpr auto kNuma = Locality::kSameNumaNode;
constexpr auto kOther = Locality::kOtherNumaNode;
constexpr auto kNone = Locality::kNoLocality;

}  // namespace

TEST_CASE("rank: each GPU's NIC order is its switch, its socket, the other socket", "[rank]") {
  const Topology dgx(fixture("dgx-2s-8gpu-4nic.xml"));
  // Given in rail order, and reversed: ties keep the given order either way.
  const Names given{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};
  const Names reversed{"mlx5_3", "mlx5_2", "mlx5_1", "mlx5_0"};
  const std::vector<Names> expected_given{{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"},
                                          {"mlx5_1", "mlx5_0", "mlx5_2", "mlx5_3"},
                                          {"mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1"},
                                          {"mlx5_3", "mlx5_2", "mlx5_0", "mlx5_1"}};
  const std::vector<Names> expected_reversed{{"mlx5_0", "mlx5_1", "mlx5_3", "mlx5_2"},
                                             {"mlx5_1", "mlx5_0", "mlx5_3", "mlx5_2"},
                                             {"mlx5_2", "mlx5_3", "mlx5_1", "mlx5_0"},
                                             {"mlx5_3", "mlx5_2", "mlx5_1", "mlx5_0"}};
  for (std::size_t gpu = 0; gpu < kDgxGpuBus.size(); ++gpu) {
    INFO("GPU " << gpu << " at " << kDgxGpuBus[gpu]);
    const std::size_t sw = gpu / 2;
    for (bool with_bus_id : {true, false}) {  // found by bus id, or by verbs device name
      INFO("with bus ids: " << with_bus_id);
      const auto r = rank_nics_for_gpu(dgx, dgx_nics(given, with_bus_id), kDgxGpuBus[gpu]);
      CHECK(r.target == "GPU " + kDgxGpuBus[gpu]);
      CHECK(names(r) == expected_given[sw]);
      CHECK(levels(r) == Levels{kSwitch, kNuma, kOther, kOther});
      // GPU and NIC each sit below a switch downstream port: 2 links up to the switch each.
      CHECK(distances(r) == std::vector<std::uint64_t>{4, 0, 21, 21});
      CHECK(r.nics[0].pci_bus_id == kDgxNicBus.at(expected_given[sw][0]));
      CHECK(names(rank_nics_for_gpu(dgx, dgx_nics(reversed, with_bus_id), kDgxGpuBus[gpu])) ==
            expected_reversed[sw]);
    }
  }
}

TEST_CASE("rank: each socket's CPUs get that socket's NICs first", "[rank]") {
  const Topology dgx(fixture("dgx-2s-8gpu-4nic.xml"));
  const auto nics = dgx_nics({"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"});
  const auto socket0 = rank_nics(dgx, nics, CpuSet::parse("0-7"));
  CHECK(socket0.target == "CPUs 0-7");
  CHECK(names(socket0) == Names{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"});
  CHECK(levels(socket0) == Levels{kNuma, kNuma, kOther, kOther});
  CHECK(distances(socket0) == std::vector<std::uint64_t>{0, 0, 21, 21});
  const auto socket1 = rank_nics(dgx, nics, CpuSet::parse("8-15"));
  CHECK(names(socket1) == Names{"mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1"});
  CHECK(levels(socket1) == Levels{kNuma, kNuma, kOther, kOther});
  // One core of socket 1 is enough, and reversed input keeps its order among equals.
  const auto core =
      rank_nics(dgx, dgx_nics({"mlx5_3", "mlx5_2", "mlx5_1", "mlx5_0"}), CpuSet::parse("9"));
  CHECK(names(core) == Names{"mlx5_3", "mlx5_2", "mlx5_1", "mlx5_0"});
  // CPUs of both sockets: every NIC is local, the given order stands.
  CHECK(levels(rank_nics(dgx, nics, CpuSet::parse("7-8"))) == Levels{kNuma, kNuma, kNuma, kNuma});
  // An XML box has no thread binding: the default target is the whole box.
  const auto whole = rank_nics(dgx, nics);
  CHECK(whole.target == "the whole machine, CPUs 0-15");
  CHECK(names(whole) == Names{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"});
  // CPUs the box does not have are an error, not a silent whole-machine choice.
  CHECK_THROWS_AS(rank_nics(dgx, nics, CpuSet::parse("64-71")), Error);
}

TEST_CASE("rank: host bridge after switch; virtual NICs last in given order", "[rank]") {
  const Topology dgx(fixture("dgx-2s-8gpu-4nic.xml"));
  // eno1 hangs off GPU 0's host bridge through its own root port: closer than mlx5_1 (same
  // socket, other host bridge) but not behind GPU 0's switch.
  const std::vector<NicCandidate> nics{{"lo", ""},    {"eno1", ""},   {"mlx5_1", "0000:35:00.0"},
                                       {"veth0", ""}, {"mlx5_2", ""}, {"mlx5_0", "0000:15:00.0"}};
  const auto r = rank_nics_for_gpu(dgx, nics, "0000:13:00.0");
  CHECK(names(r) == Names{"mlx5_0", "eno1", "mlx5_1", "mlx5_2", "lo", "veth0"});
  CHECK(levels(r) == Levels{kSwitch, Locality::kSameHostBridge, kNuma, kOther, kNone, kNone});
  CHECK(distances(r) == std::vector<std::uint64_t>{4, 6, 0, 21, 0, 0});
  std::vector<std::size_t> indexes;
  for (const auto& nic : r.nics) indexes.push_back(nic.index);
  CHECK(indexes == std::vector<std::size_t>{5, 1, 2, 4, 0, 3});
  CHECK(describe(r) ==
        "NIC order near GPU 0000:13:00.0 (topology " + dgx.source() +
            "): mlx5_0 (0000:15:00.0, same PCIe switch), eno1 (0000:16:00.0, same PCIe host "
            "bridge), mlx5_1 (0000:35:00.0, same NUMA node), mlx5_2 (0000:95:00.0, other NUMA "
            "node, distance 21), lo (no locality), veth0 (no locality)");
}

TEST_CASE("rank: bus id first, then netdev or verbs name; unknown GPU is an error", "[rank]") {
  const Topology dgx(fixture("dgx-2s-8gpu-4nic.xml"));
  // tcp names the netdev (IPoIB here); a stale bus id falls back to the name; a bus id wins
  // over a name that means nothing to hwloc.
  const std::vector<NicCandidate> nics{{"ibp181s0", ""},
                                       {"mlx5_2", "0000:ee:00.0"},
                                       {"rdma-by-bus", "0000:35:00.0"},
                                       {"ibp21s0", "garbage"}};
  const auto r = rank_nics_for_gpu(dgx, nics, "0000:34:00.0");
  CHECK(names(r) == Names{"rdma-by-bus", "ibp21s0", "ibp181s0", "mlx5_2"});
  CHECK(levels(r) == Levels{kSwitch, kNuma, kOther, kOther});
  CHECK(r.nics[2].pci_bus_id == "0000:b5:00.0");

  for (const char* gpu : {"0000:13:00.1", "not-a-bus-id", ""}) {
    try {
      (void)rank_nics_for_gpu(dgx, nics, gpu);
      FAIL("no error for GPU " << gpu);
    } catch (const Error& e) {
      CHECK(e.operation() == "topology");
      CHECK_THAT(e.what(), Catch::Contains("no PCI device") && Catch::Contains(dgx.source()));
    }
  }
}

TEST_CASE("rank: NUMA distances order the other sockets of a 4-socket ring", "[rank]") {
  const Topology ring(fixture("ring-4s-4nic.xml"));
  const std::vector<NicCandidate> nics{
      {"mlx5_2", ""}, {"mlx5_3", ""}, {"mlx5_1", ""}, {"mlx5_0", ""}};
  const auto socket0 = rank_nics(ring, nics, CpuSet::parse("0-1"));
  CHECK(names(socket0) == Names{"mlx5_0", "mlx5_3", "mlx5_1", "mlx5_2"});
  CHECK(distances(socket0) == std::vector<std::uint64_t>{0, 21, 21, 31});
  const auto socket2 = rank_nics(ring, nics, CpuSet::parse("4-5"));
  CHECK(names(socket2) == Names{"mlx5_2", "mlx5_3", "mlx5_1", "mlx5_0"});
  CHECK(distances(socket2) == std::vector<std::uint64_t>{0, 21, 21, 31});
  // The GPU shares mlx5_0's host bridge through another root port.
  const auto gpu = rank_nics_for_gpu(ring, nics, "0000:19:00.0");
  CHECK(names(gpu) == Names{"mlx5_0", "mlx5_3", "mlx5_1", "mlx5_2"});
  CHECK(levels(gpu) == Levels{Locality::kSameHostBridge, kOther, kOther, kOther});
}

TEST_CASE("rank: without a distance matrix the same package comes first", "[rank]") {
  const Topology snc(fixture("snc-2s-4numa-4nic.xml"));
  const std::vector<NicCandidate> nics{
      {"mlx5_3", ""}, {"mlx5_2", ""}, {"mlx5_1", ""}, {"mlx5_0", ""}};
  const auto numa0 = rank_nics(snc, nics, CpuSet::parse("0-1"));
  CHECK(names(numa0) == Names{"mlx5_0", "mlx5_1", "mlx5_3", "mlx5_2"});
  CHECK(levels(numa0) == Levels{kNuma, kOther, kOther, kOther});
  CHECK(distances(numa0) == std::vector<std::uint64_t>{0, 0, 1, 1});
  const auto package1 = rank_nics(snc, nics, CpuSet::parse("4-7"));
  CHECK(names(package1) == Names{"mlx5_3", "mlx5_2", "mlx5_1", "mlx5_0"});
  CHECK(levels(package1) == Levels{kNuma, kNuma, kOther, kOther});
}

TEST_CASE("rank: a single-socket box with one NIC and no GPU", "[rank]") {
  const Topology single(fixture("single-1s-1nic.xml"));
  for (const char* name : {"mlx5_0", "ens1f0np0"}) {  // verbs device or netdev (tcp)
    const auto r = rank_nics(single, std::vector<NicCandidate>{{"lo", ""}, {name, ""}});
    CHECK(names(r) == Names{name, "lo"});
    CHECK(levels(r) == Levels{kNuma, kNone});
    CHECK(r.nics[0].pci_bus_id == "0000:01:00.0");
  }
  CHECK(rank_nics(single, {}).nics.empty());
  CHECK_THAT(describe(rank_nics(single, {})), Catch::EndsWith(": none"));
  CHECK_THROWS_AS(rank_nics_for_gpu(single, {}, "0000:01:00.1"), Error);
}

}  // namespace loom::topo
