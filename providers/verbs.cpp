// verbs (InfiniBand/RoCE), reached as "verbs;ofi_rxm" for RDM endpoints; rxm's settings are
// tcp's (providers/rxm.hpp), as the same rxm code runs over both.
// Device limits come from rdma-core when loom is built with it.
#include "loom_build_config.h"
#include "providers/profile.hpp"
#include "providers/rxm.hpp"

#if LOOM_HAVE_IBVERBS
#include <string>

#include <infiniband/verbs.h>
#endif

namespace loom::providers {
namespace {

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
constexpr auto kDeviceLimits = verbs_device_limits;
#else
constexpr std::optional<DeviceLimits> (*kDeviceLimits)(std::string_view) = nullptr;
#endif

}  // namespace

const Profile kVerbsProfile{
    .family = "verbs",
    .summary = "verbs;ofi_rxm: per-connection receive buffers; device limits from rdma-core",
    .settings = kRxmSettings,
    .device_limits = kDeviceLimits,
    .inject_writes = false,  // rxm's inject copies what RDMA would write from the user's buffer
    .completion_threading = true,
};

}  // namespace loom::providers
