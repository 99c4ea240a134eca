#include "topo/topology.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "loom/error.hpp"
#include "util/log.hpp"

namespace loom::topo {
namespace {

[[noreturn]] void fail(std::string detail, int code = 0) {
  throw Error("topology", "", code, std::move(detail));
}

std::string errno_text(int code) {
  return code != 0 ? std::strerror(code) : "unknown error";
}

// hwloc prints its own XML diagnostics to stderr; loom's error names the file and says why, so
// the caller can act on it without reading hwloc's output.
void check_xml_file(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    fail("hwloc XML topology '" + path + "' (LOOM_TOPOLOGY_XML) does not exist", ENOENT);
  }
  if (!std::filesystem::is_regular_file(status)) {
    fail("hwloc XML topology '" + path + "' (LOOM_TOPOLOGY_XML) is not a regular file", EINVAL);
  }
}

// A library built against one hwloc ABI and run with another reads object fields wrongly.
void check_hwloc_abi() {
  const unsigned runtime = hwloc_get_api_version();
  if ((runtime >> 16) != (HWLOC_API_VERSION >> 16)) {
    char text[128];
    std::snprintf(text, sizeof text, "built for hwloc API 0x%x but running with 0x%x",
                  static_cast<unsigned>(HWLOC_API_VERSION), runtime);
    fail(text);
  }
}

// Discovery plugins loom does not need, skipped when loading this machine. The Linux backend
// reads the PCI tree and the network/verbs OS devices from sysfs by itself. "pci" would add
// libpciaccess, whose device-name cache is lost (a leak under LSan) when hwloc unloads the
// plugin; the GPU runtimes initialize drivers inside this process and can take seconds,
// while GPU locality needs only the GPU's PCI bus id. A component this hwloc lacks is refused
// (EINVAL): nothing to skip then.
void skip_optional_components(hwloc_topology_t topology) {
  for (const char* name : {"pci", "opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"}) {
    (void)hwloc_topology_set_components(topology, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, name);
  }
}

}  // namespace

CpuSet::CpuSet() : bits_(hwloc_bitmap_alloc()) {
  if (!bits_) fail("hwloc_bitmap_alloc failed", ENOMEM);
}

CpuSet CpuSet::parse(std::string_view text) {
  CpuSet set;
  const std::string copy(text);  // hwloc wants a terminated string
  const bool hex = copy.starts_with("0x") || copy.starts_with("0X");
  const int rc = hex ? hwloc_bitmap_sscanf(set.get(), copy.c_str())
                     : hwloc_bitmap_list_sscanf(set.get(), copy.c_str());
  if (rc != 0 || copy.empty()) {
    fail("'" + copy + "' is not a CPU set (expected a list like 0-7,16-23 or a mask like 0xff)",
         EINVAL);
  }
  return set;
}

CpuSet CpuSet::copy_of(hwloc_const_bitmap_t bits) {
  CpuSet set;
  if (bits != nullptr && hwloc_bitmap_copy(set.get(), bits) != 0) fail("hwloc_bitmap_copy failed");
  return set;
}

CpuSet& CpuSet::operator=(const CpuSet& other) {
  if (this != &other) *this = copy_of(other.get());  // also revives a moved-from set
  return *this;
}

std::string CpuSet::to_string() const {
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, get()) < 0 || text == nullptr) return "?";
  std::string result(text);
  std::free(text);  // hwloc allocates the text with malloc
  return result;
}

Topology::Topology(const std::string& xml_path)
    : source_(xml_path.empty() ? std::string("this machine") : xml_path) {
  check_hwloc_abi();
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) fail("hwloc_topology_init failed: " + errno_text(errno));
  topology_.reset(raw);

  // hwloc drops I/O objects by default. "Important" keeps bridges leading to devices, PCI
  // devices of the classes that matter (network, GPU, storage, accelerators) and their OS
  // devices, without the hundreds of chipset functions of a big box.
  if (hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) {
    fail("hwloc_topology_set_io_types_filter failed: " + errno_text(errno));
  }
  if (xml_path.empty()) {
    skip_optional_components(raw);
  } else {
    check_xml_file(xml_path);
    if (hwloc_topology_set_xml(raw, xml_path.c_str()) != 0) {
      const int code = errno;
      fail("hwloc XML topology '" + xml_path +
               "' (LOOM_TOPOLOGY_XML) is malformed or not an hwloc XML export "
               "(hwloc_topology_set_xml: " +
               errno_text(code) + ")",
           code);
    }
  }
  if (hwloc_topology_load(raw) != 0) {
    const int code = errno;
    if (!xml_path.empty()) {
      fail("hwloc XML topology '" + xml_path +
               "' (LOOM_TOPOLOGY_XML) is malformed or inconsistent (hwloc_topology_load: " +
               errno_text(code) + ")",
           code);
    }
    fail("hwloc_topology_load of this machine failed: " + errno_text(code), code);
  }
  util::log().debug("topology: loaded {} ({} PUs, {} NUMA nodes, {} PCI devices)", source_,
                    hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PU),
                    hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE),
                    hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PCI_DEVICE));
}

bool Topology::is_this_system() const noexcept {
  return hwloc_topology_is_thissystem(get()) != 0;
}

CpuSet Topology::machine_cpuset() const {
  return CpuSet::copy_of(hwloc_get_root_obj(get())->cpuset);
}

CpuSet Topology::thread_cpuset() const {
  CpuSet machine = machine_cpuset();
  if (!is_this_system()) return machine;  // a recorded box: this thread does not run on it
  CpuSet bound;
  if (hwloc_get_cpubind(get(), bound.get(), HWLOC_CPUBIND_THREAD) != 0) {
    util::log().debug("topology: thread binding unknown ({}); using the whole machine",
                      errno_text(errno));
    return machine;
  }
  hwloc_bitmap_and(bound.get(), bound.get(), machine.get());
  return bound.empty() ? machine : bound;
}

hwloc_obj_t Topology::pci_device(std::string_view bus_id) const {
  if (bus_id.empty()) return nullptr;
  const std::string copy(bus_id);
  return hwloc_get_pcidev_by_busidstring(get(), copy.c_str());
}

hwloc_obj_t Topology::os_device(std::string_view name) const {
  if (name.empty()) return nullptr;
  for (hwloc_obj_t dev = hwloc_get_next_osdev(get(), nullptr); dev != nullptr;
       dev = hwloc_get_next_osdev(get(), dev)) {
    if (dev->name != nullptr && name == dev->name) return dev;
  }
  return nullptr;
}

std::string pci_bus_id_of(const hwloc_obj* pci) {
  if (pci == nullptr) return {};
  const bool is_pci =
      pci->type == HWLOC_OBJ_PCI_DEVICE ||
      (pci->type == HWLOC_OBJ_BRIDGE && pci->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI);
  if (!is_pci) return {};
  const auto& dev =
      pci->type == HWLOC_OBJ_PCI_DEVICE ? pci->attr->pcidev : pci->attr->bridge.upstream.pci;
  char text[32];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.%x", dev.domain, dev.bus, dev.dev, dev.func);
  return text;
}

}  // namespace loom::topo
