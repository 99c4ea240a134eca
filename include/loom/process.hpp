// What a process does around loom rather than with it: the provider settings to apply before
// its first Context, and the clean-up after a loom process that was killed.
#pragma once

#include <cstddef>
#include <vector>

#include "loom/config.hpp"

namespace loom {

// The libfabric provider parameters loom recommends for the providers `config` names
// (LOOM_PROVIDER, else FI_PROVIDER; all of them when it names none). Providers read their
// parameters only from the environment, and loom never writes it (a write races every other
// thread reading it): an application that wants them sets those its environment lacks before
// it starts threads or makes a Context, as fi_p2p_bw does, and the NCCL plugin (the
// application where NCCL loads it) at its first init. loom logs (info) the ones missing when
// its first context opens.
[[nodiscard]] std::vector<ProviderSetting> recommended_provider_settings(const Config& config);

// For a launcher or supervisor whose loom process was killed with its endpoints open: removes
// what that process left on this host for later ones to trip over (the shm provider's regions
// in /dev/shm, 16 MB each, which make a later process given the same pid fail to open its
// endpoints). Does nothing while process `pid` exists, an unreaped child included: call it
// after waitpid. Returns how many objects it removed.
std::size_t remove_process_leftovers(int pid) noexcept;

}  // namespace loom
