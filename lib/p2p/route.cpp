#include "p2p/route.hpp"

#include <algorithm>

#include "ofi/subnet.hpp"

namespace loom::p2p {

Route route_to(std::span<ofi::Nic* const> nics, const mux::LaneRegistry& lanes,
               const std::vector<EndpointName>& listener) {
  Route route;
  std::vector<ofi::Nic*> matching;
  std::string via;
  bool any_subnet = false;
  for (std::size_t a = 0; a < listener.size(); ++a) {
    for (ofi::Nic* nic : nics) {
      const ofi::Subnet* subnet = nic->subnet();
      any_subnet = any_subnet || subnet != nullptr;
      if (subnet == nullptr || !subnet->contains(listener[a])) continue;
      if (std::find(matching.begin(), matching.end(), nic) != matching.end()) continue;
      if (matching.empty()) route.address = a;
      matching.push_back(nic);
      via += (via.empty() ? "" : ", ") + nic->attributes().domain + " (" + subnet->text() +
             " holds " + ofi::address_text(listener[a]) + ")";
    }
  }
  const auto& shape = lanes.shape();
  if (!matching.empty()) {
    route.placement =
        ofi::RailPlacement::round_robin(matching, shape.data_rails, shape.control_rails);
    route.description = "direct over " + via;
    return route;
  }
  route.placement = lanes.default_placement();
  if (!any_subnet) {
    route.description = "over " + nics.front()->attributes().domain;
    return route;
  }
  std::string theirs, ours;
  for (const EndpointName& a : listener)
    theirs += (theirs.empty() ? "" : ", ") + ofi::address_text(a);
  for (const ofi::Nic* nic : nics) {
    ours += (ours.empty() ? "" : ", ") + nic->attributes().domain + " " +
            (nic->subnet() != nullptr ? nic->subnet()->text() : std::string("(no subnet)"));
  }
  route.description = "routed: no local subnet (" + ours + ") holds a listener address (" + theirs +
                      "); trying " + ofi::address_text(listener.front()) + " from " +
                      nics.front()->attributes().domain;
  return route;
}

ofi::Nic* nic_on_subnet_of(std::span<ofi::Nic* const> nics, std::span<const std::byte> peer) {
  for (ofi::Nic* nic : nics) {
    if (nic->subnet() != nullptr && nic->subnet()->contains(peer)) return nic;
  }
  return nullptr;
}

ofi::RailPlacement placement_facing(std::span<ofi::Nic* const> nics, const mux::LaneRegistry& lanes,
                                    const LaneAddresses& peer) {
  ofi::RailPlacement placement = lanes.default_placement();
  auto face = [&](std::vector<ofi::Nic*>& rails, const std::vector<EndpointName>& theirs) {
    for (std::size_t i = 0; i < rails.size() && i < theirs.size(); ++i) {
      if (ofi::Nic* nic = nic_on_subnet_of(nics, theirs[i])) rails[i] = nic;
    }
  };
  face(placement.data, peer.data);
  face(placement.control, peer.control);
  return placement;
}

}  // namespace loom::p2p
