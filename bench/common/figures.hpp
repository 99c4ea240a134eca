// What fi_p2p_bw measures (p2p_bw/session.hpp) and a Report prints (common/report.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::bench {

// One row: one message size.
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

  [[nodiscard]] double mb_per_s() const { return seconds > 0 ? bytes / seconds / 1e6 : 0; }
  [[nodiscard]] double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  [[nodiscard]] double usec_per_xfer() const {
    return iterations ? seconds * 1e6 / static_cast<double>(iterations) : 0;
  }
  [[nodiscard]] double mxfers_per_s() const {
    return seconds > 0 ? static_cast<double>(iterations) / seconds / 1e6 : 0;
  }
};

struct SetupFigures {
  double median_connect_us = 0;    // connect + accept of one communicator
  double memory_per_comm_kib = 0;  // RSS growth / communicators held
  std::size_t comms_held = 0;
};

}  // namespace loom::bench
