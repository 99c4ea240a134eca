// Entry point libfabric's loader looks for in lib<name>-fi.so, and what is shared by all objects.
#include <cstdio>

#include "common.hpp"
#include "info.hpp"
#include "objects.hpp"

namespace epmr {
namespace {

int open_fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  return Fabric::open(attr, fabric, context);
}

void cleanup() {}

fi_provider g_provider = {
    .version = kProviderVersion,
    .fi_version = kApiVersion,
    .context = {},
    .name = kProviderName,
    .getinfo = getinfo,
    .fabric = open_fabric,
    .cleanup = cleanup,
};

constexpr const char* kVerboseParam = "verbose";
bool g_verbose = false;
Knobs g_knobs;

// Registered so that `fi_info -e` documents them; read as FI_EPMR_<name>.
void read_knobs(fi_provider& prov) {
  fi_param_define(&prov, "fail_recv_after", FI_PARAM_SIZE_T,
                  "Test knob: untagged receives after each endpoint's first N fail with "
                  "-FI_EIO (default: 0, never)");
  fi_param_define(&prov, "fail_recv_every", FI_PARAM_SIZE_T,
                  "Test knob: every N-th untagged receive that reposts a context fails with "
                  "-FI_EAGAIN (default: 0, never)");
  fi_param_define(&prov, "fail_tinject_every", FI_PARAM_SIZE_T,
                  "Test knob: every N-th tagged inject of an endpoint fails with -FI_EAGAIN "
                  "(default: 0, never)");
  fi_param_define(&prov, "rx_cq_data", FI_PARAM_BOOL,
                  "Test knob: require FI_RX_CQ_DATA: remote writes with CQ data consume a "
                  "zero-length receive and wait for one (default: no)");
  fi_param_define(&prov, "max_msg_size", FI_PARAM_SIZE_T,
                  "Test knob: report this max_msg_size and refuse longer transfers with "
                  "-FI_EINVAL (default: 0, tcp;ofi_rxm's)");
  size_t value = 0;
  if (fi_param_get_size_t(&prov, "max_msg_size", &value) == 0) g_knobs.max_msg_size = value;
  value = 0;
  if (fi_param_get_size_t(&prov, "fail_recv_after", &value) == 0) g_knobs.fail_recv_after = value;
  value = 0;
  if (fi_param_get_size_t(&prov, "fail_recv_every", &value) == 0) g_knobs.fail_recv_every = value;
  value = 0;
  if (fi_param_get_size_t(&prov, "fail_tinject_every", &value) == 0) {
    g_knobs.fail_tinject_every = value;
  }
  int flag = 0;
  if (fi_param_get_bool(&prov, "rx_cq_data", &flag) == 0) g_knobs.rx_cq_data = flag != 0;
}

}  // namespace

fi_provider& provider() {
  return g_provider;
}

const Knobs& knobs() noexcept {
  return g_knobs;
}

int refuse(const char* reason, int code) noexcept {
  if (g_verbose) std::fprintf(stderr, "epmr: refused: %s (%s)\n", reason, fi_strerror(-code));
  return code;
}

int refuse_desc(const char* op) noexcept {
  if (g_verbose)
    std::fprintf(stderr,
                 "epmr: refused: %s: a descriptor is missing, or its MR is not enabled or not "
                 "bound to this endpoint\n",
                 op);
  return -FI_EINVAL;
}

int no_ops_open(fid*, const char*, uint64_t, void**, void*) {
  return -FI_ENOSYS;
}
int no_bind(fid*, fid*, uint64_t) {
  return -FI_ENOSYS;
}
int no_control(fid*, int, void*) {
  return -FI_ENOSYS;
}

}  // namespace epmr

extern "C" FI_EXT_INI {
  auto& prov = epmr::provider();
  // Read as FI_EPMR_VERBOSE; registering it also makes `fi_info -e` document it.
  fi_param_define(&prov, epmr::kVerboseParam, FI_PARAM_BOOL,
                  "Print to stderr why epmr refused a call (default: no)");
  int verbose = 0;
  if (fi_param_get_bool(&prov, epmr::kVerboseParam, &verbose) == 0) epmr::g_verbose = verbose != 0;
  epmr::read_knobs(prov);
  return &prov;
}
