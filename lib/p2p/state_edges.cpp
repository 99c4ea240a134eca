// The record of state edges taken (state_edges.hpp): debug builds only.
#include "p2p/state_edges.hpp"

#include <atomic>

namespace loom::p2p {
namespace {

#ifndef NDEBUG
// The registry: one bit set per machine, indexed by Machine.
using AtomicEdgeSet = std::array<std::atomic<std::uint64_t>, kEdgeWords>;
std::array<AtomicEdgeSet, 3> registry{};

EdgeSet load(const AtomicEdgeSet& set) noexcept {
  EdgeSet out{};
  for (std::size_t i = 0; i < kEdgeWords; ++i) out[i] = set[i].load(std::memory_order_relaxed);
  return out;
}
#endif

}  // namespace

namespace detail {
void note_edge([[maybe_unused]] Machine machine, [[maybe_unused]] unsigned index) noexcept {
#ifndef NDEBUG
  registry[static_cast<std::size_t>(machine)][index / 64].fetch_or(std::uint64_t{1} << (index % 64),
                                                                   std::memory_order_relaxed);
#endif
}
}  // namespace detail

EdgesTaken edges_taken() noexcept {
  EdgesTaken taken;
#ifndef NDEBUG
  taken.send = load(registry[static_cast<std::size_t>(Machine::kSend)]);
  taken.recv = load(registry[static_cast<std::size_t>(Machine::kRecv)]);
  taken.ready_to_send = load(registry[static_cast<std::size_t>(Machine::kReadyToSend)]);
#endif
  return taken;
}

void reset_edges_taken() noexcept {
#ifndef NDEBUG
  for (AtomicEdgeSet& set : registry)
    for (std::atomic<std::uint64_t>& word : set) word.store(0, std::memory_order_relaxed);
#endif
}

}  // namespace loom::p2p
