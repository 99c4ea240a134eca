// Where each buffer of a request stands in the protocol, one explicit state per part, and the
// transitions allowed between them. Every state change goes through Part::to(), which asserts
// (in debug builds) that the change is in the table below: a request's outcome is its parts'
// states, never a combination of flags.
//
// Send (one part per isend):
//
//   kAwaitingClearance --a credit: sent ahead--> kEagerInFlight --> kDone | kFailed
//                      \                     \--injected------------------------> kDone
//                       \--CTS: fits, a credit--> kEagerReady --posted--> kEagerInFlight --> kDone
//                       \                           \--injected------------------------> kDone
//                       \--CTS: fits, write--> kWriting (stripes k of n; its ready-to-send)
//                        \                      \--all written and the RTS left--------> kDone
//                         \--CTS: refused by the receiver----------------------------> kFailed
//                          \--CTS: too large / wrong tag--> kFailing (the RTS tells the verdict)
//   kFailing: failed; what it still owes (writes in flight, a ready-to-send) drains --> kFailed
//   A message sent ahead is judged by its receiver alone (verdict.hpp): its send is done once
//   it left, as MPI's and NCCL's are.
//
// Receive (up to kMaxParts parts per irecv):
//
//   kAwaitingPost --irecv--> kToAnnounce --in a clear-to-send batch--> kAnnounced
//                \--irecv, a buffer only an eager message fills--> kQuiet
//   kQuiet --its message came ahead (every fragment of it): judged here--> kDone | kFailed
//          \--the sender asked for its announcement (AskClearance)--> kToAnnounce
//   kAnnounced --batch left--> kCleared (a failed part: kFailed)
//              \--its message came ahead (copied from an eager buffer)--> kArrived
//   kArrived --batch left: the sender can judge it too--> kDone | kFailed
//   kCleared --its message came ahead--> kDone | kFailed
//            \--ready-to-send or a write that fills--> kWriting --writes k of n--> kDone
//             \--a write before its ready-to-send--> kWritesAhead --RTS--> kWriting
//   Any unfinished part --failure--> kFailed (kArrived: its own outcome)
//
// Flush (iflush): kAwaitingPost --read posted--> kFlushing --> kDone | kFailed.
//
// A send's ready-to-send, beside its part (one per request; Request::to()):
//
//   kNotNeeded (eager, or a write that fills its buffer says size and tag itself)
//   kWanted --queued in the batch--> kBatched --the batch left--> kSent
//          \--the part failed first--> kDropped     \--the batch failed--> kDropped
#pragma once

#include <cassert>
#include <cstdint>
#include <string_view>

namespace loom::p2p {

enum class SendState : std::uint8_t {
  kAwaitingClearance,  // no clear-to-send for its sequence number yet, and no credit
  kEagerReady,         // cleared for an eager send; waits for room in the provider's queue
  kEagerInFlight,      // the eager send is posted: done at its local completion
  kWriting,            // cleared for RDMA writes: stripes posted and completing
  kFailing,            // failed; writes in flight and a ready-to-send still owed drain first
  kDone,               // handed over whole (delivered, as far as this side can tell)
  kFailed,
};

enum class RecvState : std::uint8_t {
  kAwaitingPost,  // not taken up by irecv yet (flushes: the read is not posted)
  kToAnnounce,    // ready for a clear-to-send (a failed part announces its refusal)
  kQuiet,         // posted, unannounced: a message sent ahead fills it, or its sender asks
  kAnnounced,     // in the clear-to-send batch, not sent yet
  kArrived,       // its message came ahead and is copied; the batch announcing it has not left
  kCleared,       // the clear-to-send left: the writes may come (or the message ahead)
  kWritesAhead,   // writes arrive before the ready-to-send that gives size and tag
  kWriting,       // size and tag known (ready-to-send, or a write that fills the buffer)
  kFlushing,      // iflush: the read is posted
  kDone,
  kFailed,
};

// kDropped: wanted, but nothing more will be sent for the message.
enum class ReadyToSendState : std::uint8_t { kNotNeeded, kWanted, kBatched, kSent, kDropped };

namespace detail {

template <typename State>
constexpr unsigned bit(State s) {
  return 1u << static_cast<unsigned>(s);
}

// The states each state may go to, as bit sets.
constexpr unsigned next_states(SendState from) {
  using S = SendState;
  switch (from) {
    case S::kAwaitingClearance:
      return bit(S::kEagerInFlight) | bit(S::kDone) | bit(S::kEagerReady) | bit(S::kWriting) |
             bit(S::kFailing) | bit(S::kFailed);
    case S::kEagerReady:
      return bit(S::kEagerInFlight) | bit(S::kDone) | bit(S::kFailed);
    case S::kEagerInFlight:
      return bit(S::kDone) | bit(S::kFailed);
    case S::kWriting:
      return bit(S::kDone) | bit(S::kFailing) | bit(S::kFailed);
    case S::kFailing:
      return bit(S::kFailed);
    case S::kDone:
    case S::kFailed:
      return 0;
  }
  return 0;
}

constexpr unsigned next_states(RecvState from) {
  using R = RecvState;
  constexpr unsigned failing = bit(R::kFailed);
  switch (from) {
    case R::kAwaitingPost:
      return bit(R::kToAnnounce) | bit(R::kQuiet) | bit(R::kFlushing) | failing;
    case R::kQuiet:
      return bit(R::kToAnnounce) | bit(R::kDone) | failing;
    case R::kToAnnounce:
      return bit(R::kAnnounced) | failing;
    case R::kAnnounced:
      return bit(R::kCleared) | bit(R::kArrived) | failing;
    case R::kArrived:
      return bit(R::kDone) | bit(R::kFailed);
    case R::kCleared:
      return bit(R::kDone) | bit(R::kWritesAhead) | bit(R::kWriting) | failing;
    case R::kWritesAhead:
      return bit(R::kWriting) | failing;
    case R::kWriting:
      return bit(R::kDone) | failing;
    case R::kFlushing:
      return bit(R::kDone) | bit(R::kFailed);
    case R::kDone:
    case R::kFailed:
      return 0;
  }
  return 0;
}

constexpr unsigned next_states(ReadyToSendState from) {
  using T = ReadyToSendState;
  switch (from) {
    case T::kNotNeeded:
      return bit(T::kWanted);
    case T::kWanted:
      return bit(T::kBatched) | bit(T::kDropped);
    case T::kBatched:
      return bit(T::kSent) | bit(T::kDropped);
    case T::kSent:
    case T::kDropped:
      return 0;
  }
  return 0;
}

}  // namespace detail

template <typename State>
constexpr bool legal(State from, State to) {
  return (detail::next_states(from) & detail::bit(to)) != 0;
}

constexpr std::string_view to_string(SendState s) {
  constexpr std::string_view kNames[] = {"awaiting clearance",
                                         "eager ready",
                                         "eager in flight",
                                         "writing",
                                         "failing",
                                         "done",
                                         "failed"};
  return kNames[static_cast<unsigned>(s)];
}
constexpr std::string_view to_string(RecvState s) {
  constexpr std::string_view kNames[] = {
      "awaiting post", "to announce", "quiet",    "announced", "arrived", "cleared",
      "writes ahead",  "writing",     "flushing", "done",      "failed"};
  return kNames[static_cast<unsigned>(s)];
}
constexpr std::string_view to_string(ReadyToSendState s) {
  constexpr std::string_view kNames[] = {"not needed", "wanted", "batched", "sent", "dropped"};
  return kNames[static_cast<unsigned>(s)];
}
static_assert(to_string(SendState::kFailed) == "failed" &&
                  to_string(RecvState::kFailed) == "failed" &&
                  to_string(ReadyToSendState::kDropped) == "dropped",
              "one name per state, in order");

constexpr bool terminal(SendState s) {
  return s == SendState::kDone || s == SendState::kFailed;
}
constexpr bool terminal(RecvState s) {
  return s == RecvState::kDone || s == RecvState::kFailed;
}

static_assert(legal(SendState::kAwaitingClearance, SendState::kWriting));
static_assert(!legal(SendState::kDone, SendState::kFailed), "an outcome never changes");
static_assert(!legal(RecvState::kAnnounced, RecvState::kDone),
              "a sender told of the buffer learns the verdict before the receiver reports it");
static_assert(!legal(SendState::kEagerInFlight, SendState::kWriting), "a message leaves once");
static_assert(!legal(SendState::kEagerReady, SendState::kWriting),
              "the credit an eager send counts on is taken when it is matched");

}  // namespace loom::p2p
