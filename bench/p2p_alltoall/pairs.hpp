// The all-pairs bandwidth pattern, two-sided: a stream of messages from one rank to another,
// -W of them in flight, for each ordered pair alone (in turn, a barrier between pairs) and for
// every ordered pair at once. Rates are the receiver's: the timed messages' bytes over the time
// from the end of the warmup messages to the last one's arrival (no acknowledgement: a
// communicator delivers in post order, so an acknowledgement would have to be ordered against
// the other direction's stream).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/memory.hpp"
#include "loom/p2p.hpp"
#include "p2p_alltoall/mesh.hpp"
#include "p2p_alltoall/traffic.hpp"

namespace loom::bench {

class Pairs {
 public:
  static constexpr std::size_t kMaxWindow = 64;

  // Buffers for the largest size (one per message in flight with -v), touched now.
  Pairs(const AlltoallOptions& options, Mesh& mesh, std::size_t max_size);

  // This rank's figures: size, messages, window, mb_per_s (by sender: what reached this rank
  // from each), bytes (received, timed), elapsed_s (at once: from the start to the last stream's
  // end). Throws std::runtime_error.
  nlohmann::json run(std::size_t size, bool at_once);

 private:
  struct Stream {
    int peer = 0;
    bool send = false;
    std::size_t total = 0;
    std::size_t posted = 0;
    std::size_t done = 0;
    std::uint64_t key_base = 0;  // the messages' numbers, for their patterns
    std::array<Request, kMaxWindow> ring{};
    Clock::time_point end{};
  };

  // Moves every stream `count` messages; returns when all are done.
  void move(std::vector<Stream>& streams, std::size_t size, std::size_t count, std::uint64_t phase);
  bool advance(Stream& stream, std::size_t size);  // posts and tests; true when it did something
  std::byte* slot(const Stream& stream, std::size_t message) const;
  void check(const Stream& stream, std::size_t size, std::size_t message) const;

  const AlltoallOptions& options_;
  Mesh& mesh_;
  std::size_t max_size_;
  std::size_t window_;
  std::uint64_t run_ = 0;
  HostBuffer send_buffer_;
  HostBuffer recv_buffer_;
  Region send_region_;
  Region recv_region_;
};

}  // namespace loom::bench
