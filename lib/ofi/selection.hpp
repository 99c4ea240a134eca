// Provider selection: one fi_getinfo with the hints loom handles, then one Nic per domain.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/config.hpp"
#include "ofi/nic.hpp"

namespace loom::ofi {

// What open_nics asks the provider to inject beyond LOOM_INJECT_MAX: room for a control
// message riding along a message of that size (mux/carried_control.hpp).
inline constexpr std::size_t kInjectHeadroom = 1024;

// Opens the NICs `config` asks for (LOOM_PROVIDER, LOOM_NICS, LOOM_LOOPBACK_ONLY; FI_PROVIDER
// applies inside libfabric), all of one provider, in the order LOOM_NICS gives or libfabric
// lists them. When nothing matches, throws loom::Error listing every provider libfabric knows
// and why each was refused.
//
// Device memory: in a build with CUDA (and LOOM_DEVICE_MEMORY=1), the chosen provider is asked
// again with FI_HMEM and FI_MR_HMEM; a NIC it grants them on is opened from that entry, any
// other with its host-only entry and a logged reason (NicAttributes::device_memory_note).
//
// Inject size: a provider that reports less than LOOM_INJECT_MAX + kInjectHeadroom is asked for
// that much (tcp;ofi_rxm reports 64 bytes unless asked), then for less (selection.cpp); one that
// refuses every ask keeps its own.
[[nodiscard]] std::vector<std::unique_ptr<Nic>> open_nics(const Config& config);

// The provider settings loom recommends for the families `config` names (LOOM_PROVIDER, else
// FI_PROVIDER), or for every family when it names none. Applying them is the application's
// call: loom only logs those the environment lacks, once per process, at open_nics.
[[nodiscard]] std::vector<ProviderSetting> recommended_settings(const Config& config);

// What a process killed with its endpoints open left on this host, removed once it is gone
// (providers::remove_leftovers_of).
std::size_t remove_process_leftovers(int pid) noexcept;

// ---- the pieces of the selection, for tests.

// The API version loom asks fi_getinfo for: 1.20 where both the headers loom was compiled with
// and the libfabric loaded (fi_version()) have FI_MR_DMABUF, else 1.17.
[[nodiscard]] std::uint32_t api_version() noexcept;
// The hints: FI_EP_RDM, loom's caps, modes and MR modes, FI_THREAD_SAFE, FI_AV_TABLE, the
// provider LOOM_PROVIDER names; `device_memory` adds FI_HMEM and FI_MR_HMEM.
[[nodiscard]] InfoPtr make_hints(const Config& config, bool device_memory);
// Why `provider` cannot give device memory on `domain`, judged from fi_getinfo's unfiltered
// list `all`.
[[nodiscard]] std::string device_memory_refusal(const fi_info* all, std::string_view provider,
                                                std::string_view domain);
[[nodiscard]] const char* provider_of(const fi_info& info) noexcept;
[[nodiscard]] const char* domain_of(const fi_info& info) noexcept;

}  // namespace loom::ofi
