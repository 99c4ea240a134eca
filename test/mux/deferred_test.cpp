// Deferred work and the lanes that run it: a post kicks the registry only when a lane other
// than its own holds deferred work (LaneRegistry::deferred_elsewhere). Its own lane's work waits
// for that lane's progress; sending every post through the registry's lock and lane list for it
// cost each small message about 45 instructions (scripts/cost.sh) and ran nothing.
#include <chrono>

#include <catch2/catch.hpp>

#include "loom/config.hpp"
#include "mux/lane_registry.hpp"
#include "ofi/nic.hpp"
#include "ofi/selection.hpp"
#include "support/counting_port.hpp"

namespace loom::test {
namespace {

TEST_CASE("mux a lane's own deferred work does not send its posts to the other lanes", "[local]") {
  auto nics = ofi::open_nics(Config::from_env());
  // No thread: a background turn progresses idle lanes (running their deferred work) while it
  // holds the registry lock, which run_deferred_elsewhere only tries, so it raced this test's
  // calls (CI failed it once).
  mux::LaneRegistry registry({nics.front().get()}, mux::LaneShape{}, 0,
                             std::chrono::milliseconds(50), std::chrono::milliseconds(1000),
                             mux::TurnRunner::kCallers);
  constexpr std::uint64_t kPeer = 7;
  mux::Lane& send = registry.join(kPeer, mux::Direction::kSend, registry.default_placement());
  mux::Lane& recv = registry.join(kPeer, mux::Direction::kRecv, registry.default_placement());
  REQUIRE(&send != &recv);
  {
    AttachedCounter sender(send);
    AttachedCounter receiver(recv);

    REQUIRE_FALSE(registry.deferred_elsewhere(send));
    sender.defer();
    // Only the sender's own lane holds work: nothing for its posts to run elsewhere, while the
    // receive lane's posts would find it.
    CHECK(registry.any_deferred());
    CHECK_FALSE(registry.deferred_elsewhere(send));
    CHECK(registry.deferred_elsewhere(recv));
    registry.run_deferred_elsewhere(send);
    CHECK(sender.runs() == 0);

    receiver.defer();
    CHECK(registry.deferred_elsewhere(send));
    registry.run_deferred_elsewhere(send);
    CHECK(receiver.runs() == 1);
    CHECK(sender.runs() == 0);
    CHECK_FALSE(registry.deferred_elsewhere(send));

    registry.run_deferred_elsewhere(recv);
    CHECK(sender.runs() == 1);
    CHECK_FALSE(registry.any_deferred());
  }
  registry.leave(send, kPeer, mux::Direction::kSend);
  registry.leave(recv, kPeer, mux::Direction::kRecv);
}

}  // namespace
}  // namespace loom::test
