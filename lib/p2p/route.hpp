// Routing on direct-connect meshes: which local NICs face a peer. A NIC whose IP subnet holds a
// peer's address reaches it without a router, so a connector sends to the listener address
// that one of its subnets holds and puts its lane's rails on the NICs facing it, and an
// acceptor puts each rail on the NIC facing the connector's rail. With no subnets (shm, efa,
// cxi) any NIC reaches any peer and the lane registry's default placement stands.
// Pure functions of the context's NICs: they hold no state and take no lock.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "mux/lane_registry.hpp"
#include "ofi/nic.hpp"
#include "ofi/rail_set.hpp"
#include "p2p/messages.hpp"

namespace loom::p2p {

// How a connector reaches a listener: which of the handle's addresses it sends to, and where
// its lane's rails go.
struct Route {
  std::size_t address = 0;  // index into the handle's addresses
  ofi::RailPlacement placement;
  std::string description;  // for logs and errors
};

// Picks the listener address a local subnet holds (the first one, else the handle's first,
// routed) and the local NICs on the subnets that hold any of the listener's addresses.
[[nodiscard]] Route route_to(std::span<ofi::Nic* const> nics, const mux::LaneRegistry& lanes,
                             const std::vector<EndpointName>& listener);

// Rail i on the local NIC whose subnet holds the peer's rail i (where one does), else where
// the lane registry's default placement puts it.
[[nodiscard]] ofi::RailPlacement placement_facing(std::span<ofi::Nic* const> nics,
                                                  const mux::LaneRegistry& lanes,
                                                  const LaneAddresses& peer);

// The first of `nics` whose subnet holds `peer`'s address, or nullptr.
[[nodiscard]] ofi::Nic* nic_on_subnet_of(std::span<ofi::Nic* const> nics,
                                         std::span<const std::byte> peer);

}  // namespace loom::p2p
