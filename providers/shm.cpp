// shm: processes on one host only, one domain named "shm", string addresses, FI_MR_VIRT_ADDR.
#include "providers/profile.hpp"

namespace loom::providers {

const Profile kShmProfile{
    .family = "shm",
    .summary = "shm: single host only; one domain, no NIC",
    .env_defaults = {},
};

}  // namespace loom::providers
