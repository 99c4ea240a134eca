// SeqRing: entries by sequence number whose memory follows what is in flight. A communicator's
// send and receive state lives in two of them (p2p/seq_ring.hpp).
#include "p2p/seq_ring.hpp"

#include <cstdint>

#include <catch2/catch.hpp>

#include "p2p/messages.hpp"

namespace loom::p2p {
namespace {

struct Value {
  std::uint64_t payload = 0;
};
using Ring = SeqRing<Value, 1024>;

std::uint64_t payload_of(std::uint32_t seq) {
  return 0x9E3779B97F4A7C15ull * (seq + 1);
}

TEST_CASE("p2p seq ring: a stream with few numbers in flight stays at its first capacity",
          "[seq-ring]") {
  Ring ring(2);
  constexpr std::uint32_t kInFlight = 6;
  std::uint32_t oldest = 0;
  auto in_use = [&](const Ring::Slot& slot) { return !seq_before(slot.seq, oldest); };
  for (std::uint32_t seq = 0; seq < 100000; ++seq) {
    if (seq >= kInFlight) oldest = seq - kInFlight + 1;
    ring.claim(seq, in_use).payload = payload_of(seq);
    ring.extras(seq)[0] = seq;
    ring.extras(seq)[1] = ~std::uint64_t{seq};
  }
  CHECK(ring.capacity() == Ring::kFirstCapacity);
  for (std::uint32_t seq = 100000 - kInFlight; seq < 100000; ++seq) {
    const Value* v = ring.find(seq);
    REQUIRE(v != nullptr);
    CHECK(v->payload == payload_of(seq));
    CHECK(ring.extras(seq)[0] == seq);
    CHECK(ring.extras(seq)[1] == ~std::uint64_t{seq});
  }
  // Older numbers' slots went to newer ones.
  CHECK(ring.find(100000 - Ring::kFirstCapacity - 1) == nullptr);
}

TEST_CASE("p2p seq ring: numbers in use survive every doubling, with their extras", "[seq-ring]") {
  Ring ring(3);
  auto all_in_use = [](const Ring::Slot&) { return true; };
  // Starting near the wrap of 2^32: the slot is the low bits, whatever the number.
  const std::uint32_t first = 0xFFFFFFFFu - 150;
  for (std::uint32_t k = 0; k < 300; ++k) {
    const std::uint32_t seq = first + k;
    ring.claim(seq, all_in_use).payload = payload_of(seq);
    for (std::size_t e = 0; e < 3; ++e) ring.extras(seq)[e] = payload_of(seq) + e;
  }
  CHECK(ring.capacity() == 512);
  for (std::uint32_t k = 0; k < 300; ++k) {
    const std::uint32_t seq = first + k;
    const Value* v = ring.find(seq);
    REQUIRE(v != nullptr);
    CHECK(v->payload == payload_of(seq));
    for (std::size_t e = 0; e < 3; ++e) CHECK(ring.extras(seq)[e] == payload_of(seq) + e);
    // A number known by its low 12 bits (remote CQ data) finds the same slot.
    CHECK(&ring.slot(seq & 0xFFFu) == &ring.slot(seq));
  }
  // Claiming a number again returns its entry, unchanged.
  CHECK(ring.claim(first, all_in_use).payload == payload_of(first));
  CHECK(ring.capacity() == 512);
}

TEST_CASE("p2p seq ring: at the largest capacity the newer number takes the slot", "[seq-ring]") {
  SeqRing<Value, 32> ring;
  auto all_in_use = [](const SeqRing<Value, 32>::Slot&) { return true; };
  for (std::uint32_t seq = 0; seq < 40; ++seq) ring.claim(seq, all_in_use).payload = seq + 1;
  CHECK(ring.capacity() == 32);
  CHECK(ring.find(3) == nullptr);
  REQUIRE(ring.find(35) != nullptr);
  CHECK(ring.find(35)->payload == 36);
  REQUIRE(ring.find(20) != nullptr);
  CHECK(ring.find(20)->payload == 21);
}

TEST_CASE("p2p seq ring: a slot taken over starts from a default entry and zero extras",
          "[seq-ring]") {
  Ring ring(1);
  auto none_in_use = [](const Ring::Slot&) { return false; };
  ring.claim(5, none_in_use).payload = 77;
  ring.extras(5)[0] = 99;
  const std::uint32_t same_slot = 5 + Ring::kFirstCapacity;
  CHECK(ring.claim(same_slot, none_in_use).payload == 0);
  CHECK(ring.extras(same_slot)[0] == 0);
  CHECK(ring.find(5) == nullptr);
  CHECK(ring.capacity() == Ring::kFirstCapacity);
  // A slot never claimed holds no number, not even 0.
  CHECK(ring.find(0) == nullptr);
}

}  // namespace
}  // namespace loom::p2p
