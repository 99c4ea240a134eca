// The edges of part_state.hpp's state machines taken in this process. A registry: STYLE allows
// no mutable process-wide state but a documented registry, and this is the one of its kind (a
// record kept for a test), the only mutable process-wide state of lib/p2p.
// - What it holds: per machine (a send's part, a receive's or flush's part, a send's
//   ready-to-send), the set of transitions taken since the process started or since
//   reset_edges_taken(), bit from * states + to.
// - Debug builds only: the three to() functions of request.hpp set a bit, with a relaxed
//   fetch_or, beside their trace line. Release builds (NDEBUG) record nothing, pay nothing on the
//   message path, and read an empty record.
// - Why: the edge-coverage test (test/p2p/state_edges_test.cpp) drives the protocol through
//   every legal edge of every table and names each edge no run took: a dead edge shows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "p2p/part_state.hpp"

namespace loom::p2p {

enum class Machine : std::uint8_t { kSend, kRecv, kReadyToSend };

template <typename State>
struct MachineOf;
template <>
struct MachineOf<SendState> {
  static constexpr Machine kMachine = Machine::kSend;
  static constexpr unsigned kStates = static_cast<unsigned>(SendState::kFailed) + 1;
};
template <>
struct MachineOf<RecvState> {
  static constexpr Machine kMachine = Machine::kRecv;
  static constexpr unsigned kStates = static_cast<unsigned>(RecvState::kFailed) + 1;
};
template <>
struct MachineOf<ReadyToSendState> {
  static constexpr Machine kMachine = Machine::kReadyToSend;
  static constexpr unsigned kStates = static_cast<unsigned>(ReadyToSendState::kDropped) + 1;
};

// A machine's edges, bit from * states + to.
inline constexpr std::size_t kEdgeWords = 2;
using EdgeSet = std::array<std::uint64_t, kEdgeWords>;
static_assert(MachineOf<SendState>::kStates * MachineOf<SendState>::kStates <= 64 * kEdgeWords &&
                  MachineOf<RecvState>::kStates * MachineOf<RecvState>::kStates <=
                      64 * kEdgeWords &&
                  MachineOf<ReadyToSendState>::kStates * MachineOf<ReadyToSendState>::kStates <=
                      64 * kEdgeWords,
              "every machine's edges fit its bit set");

// The edges taken, by machine (trivially copyable: a test's child process sends it over).
struct EdgesTaken {
  EdgeSet send{};
  EdgeSet recv{};
  EdgeSet ready_to_send{};
};

template <typename State>
constexpr unsigned edge_index(State from, State to) noexcept {
  return static_cast<unsigned>(from) * MachineOf<State>::kStates + static_cast<unsigned>(to);
}

constexpr bool has_edge(const EdgeSet& set, unsigned index) noexcept {
  return (set[index / 64] >> (index % 64) & 1u) != 0;
}

namespace detail {
// Sets the edge's bit (relaxed: the bits are read once the runs that set them are over).
void note_edge(Machine machine, unsigned index) noexcept;
}  // namespace detail

// Called by the to() functions of request.hpp; nothing in release builds.
template <typename State>
inline void record_edge([[maybe_unused]] State from, [[maybe_unused]] State to) noexcept {
#ifndef NDEBUG
  detail::note_edge(MachineOf<State>::kMachine, edge_index(from, to));
#endif
}

// Whether this build records edges (debug builds).
#ifdef NDEBUG
inline constexpr bool kRecordsEdges = false;
#else
inline constexpr bool kRecordsEdges = true;
#endif

// The edges taken in this process so far (none in release builds).
[[nodiscard]] EdgesTaken edges_taken() noexcept;
// Forgets them (tests: a run starts from none).
void reset_edges_taken() noexcept;

}  // namespace loom::p2p
