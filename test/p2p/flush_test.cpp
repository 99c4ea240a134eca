// iflush on host memory with LOOM_FORCE_FLUSH (the GPU path's reads, without a GPU): one read
// through every data rail, in waves when there are more rails than a request has contexts; and
// nothing at all without the force.
#include <vector>

#include <catch2/catch.hpp>

#include "support/p2p_pair.hpp"
#include "support/pattern.hpp"

namespace loom::test {
namespace {

void flush_receiver(Channel& channel, unsigned rails) {
  constexpr std::size_t kSize = std::size_t{1} << 20;
  Config config = test_config(rails);
  config.force_flush = true;
  config.gpu_flush = false;  // device memory only: the forced flush still reads
  Context context(config);
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  auto comm = accept_one(listener);
  std::vector<std::byte> buffer(kSize);
  const CloseOnUnwind guard{comm.get()};
  MemoryRegion region = comm->register_memory(buffer.data(), buffer.size());
  RecvBuffer target{buffer.data(), kSize, 5, region};
  Request request;
  require(post_into(comm->irecv({&target, 1}), request) == Status::kOk, comm->last_error());
  finish(*comm, request);
  const auto reads = flush_reads(context, *comm, target, rails);  // forced: reads host memory
  for (unsigned r = 0; r < rails; ++r) {
    require(reads[r] == 64, "data rail " + std::to_string(r) + " read " + std::to_string(reads[r]) +
                                " bytes for the flush, expected 64");
  }
  const std::string error = check_pattern(buffer, 31);
  require(error.empty(), error);
  comm->deregister(region);
  channel.barrier();
}

void flush_sender(Channel& channel, unsigned rails) {
  constexpr std::size_t kSize = std::size_t{1} << 20;
  Context context(test_config(rails));
  auto comm = connect_one(context, recv_handle(channel));
  std::vector<std::byte> buffer(kSize);
  const CloseOnUnwind guard{comm.get()};
  fill_pattern(buffer, 31);
  MemoryRegion region = comm->register_memory(buffer.data(), buffer.size());
  Request request;
  require(post_into(comm->isend(buffer.data(), kSize, 5, region), request) == Status::kOk,
          comm->last_error());
  finish(*comm, request);
  comm->deregister(region);
  channel.barrier();
}

}  // namespace

TEST_CASE("p2p iflush reads through every data rail in waves past a request's contexts", "[pair]") {
  // 10 rails: more than the 8 contexts of a request, so the reads go in two waves.
  for (unsigned rails : {1u, 3u, 10u}) {
    INFO("data rails " << rails);
    auto failure = run_pair([rails](Channel& c) { flush_receiver(c, rails); },
                            [rails](Channel& c) { flush_sender(c, rails); });
    REQUIRE(failure.empty());
  }
}

TEST_CASE("p2p iflush of host memory posts nothing unless forced", "[local]") {
  Context context(test_config(1));
  Listener listener = context.listen();
  Connector connector = context.connect(listener.handle());
  CommPair pair = connect_both(connector, listener, "connect to self");
  // One message first: on shm (libfabric 1.17) a self-connected pair that never exchanged
  // anything crashes in fi_cq_read while closing, with or without this test's calls.
  exchange(*pair.out, *pair.in, 7, 7, 4096);
  std::vector<std::byte> buffer(4096);
  MemoryRegion region = pair.in->register_memory(buffer.data(), buffer.size());
  RecvBuffer target{buffer.data(), buffer.size(), 1, region};
  const auto before = data_rail_reads(context);
  const Posted flush = pair.in->iflush({&target, 1});
  REQUIRE(flush.status == Status::kOk);
  REQUIRE(flush.request.valid());
  CHECK(pair.in->test(flush.request) == Status::kOk);  // nothing to wait for
  CHECK(data_rail_reads(context) == before);
  pair.in->deregister(region);
}

}  // namespace loom::test
