// Sizes of the structs the data path touches per message, pinned as UCX's test_obj_size does:
// a field added to a request or a part shows up here, in review, with its cost. And the part
// state tables: every state is reachable, only kDone and kFailed are final.
#include <catch2/catch.hpp>

#include "p2p/part_state.hpp"
#include "p2p/request.hpp"

namespace loom::p2p {
namespace {

TEST_CASE("p2p hot structs keep their sizes", "[layout]") {
  // fi_context2 (the provider's scratch) and the completion handler.
  CHECK(sizeof(ofi::OpContext) == 72);
  CHECK(sizeof(Part) == 56);
  // kMaxParts parts and op contexts, the error string, and 8 bytes of counters, states and the
  // generation the user's handle is checked against.
  CHECK(sizeof(Request) == 1096);
}

template <typename State>
void check_table(State first, State last) {
  const auto count = static_cast<unsigned>(last) + 1;
  std::vector<bool> reached(count, false);
  reached[static_cast<unsigned>(first)] = true;
  for (unsigned from = 0; from < count; ++from) {
    const auto f = static_cast<State>(from);
    bool any = false;
    for (unsigned to = 0; to < count; ++to) {
      if (!legal(f, static_cast<State>(to))) continue;
      any = true;
      reached[to] = true;
      CHECK(to != from);  // a transition changes the state
    }
    INFO("state " << from);
    CHECK(any != terminal(f));  // only final states go nowhere
  }
  for (unsigned s = 0; s < count; ++s) {
    INFO("state " << s);
    CHECK(reached[s]);
  }
}

TEST_CASE("p2p part state tables: every state reachable, only done and failed final", "[layout]") {
  check_table(SendState::kAwaitingClearance, SendState::kFailed);
  check_table(RecvState::kAwaitingPost, RecvState::kFailed);
  CHECK_FALSE(legal(SendState::kDone, SendState::kFailed));
  CHECK_FALSE(legal(RecvState::kFailed, RecvState::kDone));
  CHECK(legal(SendState::kAwaitingClearance, SendState::kDone));  // sent ahead: done when it left
  CHECK(legal(RecvState::kQuiet, RecvState::kDone));
  CHECK_FALSE(legal(RecvState::kArrived, RecvState::kCleared));
}

}  // namespace
}  // namespace loom::p2p
