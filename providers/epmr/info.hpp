// Translation between the fi_info epmr reports and the tcp;ofi_rxm fi_info underneath it.
#pragma once

#include "common.hpp"

namespace epmr {

// The provider's getinfo entry point.
int getinfo(uint32_t version, const char* node, const char* service, uint64_t flags,
            const fi_info* hints, fi_info** info);

// What the layer below needs in order to open objects for an info epmr reported: the inner
// provider's own view (its version and mr_mode) of the same fabric and domain.
struct InnerView {
  uint32_t prov_version = 0;
  uint64_t mr_mode = 0;
};

// Asks tcp;ofi_rxm about the fabric (and, if given, the domain) that `outer` names.
// Returns 0 or a negative libfabric error.
int query_inner(const fi_info& outer, InnerView& view);
int query_inner_fabric(const fi_fabric_attr& outer, InfoPtr& inner);

// A copy of an epmr info, made acceptable to tcp;ofi_rxm (provider name, version, mr_mode).
InfoPtr to_inner_info(const fi_info& outer, const InnerView& view);

}  // namespace epmr
