// Whether a message may go into a buffer: the one rule both ends apply. The sender judges its
// message against the clear-to-send; the receiver judges the ready-to-send (or a write that
// fills the buffer) against its buffer. Both hold the same facts, so both reach the same
// verdict, and a refused message ends with the same status on both sides with no payload sent.
// A message sent ahead on a credit, before its buffer's clear-to-send, is judged by the
// receiver alone: its send finished when it left (as an MPI or NCCL send does), and only the
// receive reports a refusal.
#pragma once

#include <cstdint>
#include <string>

#include "loom/error.hpp"
#include "loom/p2p.hpp"
#include "p2p/messages.hpp"

namespace loom::p2p {

enum class Verdict : std::uint8_t {
  kFits,
  kRefused,   // the receive failed over there: the buffer is back with the application
  kTooLarge,  // the message is larger than the buffer
  kWrongTag,
};

constexpr Verdict judge(const Announcement& buffer, std::uint64_t message_size, Tag message_tag) {
  if (buffer.refused) return Verdict::kRefused;
  if (message_size > buffer.size) return Verdict::kTooLarge;
  if (message_tag != buffer.tag) return Verdict::kWrongTag;
  return Verdict::kFits;
}

constexpr Status status_of(Verdict verdict) {
  switch (verdict) {
    case Verdict::kFits:
      return Status::kOk;
    case Verdict::kRefused:
      return Status::kError;
    case Verdict::kTooLarge:
      return Status::kTruncated;
    case Verdict::kWrongTag:
      return Status::kInvalid;
  }
  return Status::kError;
}

enum class Side : std::uint8_t { kSender, kReceiver };

// The error text of a refusal, as `side` words it.
[[gnu::cold]] std::string explain(Verdict verdict, Side side, std::uint32_t seq,
                                  const Announcement& buffer, std::uint64_t message_size,
                                  Tag message_tag);

static_assert(judge({.size = 100, .tag = 7}, 100, 7) == Verdict::kFits);
static_assert(judge({.size = 100, .tag = 7}, 101, 7) == Verdict::kTooLarge);
static_assert(judge({.size = 100, .tag = 7}, 10, 8) == Verdict::kWrongTag);
static_assert(judge({.size = 100, .tag = 7, .refused = true}, 10, 7) == Verdict::kRefused);

}  // namespace loom::p2p
