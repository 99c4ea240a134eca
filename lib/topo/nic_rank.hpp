// Rail choice: which NICs a process should use first, by closeness to its CPUs or to its GPU.
// lib/topo knows nothing of libfabric: the caller maps each NIC (lib/ofi's NicAttributes) to a
// NicCandidate and takes rails from the front of the ranking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "topo/topology.hpp"

namespace loom::topo {

struct NicCandidate {
  std::string name;        // libfabric domain name: "eth0", "mlx5_0", "rdmap16s27", "cxi0", "lo"
  std::string pci_bus_id;  // "0000:10:1b.0"; empty when the provider reports none
};

// How close a NIC is to the target, closest first. The order of the enumerators is the order
// of the ranking.
enum class Locality : std::uint8_t {
  kSamePcieSwitch,  // GPU target: the NIC shares a PCIe switch (a PCI-to-PCI bridge) with it
  kSameHostBridge,  // GPU target: same host bridge (root complex), different switch/root port
  kSameNumaNode,    // the NIC's CPU locality intersects the target's CPUs
  kOtherNumaNode,   // elsewhere on the machine: ordered by NUMA distance
  kNoLocality,      // not in the topology (lo, veth, shm, a VF hwloc skipped): last
};

[[nodiscard]] std::string_view to_string(Locality locality) noexcept;

struct NicLocality {
  std::size_t index = 0;   // position in the candidate list given
  std::string name;        // the candidate's name
  std::string pci_bus_id;  // the NIC's PCI device as found in the topology; empty if none
  Locality locality = Locality::kNoLocality;
  // Within one locality, smaller is closer: PCI hops between NIC and GPU for the two PCI
  // levels; for kOtherNumaNode the NUMA distance (hwloc's latency matrix, or else 0 for the
  // target's package and 1 for another); 0 otherwise. Ties keep the given order.
  std::uint64_t distance = 0;
};

struct NicRanking {
  std::string target;             // "GPU 0000:13:00.0", "CPUs 0-7", ...: what the NICs are close to
  std::string topology;           // Topology::source(): "this machine" or the XML file
  std::vector<NicLocality> nics;  // closest first
};

// Ranks `nics` for threads running on `cpus`.
[[nodiscard]] NicRanking rank_nics(const Topology& topology, std::span<const NicCandidate> nics,
                                   const CpuSet& cpus);
// Ranks `nics` for the calling thread's binding (the whole machine when it is unbound).
[[nodiscard]] NicRanking rank_nics(const Topology& topology, std::span<const NicCandidate> nics);
// Ranks `nics` for the GPU at `gpu_pci_bus_id` (any PCI device is accepted: GPUs are class
// 0x03xx, accelerators 0x12xx). Throws loom::Error{"topology"} when the topology has no PCI
// device at that bus id: rails far from the GPU would silently cost bandwidth.
[[nodiscard]] NicRanking rank_nics_for_gpu(const Topology& topology,
                                           std::span<const NicCandidate> nics,
                                           std::string_view gpu_pci_bus_id);

// One line for the info log: "NIC order near GPU 0000:13:00.0 (topology dgx.xml): mlx5_0
// (0000:15:00.0, same PCIe switch), mlx5_2 (0000:95:00.0, other NUMA node, distance 21), lo
// (no locality)".
[[nodiscard]] std::string describe(const NicRanking& ranking);

}  // namespace loom::topo
