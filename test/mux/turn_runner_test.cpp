// Who runs the registry's turn for the lanes nobody polls (mux::TurnRunner): a thread of the
// registry's own, or with LOOM_PROGRESS_THREAD=0 the communicators' waiting polls, and then the
// registry starts no thread (a second thread costs every socket call of the process).
#include <chrono>
#include <filesystem>
#include <iterator>
#include <thread>

#include <catch2/catch.hpp>

#include "loom/config.hpp"
#include "mux/lane_registry.hpp"
#include "ofi/nic.hpp"
#include "ofi/selection.hpp"
#include "support/counting_port.hpp"

namespace loom::test {
namespace {

std::size_t threads_now() {
  const std::filesystem::directory_iterator tasks("/proc/self/task");
  return static_cast<std::size_t>(std::distance(begin(tasks), end(tasks)));
}

constexpr std::uint64_t kPeer = 7;

// The threads a registry of `runner` added to the process with its two lanes open.
std::size_t threads_added(const std::vector<ofi::Nic*>& nics, mux::TurnRunner runner) {
  const std::size_t before = threads_now();
  mux::LaneRegistry registry(nics, mux::LaneShape{}, 0, std::chrono::milliseconds(50),
                             std::chrono::milliseconds(1000), runner);
  mux::Lane& send = registry.join(kPeer, mux::Direction::kSend, registry.default_placement());
  mux::Lane& recv = registry.join(kPeer, mux::Direction::kRecv, registry.default_placement());
  const std::size_t added = threads_now() - before;
  registry.leave(send, kPeer, mux::Direction::kSend);
  registry.leave(recv, kPeer, mux::Direction::kRecv);
  return added;
}

TEST_CASE("mux without a progress thread the registry starts none", "[local]") {
  auto opened = ofi::open_nics(Config::from_env());
  const std::vector<ofi::Nic*> nics{opened.front().get()};
  // A first registry starts whatever threads the provider (or ThreadSanitizer, at the first
  // thread) keeps for the process.
  (void)threads_added(nics, mux::TurnRunner::kThread);
  CHECK(threads_added(nics, mux::TurnRunner::kCallers) == 0);
  CHECK(threads_added(nics, mux::TurnRunner::kThread) == 1);
}

TEST_CASE("mux without a progress thread the callers run the turn once an idle period passed",
          "[local]") {
  auto nics = ofi::open_nics(Config::from_env());
  constexpr auto kIdle = std::chrono::milliseconds(200);
  mux::LaneRegistry registry({nics.front().get()}, mux::LaneShape{}, 0, kIdle,
                             std::chrono::milliseconds(1000), mux::TurnRunner::kCallers);
  mux::Lane& send = registry.join(kPeer, mux::Direction::kSend, registry.default_placement());
  mux::Lane& recv = registry.join(kPeer, mux::Direction::kRecv, registry.default_placement());
  {
    AttachedCounter receiver(recv);
    receiver.defer();
    // The receive lane is nobody's to poll: only a turn runs its deferred work.
    std::this_thread::sleep_for(kIdle + std::chrono::milliseconds(50));
    CHECK(receiver.runs() == 0);
    registry.run_due_turn();
    CHECK(receiver.runs() == 1);
    receiver.defer();
    registry.run_due_turn();  // the next turn is an idle period away
    CHECK(receiver.runs() == 1);
    std::this_thread::sleep_for(kIdle + std::chrono::milliseconds(50));
    registry.run_due_turn();
    CHECK(receiver.runs() == 2);
  }
  registry.leave(send, kPeer, mux::Direction::kSend);
  registry.leave(recv, kPeer, mux::Direction::kRecv);
}

}  // namespace
}  // namespace loom::test
