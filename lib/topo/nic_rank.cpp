#include "topo/nic_rank.hpp"

#include <algorithm>
#include <cerrno>
#include <optional>
#include <tuple>
#include <utility>

#include "loom/error.hpp"
#include "util/log.hpp"

namespace loom::topo {
namespace {

// CpuSet owns any hwloc bitmap; here it holds NUMA node os indexes.
using NodeSet = CpuSet;

// What the NICs are ranked against: CPUs (and their NUMA nodes), and for a GPU its PCI object.
struct Target {
  hwloc_obj_t gpu = nullptr;
  CpuSet cpus;
  NodeSet nodes;
};

// The object that stands for a NIC in the tree: its PCI device, found by bus id, else through
// the OS device of that name (a netdev or verbs device sits under its PCI function). An OS
// device with no PCI parent stands for itself: it still has a CPU locality.
hwloc_obj_t locate(const Topology& topology, const NicCandidate& nic) {
  if (hwloc_obj_t pci = topology.pci_device(nic.pci_bus_id)) return pci;
  if (!nic.pci_bus_id.empty()) {
    util::log().debug("topology: NIC {}: no PCI device {} in {}; trying its name", nic.name,
                      nic.pci_bus_id, topology.source());
  }
  hwloc_obj_t dev = topology.os_device(nic.name);
  if (dev == nullptr) return nullptr;
  for (hwloc_obj_t up = dev->parent; up != nullptr && up->cpuset == nullptr; up = up->parent) {
    if (up->type == HWLOC_OBJ_PCI_DEVICE) return up;
  }
  return dev;
}

// The lowest common ancestor of two objects when it is an I/O object (a bridge or device), with
// the number of PCI links between them through it; nullopt when they only meet at a CPU-side
// object. hwloc_get_common_ancestor_obj() relies on depths, which I/O objects lack.
std::optional<std::pair<hwloc_obj_t, std::uint64_t>> common_io_ancestor(hwloc_obj_t a,
                                                                        hwloc_obj_t b) {
  std::uint64_t up_a = 0;
  for (hwloc_obj_t x = a; x != nullptr && x->cpuset == nullptr; x = x->parent, ++up_a) {
    std::uint64_t up_b = 0;
    for (hwloc_obj_t y = b; y != nullptr && y->cpuset == nullptr; y = y->parent, ++up_b) {
      if (x == y) return std::pair{x, up_a + up_b};
    }
  }
  return std::nullopt;
}

// PCI-side closeness to the GPU. A PCI-to-PCI bridge above both means a switch (or a root port
// leading to one) that carries GPUDirect traffic without crossing the root complex.
std::optional<std::pair<Locality, std::uint64_t>> pci_closeness(hwloc_obj_t nic, hwloc_obj_t gpu) {
  const auto common = common_io_ancestor(nic, gpu);
  if (!common) return std::nullopt;
  const auto [ancestor, hops] = *common;
  const bool host_bridge = ancestor->type == HWLOC_OBJ_BRIDGE &&
                           ancestor->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
  return std::pair{host_bridge ? Locality::kSameHostBridge : Locality::kSamePcieSwitch, hops};
}

// hwloc's NUMA latency matrix (from the OS's SLIT table, or an XML's), if there is one.
class NumaLatency {
 public:
  explicit NumaLatency(hwloc_topology_t topology) : topology_(topology) {
    unsigned count = 1;
    if (hwloc_distances_get_by_type(topology, HWLOC_OBJ_NUMANODE, &count, &matrix_,
                                    HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0) != 0 ||
        count == 0) {
      matrix_ = nullptr;
    }
  }
  ~NumaLatency() {
    if (matrix_ != nullptr) hwloc_distances_release(topology_, matrix_);
  }
  NumaLatency(const NumaLatency&) = delete;
  NumaLatency& operator=(const NumaLatency&) = delete;

  // The smallest latency from any node of `from` to any node of `to`; nullopt without a matrix
  // or when it covers none of the pairs.
  [[nodiscard]] std::optional<std::uint64_t> between(hwloc_const_nodeset_t from,
                                                     hwloc_const_nodeset_t to) const {
    if (matrix_ == nullptr || from == nullptr || to == nullptr) return std::nullopt;
    std::optional<std::uint64_t> best;
    for (int i = hwloc_bitmap_first(from); i >= 0; i = hwloc_bitmap_next(from, i)) {
      const int row = index_of(static_cast<unsigned>(i));
      if (row < 0) continue;
      for (int j = hwloc_bitmap_first(to); j >= 0; j = hwloc_bitmap_next(to, j)) {
        const int col = index_of(static_cast<unsigned>(j));
        if (col < 0) continue;
        const std::uint64_t value = matrix_->values[row * matrix_->nbobjs + col];
        if (!best || value < *best) best = value;
      }
    }
    return best;
  }

 private:
  int index_of(unsigned numa_os_index) const {
    hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(topology_, numa_os_index);
    return node != nullptr ? hwloc_distances_obj_index(matrix_, node) : -1;
  }

  hwloc_topology_t topology_;
  hwloc_distances_s* matrix_ = nullptr;
};

// Without a latency matrix: the target's own package is nearer than another one.
std::uint64_t package_distance(hwloc_topology_t topology, hwloc_obj_t where,
                               hwloc_const_cpuset_t cpus) {
  hwloc_obj_t package = where->type == HWLOC_OBJ_PACKAGE
                            ? where
                            : hwloc_get_ancestor_obj_by_type(topology, HWLOC_OBJ_PACKAGE, where);
  return package != nullptr && hwloc_bitmap_intersects(package->cpuset, cpus) ? 0 : 1;
}

NicRanking rank(const Topology& topology, std::span<const NicCandidate> nics, const Target& target,
                std::string description) {
  const NumaLatency latency(topology.get());
  NicRanking ranking{std::move(description), topology.source(), {}};
  ranking.nics.reserve(nics.size());
  for (std::size_t i = 0; i < nics.size(); ++i) {
    NicLocality& r = ranking.nics.emplace_back(NicLocality{.index = i, .name = nics[i].name});
    hwloc_obj_t anchor = locate(topology, nics[i]);
    if (anchor == nullptr) continue;  // kNoLocality
    r.pci_bus_id = pci_bus_id_of(anchor);
    if (target.gpu != nullptr) {
      if (const auto pci = pci_closeness(anchor, target.gpu)) {
        std::tie(r.locality, r.distance) = *pci;
        continue;
      }
    }
    hwloc_obj_t where = hwloc_get_non_io_ancestor_obj(topology.get(), anchor);
    if (where == nullptr) {  // an I/O tree hwloc could not place: treat as unlocated
      r.pci_bus_id.clear();
      continue;
    }
    if (hwloc_bitmap_intersects(where->cpuset, target.cpus.get())) {
      r.locality = Locality::kSameNumaNode;
      continue;
    }
    r.locality = Locality::kOtherNumaNode;
    r.distance = latency.between(where->nodeset, target.nodes.get())
                     .value_or(package_distance(topology.get(), where, target.cpus.get()));
  }
  // Stable: equally close NICs keep the caller's order (its rail numbering, LOOM_NICS order).
  std::stable_sort(ranking.nics.begin(), ranking.nics.end(),
                   [](const NicLocality& a, const NicLocality& b) {
                     return std::tie(a.locality, a.distance) < std::tie(b.locality, b.distance);
                   });
  return ranking;
}

Target cpu_target(const Topology& topology, const CpuSet& cpus) {
  Target target{nullptr, CpuSet::copy_of(cpus.get()), NodeSet()};
  hwloc_bitmap_and(target.cpus.get(), target.cpus.get(), topology.machine_cpuset().get());
  if (target.cpus.empty()) {
    throw Error("topology", "", EINVAL,
                "CPU set " + cpus.to_string() + " has no CPU of " + topology.source());
  }
  hwloc_cpuset_to_nodeset(topology.get(), target.cpus.get(), target.nodes.get());
  return target;
}

}  // namespace

std::string_view to_string(Locality locality) noexcept {
  switch (locality) {
    case Locality::kSamePcieSwitch:
      return "same PCIe switch";
    case Locality::kSameHostBridge:
      return "same PCIe host bridge";
    case Locality::kSameNumaNode:
      return "same NUMA node";
    case Locality::kOtherNumaNode:
      return "other NUMA node";
    case Locality::kNoLocality:
      return "no locality";
  }
  return "unknown";
}

NicRanking rank_nics(const Topology& topology, std::span<const NicCandidate> nics,
                     const CpuSet& cpus) {
  return rank(topology, nics, cpu_target(topology, cpus), "CPUs " + cpus.to_string());
}

NicRanking rank_nics(const Topology& topology, std::span<const NicCandidate> nics) {
  const CpuSet cpus = topology.thread_cpuset();
  const bool whole = hwloc_bitmap_isequal(cpus.get(), topology.machine_cpuset().get()) != 0;
  return rank(topology, nics, cpu_target(topology, cpus),
              (whole ? "the whole machine, CPUs " : "this thread's CPUs ") + cpus.to_string());
}

NicRanking rank_nics_for_gpu(const Topology& topology, std::span<const NicCandidate> nics,
                             std::string_view gpu_pci_bus_id) {
  hwloc_obj_t gpu = topology.pci_device(gpu_pci_bus_id);
  if (gpu == nullptr) {
    throw Error("topology", "", ENODEV,
                "GPU " + std::string(gpu_pci_bus_id) + ": no PCI device with that bus id in " +
                    topology.source());
  }
  hwloc_obj_t where = hwloc_get_non_io_ancestor_obj(topology.get(), gpu);
  Target target{gpu, CpuSet::copy_of(where->cpuset), NodeSet::copy_of(where->nodeset)};
  return rank(topology, nics, target, "GPU " + pci_bus_id_of(gpu));
}

std::string describe(const NicRanking& ranking) {
  std::string line = "NIC order near " + ranking.target + " (topology " + ranking.topology + "):";
  const char* separator = " ";
  for (const NicLocality& nic : ranking.nics) {
    line += separator + nic.name + " (";
    if (!nic.pci_bus_id.empty()) line += nic.pci_bus_id + ", ";
    line += to_string(nic.locality);
    if (nic.locality == Locality::kOtherNumaNode) {
      line += ", distance " + std::to_string(nic.distance);
    }
    line += ')';
    separator = ", ";
  }
  if (ranking.nics.empty()) line += " none";
  return line;
}

}  // namespace loom::topo
