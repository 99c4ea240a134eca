// AWS EFA: RDM only, 4-byte remote CQ data (loom's immediate layout fits 32 bits for this
// reason), provider keys. No environment defaults: libfabric turns device RDMA on by itself
// where the device has RDMA read (p4d, p5, trn), and FI_EFA_USE_DEVICE_RDMA=1 on a
// first-generation device (c5n, p3dn) makes libfabric abort() the process, where its default
// emulates writes and runs.
#include "providers/profile.hpp"

namespace loom::providers {

const Profile kEfaProfile{
    .family = "efa",
    .summary = "EFA: RDM endpoints, 32-bit remote CQ data, device RDMA where the device has it",
    .settings = {},
};

}  // namespace loom::providers
