// What fi_p2p_bw measures (p2p_bw/session.hpp, p2p_bw/rma_session.hpp) and a Report prints
// (common/report.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::bench {

// The median and 99th percentile of a set of times.
struct Spread {
  double p50_us = 0;
  double p99_us = 0;
  std::uint64_t samples = 0;  // 0: not measured
};

// One-sided rows (--op write|read): an iteration is a batch of `blocks` blocks, a transfer a
// block.
struct RmaFigures {
  std::size_t blocks = 0;  // per batch; 0 in a send row
  Spread batch;            // post -> the initiator's test() said done, -W batches in flight
  Spread notify;      // post -> the target's poll() returned the batch's notification (one host)
  Spread lone_batch;  // the same, one batch in flight (the latency pass)
  Spread lone_notify;
};

// One row: one message (block) size.
struct Figures {
  std::size_t size = 0;
  std::size_t iterations = 0;
  std::uint64_t bytes = 0;  // both directions with --bidir
  double seconds = 0;
  double p50_us = 0;  // one-way latency from the ping-pong pass (0 when skipped)
  double p99_us = 0;
  // What fabtests' pingpong reports (usec/xfer): the timed rounds' total time / rounds / 2.
  double lat_avg_us = 0;
  std::size_t lat_rounds = 0;
  RmaFigures rma;

  // Messages, or blocks.
  [[nodiscard]] double transfers() const {
    return static_cast<double>(iterations) * static_cast<double>(rma.blocks ? rma.blocks : 1);
  }
  [[nodiscard]] double mb_per_s() const { return seconds > 0 ? bytes / seconds / 1e6 : 0; }
  [[nodiscard]] double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  [[nodiscard]] double usec_per_xfer() const {
    return iterations ? seconds * 1e6 / transfers() : 0;
  }
  [[nodiscard]] double mxfers_per_s() const {
    return seconds > 0 ? transfers() / seconds / 1e6 : 0;
  }
};

// The two-sided protocol's counts over this side's communicators (loom::CommStats), summed:
// how the messages went and what control messages they cost. All zero for one-sided runs.
struct ProtocolCounts {
  std::uint64_t sent_ahead = 0;  // eager, on a credit
  std::uint64_t fragmented = 0;  // of those, in several eager fragments
  std::uint64_t written = 0;     // rendezvous (RDMA write)
  std::uint64_t asks = 0;        // asks for clearance (AskClearance)
  std::uint64_t clear_to_sends = 0;
  std::uint64_t carried = 0;      // clear-to-sends that rode on a data message
  std::uint64_t pushed_back = 0;  // control messages the provider refused for a while
};

struct SetupFigures {
  double median_connect_us = 0;    // connect + accept of one communicator
  double memory_per_comm_kib = 0;  // RSS growth / communicators held
  std::size_t comms_held = 0;
};

}  // namespace loom::bench
