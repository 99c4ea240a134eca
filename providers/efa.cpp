// AWS EFA: RDM only, 4-byte remote CQ data (loom's immediate layout fits 32 bits for this
// reason), provider keys, device RDMA on p4d/p5/trn instances.
#include "providers/profile.hpp"

namespace loom::providers {
namespace {

constexpr EnvDefault kEfaEnv[] = {
    {"FI_EFA_USE_DEVICE_RDMA", "1",
     "rendezvous is fi_writedata; without device RDMA EFA emulates writes with send/recv copies"},
};

}  // namespace

const Profile kEfaProfile{
    .family = "efa",
    .summary = "EFA: RDM endpoints, 32-bit remote CQ data, device RDMA write enabled",
    .env_defaults = kEfaEnv,
};

}  // namespace loom::providers
