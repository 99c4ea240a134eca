#include "common/report.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <unistd.h>

extern char** environ;  // NOLINT: POSIX

namespace loom::bench {

std::string size_text(double value) {
  const char* suffix[] = {"", "k", "m", "g", "t"};
  int i = 0;
  while (value >= 1024 && i < 4 && static_cast<std::uint64_t>(value) % 1024 == 0) {
    value /= 1024;
    ++i;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.0f%s", value, suffix[i]);
  return text;
}

namespace {

std::string count_text(double value) {
  const char* suffix[] = {"", "k", "m", "g", "t"};
  int i = 0;
  while (value >= 1000 && i < 4) {
    value /= 1000;
    ++i;
  }
  char text[32];
  std::snprintf(text, sizeof text, value < 10 && i > 0 ? "%.1f%s" : "%.0f%s", value, suffix[i]);
  return text;
}

std::string bytes_text(double bytes) {
  char text[32];
  if (bytes >= 1e9)
    std::snprintf(text, sizeof text, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(text, sizeof text, "%.1f MB", bytes / 1e6);
  else
    std::snprintf(text, sizeof text, "%.0f B", bytes);
  return text;
}

}  // namespace

Report::Report(const Options& options, const Context& context)
    : options_(options), context_(context) {}

void Report::header() const {
  const Config& c = context_.config();
  const auto nics = context_.nics();
  std::printf("# fi_p2p_bw (loom) provider %s, %zu NIC(s):", nics.front().provider.c_str(),
              nics.size());
  for (const auto& nic : nics) {
    std::printf(" %s/%s%s%s", nic.fabric.c_str(), nic.name.c_str(),
                nic.endpoint_mr ? " [FI_MR_ENDPOINT]" : "", nic.device_memory ? " [FI_HMEM]" : "");
  }
  // Which memory the messages use, and whether the NICs can take device memory (why not).
  const auto& first = nics.front();
  std::printf("\n# memory: %s; device memory: %s", options_.memory.describe().c_str(),
              first.device_memory ? "supported (FI_HMEM)"
                                  : ("not supported: " + first.device_memory_note).c_str());
  if (options_.one_sided()) {
    std::printf("\n# data rails %u, control rails %u, groups %u%s\n", c.data_rails, c.ctrl_rails,
                c.ngroups, c.ngroups == 0 ? " (no sharing)" : "");
    rma_header();
    return;
  }
  std::printf(
      "\n# data rails %u, control rails %u, comms %u, groups %u%s, eager limit %s, "
      "min stripe %s, window %zu%s%s%s\n",
      c.data_rails, c.ctrl_rails, options_.comms, c.ngroups, c.ngroups == 0 ? " (no sharing)" : "",
      size_text(first.eager_max).c_str(), size_text(c.min_stripe).c_str(), options_.window,
      options_.bidir ? ", bidir" : "", options_.verify ? ", verified" : "",
      c.progress_thread ? "" : ", no progress thread");
  std::printf("%-8s %-8s %-8s %-9s %-10s %-10s %-11s %-8s %-9s %-9s %-9s\n", "bytes", "iters",
              "total", "time", "MB/sec", "usec/xfer", "Mxfers/sec", "GB/s", "lat(us)", "p50(us)",
              "p99(us)");
  std::fflush(stdout);
}

void Report::rma_header() const {
  const bool notified = options_.op == Op::kWrite && options_.notify;
  std::printf(
      "# one-sided %s: %zu blocks per batch, %s remote offsets, %s, %zu batches in "
      "flight%s\n",
      op_name(options_.op), options_.blocks, offsets_name(options_.offsets),
      notified
          ? (std::string("notified (") + protocol_name(options_.notify_protocol) + " protocol)")
                .c_str()
          : "no notification",
      options_.window, options_.verify ? ", verified" : "");
  std::printf(
      "# iters: batches; xfer: a block; batch: post -> the initiator's test() says done "
      "(-W in flight); notify: post -> the target's poll() returns it; lat: %s, one "
      "batch in flight\n",
      notified ? "notify" : "batch");
  std::printf("# each side: --blocks slots of the block size%s, reused by every batch\n",
              options_.verify ? " per batch in flight" : "");
  if (notified && !options_.loopback) {
    std::printf(
        "# notify: not measured: the two processes may not share a clock (--loopback "
        "does)\n");
  }
  std::printf("%-8s %-7s %-8s %-8s %-9s %-10s %-10s %-11s %-8s %-9s %-9s %-9s %-9s %-9s\n", "bytes",
              "blocks", "iters", "total", "time", "MB/sec", "usec/xfer", "Mxfers/sec", "GB/s",
              "batch50", "batch99", "notify50", "notify99", "lat(us)");
  std::fflush(stdout);
}

namespace {
std::string micros_text(double us, bool measured) {
  if (!measured) return "-";
  char text[32];
  std::snprintf(text, sizeof text, us < 100 ? "%.2f" : "%.0f", us);
  return text;
}
}  // namespace

void Report::rma_row(const Figures& f) const {
  const RmaFigures& r = f.rma;
  const Spread& lone = r.lone_notify.samples ? r.lone_notify : r.lone_batch;
  std::printf(
      "%-8s %-7zu %-8s %-8s %-9.2f %-10.2f %-10.2f %-11.3f %-8.3f %-9s %-9s %-9s %-9s "
      "%-9s\n",
      size_text(static_cast<double>(f.size)).c_str(), r.blocks,
      count_text(static_cast<double>(f.iterations)).c_str(),
      size_text(static_cast<double>(f.bytes)).c_str(), f.seconds, f.mb_per_s(), f.usec_per_xfer(),
      f.mxfers_per_s(), f.gb_per_s(), micros_text(r.batch.p50_us, r.batch.samples).c_str(),
      micros_text(r.batch.p99_us, r.batch.samples).c_str(),
      micros_text(r.notify.p50_us, r.notify.samples).c_str(),
      micros_text(r.notify.p99_us, r.notify.samples).c_str(),
      micros_text(lone.p50_us, lone.samples).c_str());
  std::fflush(stdout);
}

void Report::row(const Figures& f) {
  rows_.push_back(f);
  if (options_.one_sided()) {
    rma_row(f);
    return;
  }
  std::printf("%-8s %-8s %-8s %-9.2f %-10.2f %-10.2f %-11.3f %-8.3f %-9.2f %-9.2f %-9.2f\n",
              size_text(static_cast<double>(f.size)).c_str(),
              count_text(static_cast<double>(f.iterations)).c_str(),
              size_text(static_cast<double>(f.bytes)).c_str(), f.seconds, f.mb_per_s(),
              f.usec_per_xfer(), f.mxfers_per_s(), f.gb_per_s(), f.lat_avg_us, f.p50_us, f.p99_us);
  std::fflush(stdout);
}

void Report::progress(std::size_t done, std::size_t total) const {
  if (total < 2 || !isatty(STDERR_FILENO)) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / total);
  std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu sizes", filled, "##############################",
               kWidth - filled, "", done, total);
  if (done == total) std::fprintf(stderr, "\r%*s\r", kWidth + 24, "");
  std::fflush(stderr);
}

void Report::footer(const SetupFigures& setup, const ContextStats& stats,
                    const ProtocolCounts& protocol) const {
  std::size_t registrations = 0, send_comms = 0, recv_comms = 0;
  std::uint64_t hits = 0, misses = 0;
  std::map<std::string, std::uint64_t> per_rail;  // "data 0 on lo" -> bytes
  for (const auto& lane : stats.lanes) {
    registrations += lane.registrations;
    hits += lane.registrations_shared;
    misses += lane.registrations_made;
    send_comms += lane.send_comms;
    recv_comms += lane.recv_comms;
    std::size_t data = 0, control = 0;
    for (const auto& rail : lane.rails) {
      const std::string name =
          (rail.data ? "data " + std::to_string(data++) : "control " + std::to_string(control++)) +
          " on " + rail.nic;
      per_rail[name] += rail.bytes_sent + rail.bytes_written + rail.bytes_read;
    }
  }
  std::printf("# setup: %.0f us per communicator (connect + accept, median of %u)\n",
              setup.median_connect_us, options_.comms);
  std::printf("# memory: %.0f KiB per communicator (RSS growth over the %zu this process holds)\n",
              setup.memory_per_comm_kib, setup.comms_held);
  std::printf("# lanes: %zu (%zu send, %zu receive communicators); endpoints per NIC:",
              stats.lanes.size(), send_comms, recv_comms);
  for (const auto& [nic, count] : stats.endpoints_per_nic)
    std::printf(" %s=%zu", nic.c_str(), count);
  std::printf("\n# registrations: %zu (fid_mr) held, MR cache %llu hits / %llu misses\n",
              registrations, static_cast<unsigned long long>(hits),
              static_cast<unsigned long long>(misses));
  std::printf("# bytes per rail (this side):");
  for (const auto& [rail, bytes] : per_rail) {
    std::printf(" %s %s;", rail.c_str(), bytes_text(static_cast<double>(bytes)).c_str());
  }
  std::printf("\n");
  if (options_.one_sided()) return;
  const auto count = [](std::uint64_t n) { return static_cast<unsigned long long>(n); };
  std::printf(
      "# protocol (this side): %llu sent ahead (%llu in fragments), %llu written; %llu asks for "
      "clearance, %llu clear-to-sends (%llu carried), %llu control messages pushed back\n",
      count(protocol.sent_ahead), count(protocol.fragmented), count(protocol.written),
      count(protocol.asks), count(protocol.clear_to_sends), count(protocol.carried),
      count(protocol.pushed_back));
}

void Report::write_json(const SetupFigures& setup, const ContextStats& stats,
                        const ProtocolCounts& protocol) const {
  if (options_.json.empty()) return;
  using nlohmann::json;
  const Config& c = context_.config();
  json nics = json::array();
  for (const auto& nic : context_.nics()) {
    nics.push_back({{"name", nic.name},
                    {"provider", nic.provider},
                    {"fabric", nic.fabric},
                    {"address", nic.address},
                    {"endpoint_mr", nic.endpoint_mr},
                    {"device_memory", nic.device_memory},
                    {"device_memory_note", nic.device_memory_note}});
  }
  json env = json::object();
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    if (entry.rfind("LOOM_", 0) == 0 || entry.rfind("FI_", 0) == 0) {
      const auto eq = entry.find('=');
      env[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
  }
  // A spread as JSON: null where it was not measured.
  const auto spread = [](const Spread& s) {
    return s.samples ? json{{"p50_us", s.p50_us}, {"p99_us", s.p99_us}, {"samples", s.samples}}
                     : json(nullptr);
  };
  json records = json::array();
  for (const Figures& f : rows_) {
    if (options_.one_sided()) {
      records.push_back({{"bytes", f.size},
                         {"blocks", f.rma.blocks},
                         {"batches", f.iterations},
                         {"total_bytes", f.bytes},
                         {"seconds", f.seconds},
                         {"mb_per_sec", f.mb_per_s()},
                         {"usec_per_xfer", f.usec_per_xfer()},
                         {"mxfers_per_sec", f.mxfers_per_s()},
                         {"gb_per_sec", f.gb_per_s()},
                         {"batch_latency", spread(f.rma.batch)},
                         {"time_to_notify", spread(f.rma.notify)},
                         {"latency_rounds", f.lat_rounds},
                         {"lone_batch_latency", spread(f.rma.lone_batch)},
                         {"lone_time_to_notify", spread(f.rma.lone_notify)}});
      continue;
    }
    records.push_back({{"bytes", f.size},
                       {"iterations", f.iterations},
                       {"total_bytes", f.bytes},
                       {"seconds", f.seconds},
                       {"mb_per_sec", f.mb_per_s()},
                       {"usec_per_xfer", f.usec_per_xfer()},
                       {"mxfers_per_sec", f.mxfers_per_s()},
                       {"gb_per_sec", f.gb_per_s()},
                       {"latency_avg_us", f.lat_avg_us},
                       {"latency_rounds", f.lat_rounds},
                       {"latency_p50_us", f.p50_us},
                       {"latency_p99_us", f.p99_us}});
  }
  std::uint64_t registrations = 0, registered_bytes = 0, endpoints = 0;
  for (const auto& lane : stats.lanes) {
    registrations += lane.registrations;
    registered_bytes += lane.registered_bytes;
    endpoints += lane.endpoints;
  }
  json document = {{"tool", "fi_p2p_bw"},
                   {"config",
                    {{"provider", context_.nics().front().provider},
                     {"nics", nics},
                     {"memory", options_.memory.describe()},
                     {"data_rails", c.data_rails},
                     {"control_rails", c.ctrl_rails},
                     {"comms", options_.comms},
                     {"groups", c.ngroups},
                     {"eager_max", c.eager_max},
                     {"min_stripe", c.min_stripe},
                     {"progress_thread", c.progress_thread},
                     {"window", options_.window},
                     {"bidir", options_.bidir},
                     {"verify", options_.verify},
                     {"op", op_name(options_.op)},
                     {"environment", env}}},
                   {"setup",
                    {{"connect_accept_us_median", setup.median_connect_us},
                     {"memory_kib_per_comm", setup.memory_per_comm_kib},
                     {"comms_held", setup.comms_held},
                     {"registrations", registrations},
                     {"registered_bytes", registered_bytes},
                     {"lane_endpoints", endpoints},
                     {"lanes", stats.lanes.size()}}},
                   {"results", records}};
  if (options_.one_sided()) {
    const bool notified = options_.op == Op::kWrite && options_.notify;
    document["config"]["blocks"] = options_.blocks;
    document["config"]["offsets"] = offsets_name(options_.offsets);
    document["config"]["notify"] = notified;
    document["config"]["notify_protocol"] =
        notified ? json(protocol_name(options_.notify_protocol)) : json(nullptr);
    document["config"]["loopback"] = options_.loopback;
  } else {
    document["protocol"] = {{"sent_ahead", protocol.sent_ahead},
                            {"fragmented", protocol.fragmented},
                            {"written", protocol.written},
                            {"asks", protocol.asks},
                            {"clear_to_sends", protocol.clear_to_sends},
                            {"carried", protocol.carried},
                            {"pushed_back", protocol.pushed_back}};
  }
  std::ofstream out(options_.json);
  if (!out) throw std::runtime_error("cannot write " + options_.json);
  out << document.dump(2) << "\n";
}

}  // namespace loom::bench
