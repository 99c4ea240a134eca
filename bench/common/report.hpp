// What fi_p2p_bw prints: a header naming the setup, fabtests' columns plus GB/s and latency
// (one-sided: plus batch latency and time-to-notify), a footer with setup cost, memory,
// registrations, bytes per rail and the protocol's counts; and the same as JSON.
#pragma once

#include <string>
#include <vector>

#include "common/figures.hpp"
#include "common/options.hpp"
#include "loom/p2p.hpp"

namespace loom::bench {

// fabtests' size notation: 4k, 1m, 64.
std::string size_text(double value);

class Report {
 public:
  Report(const Options& options, const Context& context);

  void header() const;
  void row(const Figures& figures);
  void progress(std::size_t done, std::size_t total) const;  // stderr, only on a terminal
  void footer(const SetupFigures& setup, const ContextStats& stats,
              const ProtocolCounts& protocol) const;
  void write_json(const SetupFigures& setup, const ContextStats& stats,
                  const ProtocolCounts& protocol) const;

 private:
  void rma_header() const;
  void rma_row(const Figures& figures) const;

  const Options& options_;
  const Context& context_;
  std::vector<Figures> rows_;
};

}  // namespace loom::bench
