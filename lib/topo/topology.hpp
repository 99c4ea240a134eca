// The machine's topology as hwloc sees it: CPUs, NUMA nodes and the PCI tree with its OS devices
// (NICs, GPUs). Loaded once at setup, from this machine or from an hwloc XML export
// (LOOM_TOPOLOGY_XML), so tests and odd boxes can replay a recorded layout.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include <hwloc.h>

namespace loom::topo {

// Owner of one hwloc bitmap, used here as a CPU set. A moved-from CpuSet may only be assigned
// to or destroyed.
class CpuSet {
 public:
  CpuSet();  // empty
  // "0-7,16-23" (taskset -c / hwloc list syntax) or hwloc's "0x000000ff" form; throws
  // loom::Error{"topology"} on text that is neither.
  static CpuSet parse(std::string_view text);
  static CpuSet copy_of(hwloc_const_bitmap_t bits);

  CpuSet(const CpuSet& other) : CpuSet(copy_of(other.get())) {}
  CpuSet& operator=(const CpuSet& other);
  CpuSet(CpuSet&&) noexcept = default;
  CpuSet& operator=(CpuSet&&) noexcept = default;

  [[nodiscard]] bool empty() const { return hwloc_bitmap_iszero(get()) != 0; }
  [[nodiscard]] std::string to_string() const;  // list syntax: "0-7,16-23"
  [[nodiscard]] hwloc_const_bitmap_t get() const noexcept { return bits_.get(); }
  [[nodiscard]] hwloc_bitmap_t get() noexcept { return bits_.get(); }

 private:
  struct Free {
    void operator()(hwloc_bitmap_t bits) const noexcept { hwloc_bitmap_free(bits); }
  };
  std::unique_ptr<std::remove_pointer_t<hwloc_bitmap_t>, Free> bits_;
};

// Owner of a loaded hwloc topology. Read-only after construction, so one Topology may be
// queried from several threads at once (hwloc's read functions are thread-safe).
class Topology {
 public:
  // Loads `xml_path` (an hwloc v2 XML export) or, when it is empty, this machine. I/O devices
  // (PCI devices, bridges and OS devices) are kept, since NIC and GPU locality is the point.
  // Throws loom::Error{"topology"} naming the file for a missing or malformed XML.
  explicit Topology(const std::string& xml_path = {});

  [[nodiscard]] hwloc_topology_t get() const noexcept { return topology_.get(); }
  // "this machine" or the XML path: for log lines and errors.
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  // False for an XML topology: there the calling thread's binding means nothing.
  [[nodiscard]] bool is_this_system() const noexcept;

  // Every CPU of the topology.
  [[nodiscard]] CpuSet machine_cpuset() const;
  // The calling thread's binding, limited to this topology's CPUs; the whole machine when the
  // thread is unbound or the binding cannot be known (XML topologies, no OS support).
  [[nodiscard]] CpuSet thread_cpuset() const;

  // The PCI device at `bus_id` ("0000:10:1b.0", "10:1b.0" or CUDA's "00000000:10:1B.0"), or
  // null when the topology has none (or the text is no bus id).
  [[nodiscard]] hwloc_obj_t pci_device(std::string_view bus_id) const;
  // The OS device named `name` ("eth0", "mlx5_0", "rdmap16s27"), or null. Any OS device type
  // matches: the names of block, GPU and DMA devices never collide with a NIC's, and hwloc 3
  // changed how the types are spelled.
  [[nodiscard]] hwloc_obj_t os_device(std::string_view name) const;

 private:
  struct Destroy {
    void operator()(hwloc_topology_t topology) const noexcept { hwloc_topology_destroy(topology); }
  };
  std::unique_ptr<std::remove_pointer_t<hwloc_topology_t>, Destroy> topology_;
  std::string source_;
};

// "0000:10:1b.0" for a PCI device or bridge object.
[[nodiscard]] std::string pci_bus_id_of(const hwloc_obj* pci);

}  // namespace loom::topo
