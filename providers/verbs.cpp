// verbs (InfiniBand/RoCE), reached as "verbs;ofi_rxm" for RDM endpoints. rxm's shared receive
// queue holds 4096 registered 16 KiB bounce buffers per endpoint; without it each connection
// gets 128. A loom lane's endpoints each talk to one peer (communicators share lanes, not
// endpoints across peers), so per-connection buffers are the smaller pool, as on tcp;ofi_rxm
// where the same rxm code runs (README, Providers).
// Device limits come from rdma-core when loom is built with it.
#include "loom_build_config.h"
#include "providers/profile.hpp"

#if LOOM_HAVE_IBVERBS
#include <string>

#include <infiniband/verbs.h>
#endif

namespace loom::providers {
namespace {

constexpr ProviderSetting kVerbsEnv[] = {
    {"FI_OFI_RXM_USE_SRX", "1",
     "one shared receive queue per endpoint: lanes serve every peer, so per-connection "
     "buffers would cost each peer (tcp: 6-9 MiB per peer at 16-32 peers, against 0.2)"},
    {"FI_OFI_RXM_MSG_RX_SIZE", "256",
     "that queue's bounce buffers; rxm's 4096 for a shared queue cost 250 MB and 190 ms per "
     "process for no gain (fi_p2p_bw 4 KiB-16 MiB within noise)"},
};

#if LOOM_HAVE_IBVERBS
std::optional<DeviceLimits> verbs_device_limits(std::string_view domain_name) {
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices == nullptr) return std::nullopt;
  std::optional<DeviceLimits> limits;
  for (int i = 0; i < count && !limits; ++i) {
    // libfabric names verbs RDM domains after the device, e.g. "mlx5_0".
    if (domain_name.rfind(ibv_get_device_name(devices[i]), 0) != 0) continue;
    ibv_context* context = ibv_open_device(devices[i]);
    if (context == nullptr) continue;
    ibv_device_attr attr{};
    if (ibv_query_device(context, &attr) == 0) {
      limits = DeviceLimits{.max_queue_depth = static_cast<std::size_t>(attr.max_qp_wr),
                            .max_cq_entries = static_cast<std::size_t>(attr.max_cqe),
                            .max_endpoints = static_cast<std::size_t>(attr.max_qp)};
    }
    ibv_close_device(context);
  }
  ibv_free_device_list(devices);
  return limits;
}
#endif

}  // namespace

const Profile kVerbsProfile {
  .family = "verbs",
  .summary = "verbs;ofi_rxm: per-connection receive buffers; device limits from rdma-core",
  .settings = kVerbsEnv,
#if LOOM_HAVE_IBVERBS
  .device_limits = verbs_device_limits,
#endif
};

}  // namespace loom::providers
