// Regions of a context (Context::register_memory): one registration every communicator of the
// context takes, registered by each lane on first use, lanes opened after it included; a
// deregistration that waits for the requests still using it; clear refusals otherwise.
#include <cstddef>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "loom/loom.hpp"
#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

constexpr std::size_t kEager = 1000;
constexpr std::size_t kWritten = 300000;  // above every provider's eager limit

// `from` sends `size` bytes of pattern `seed` to `to`, which receives into `target`.
void move(SendComm& from, const void* data, MemoryRegion send_region, RecvComm& to,
          std::byte* target, MemoryRegion recv_region, std::size_t size, Tag tag) {
  Request receive;
  Request send;
  RecvBuffer buffer{target, size, tag, recv_region};
  REQUIRE(post_into(to.irecv({&buffer, 1}), receive) == Status::kOk);
  REQUIRE(post_into(from.isend(data, size, tag, send_region), send) == Status::kOk);
  finish(from, send);
  REQUIRE(finish(to, receive) == size);
}

std::size_t context_regions(const Context& context) {
  std::size_t n = 0;
  for (const auto& lane : context.stats().lanes) n += lane.context_regions;
  return n;
}

TEST_CASE("p2p a context's region serves all its communicators, lanes opened later included",
          "[local]") {
  Context a(test_config(1));
  Context b(test_config(1));
  std::vector<std::byte> slab(2 * kWritten);
  // Registered before any lane exists: each lane registers it when it first uses it.
  Region owned = a.register_memory(slab.data(), slab.size());
  REQUIRE(owned.valid());
  const MemoryRegion region = owned;  // a copy, as an application passes it around
  CHECK(context_regions(a) == 0);

  Listener at_b = b.listen();
  Connector a_to_b = a.connect(at_b.handle());
  CommPair ab = connect_both(a_to_b, at_b, "a to b");
  Listener at_a = a.listen();
  Connector b_to_a = b.connect(at_a.handle());
  CommPair ba = connect_both(b_to_a, at_a, "b to a");
  const CloseOnUnwind guard{ab.out.get(), ab.in.get(), ba.out.get(), ba.in.get()};
  std::vector<std::byte> peer(kWritten);
  const MemoryRegion b_send = ba.out->register_memory(peer.data(), peer.size());
  const MemoryRegion b_recv = ab.in->register_memory(peer.data(), peer.size());

  // a's send lane and a's receive lane both take the context's region, eager and written.
  std::byte* outgoing = slab.data();
  std::byte* incoming = slab.data() + kWritten;
  std::uint64_t seed = 40;
  for (std::size_t size : {kEager, kWritten}) {
    ++seed;
    fill_pattern({outgoing, size}, seed);
    move(*ab.out, outgoing, region, *ab.in, peer.data(), b_recv, size, 7);
    CHECK(check_pattern({peer.data(), size}, seed).empty());
    ++seed;
    fill_pattern({peer.data(), size}, seed);
    move(*ba.out, peer.data(), b_send, *ba.in, incoming, region, size, 8);
    CHECK(check_pattern({incoming, size}, seed).empty());
  }
  // a's send and receive communicators: one lane, or one each way where lanes are per direction.
  const auto lanes = a.stats().lanes;
  REQUIRE(lanes.size() == (a.nics().front().lanes_per_direction ? 2u : 1u));
  for (const auto& lane : lanes) CHECK(lane.context_regions == 1);

  // Refusals: another context's communicator, a range outside the region, empty ranges.
  Request request;
  CHECK(post_into(ba.out->isend(outgoing, 10, 1, region), request) == Status::kInvalid);
  CHECK_THAT(ba.out->last_error(), Catch::Contains("another communicator or context"));
  CHECK(post_into(ab.out->isend(slab.data() + slab.size() - 10, 20, 1, region), request) ==
        Status::kInvalid);
  CHECK_THAT(ab.out->last_error(), Catch::Contains("outside its registered region"));
  CHECK_THROWS_WITH(a.register_memory(slab.data(), 0), Catch::Contains("empty range"));
  if (a.nics().front().device_memory == false) {
    CHECK_THROWS_WITH(a.register_memory(slab.data(), 64, MemoryType::kCuda),
                      Catch::Contains("device memory"));
  }

  // Deregistered under a pending receive: the receive still lands, then the region is refused
  // and every lane let go of it.
  Request pending;
  RecvBuffer buffer{incoming, kWritten, 9, region};
  REQUIRE(post_into(ba.in->irecv({&buffer, 1}), pending) == Status::kOk);
  owned.reset();
  owned.reset();  // twice: nothing
  CHECK(post_into(ab.out->isend(outgoing, 10, 1, region), request) == Status::kInvalid);
  CHECK_THAT(ab.out->last_error(), Catch::Contains("deregistered"));
  ++seed;
  fill_pattern(peer, seed);
  Request send;
  REQUIRE(post_into(ba.out->isend(peer.data(), kWritten, 9, b_send), send) == Status::kOk);
  finish(*ba.out, send);
  REQUIRE(finish(*ba.in, pending) == kWritten);
  CHECK(check_pattern({incoming, kWritten}, seed).empty());
  CHECK(context_regions(a) == 0);

  // A new region in the freed slot is a new name: the old handle stays refused. Moved, it is
  // deregistered once, by its last owner going out of scope.
  Region first = a.register_memory(slab.data(), slab.size());
  Region again = std::move(first);
  CHECK_FALSE(first.valid());
  CHECK(post_into(ab.out->isend(outgoing, 10, 1, region), request) == Status::kInvalid);
  ++seed;
  fill_pattern({outgoing, kEager}, seed);
  const MemoryRegion slab_handle = again;
  move(*ab.out, outgoing, slab_handle, *ab.in, peer.data(), b_recv, kEager, 10);
  CHECK(check_pattern({peer.data(), kEager}, seed).empty());
  { const Region gone = std::move(again); }
  CHECK(post_into(ab.out->isend(outgoing, 10, 1, slab_handle), request) == Status::kInvalid);
  ab.in->deregister(b_recv);
  ba.out->deregister(b_send);
}

}  // namespace
}  // namespace loom::test
