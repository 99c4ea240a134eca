#include "p2p_alltoall/report.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "common/report.hpp"
#include "p2p_alltoall/traffic.hpp"

namespace loom::bench {
namespace {

using nlohmann::json;

double median_of(std::vector<double> values) {
  return percentile(values, 50);
}

// Every rank's samples of one figure, pooled.
std::vector<double> pooled(const std::vector<json>& rows, const char* phase) {
  std::vector<double> all;
  for (const json& row : rows) {
    const json& samples = phase ? row.at(phase).at("samples_us") : row.at("samples_us");
    for (const json& s : samples) all.push_back(s.get<double>());
  }
  return all;
}

std::vector<double> column(const std::vector<json>& rows, const json::json_pointer& at) {
  std::vector<double> values;
  for (const json& row : rows) values.push_back(row.at(at).get<double>());
  return values;
}

// What the JSON file keeps of a row: all but the raw samples.
json without_samples(json row) {
  if (row.is_object()) {
    row.erase("samples_us");
    for (auto& [key, value] : row.items()) value = without_samples(value);
  }
  return row;
}

json footprint_json(const Footprint& f) {
  json per_nic = json::object();
  for (const auto& [nic, count] : f.endpoints_per_nic) per_nic[nic] = count;
  return {{"endpoints", f.endpoints},
          {"endpoints_per_nic", per_nic},
          {"lanes", f.lanes},
          {"lanes_opened", f.lanes_opened},
          {"rss_kib", f.rss_kib}};
}

}  // namespace

RankReport::RankReport(const AlltoallOptions& options, Mesh& mesh, bool oversubscribed)
    : options_(options), mesh_(mesh), oversubscribed_(oversubscribed) {
  if (prints()) {
    for (int r = 0; r < mesh.size(); ++r) ranks_.push_back(json::object());
  }
}

std::vector<json> RankReport::gather(const json& mine) const {
  std::vector<json> all;
  for (const std::string& text : mesh_.world().gather(mine.dump())) {
    all.push_back(json::parse(text));
  }
  return all;
}

void RankReport::header(const std::vector<ProviderSetting>& settings) const {
  if (!prints()) return;
  for (const ProviderSetting& s : settings) {
    std::printf("# %s=%s (loom's recommendation: %s)\n", s.name.c_str(), s.value.c_str(),
                s.why.c_str());
  }
  const Config& c = mesh_.context().config();
  const auto nics = mesh_.context().nics();
  const World& world = mesh_.world();
  std::printf("# fi_p2p_alltoall (loom) provider %s, %zu NIC(s):", nics.front().provider.c_str(),
              nics.size());
  for (const auto& nic : nics) std::printf(" %s/%s", nic.fabric.c_str(), nic.name.c_str());
  std::printf("\n# ranks %d on %d host(s), %d on rank 0's host%s%s\n", world.size(), world.hosts(),
              world.local_size(),
              oversubscribed_ ? " (more than its cores: bandwidth means little here)" : "",
              mesh_.yields() ? ", idle waits yield" : "");
  std::printf("# data rails %u, control rails %u, groups %u, eager limit %s%s\n", c.data_rails,
              c.ctrl_rails, c.ngroups,
              size_text(static_cast<double>(nics.front().eager_max)).c_str(),
              options_.verify ? ", verified" : "");
  std::fflush(stdout);
}

void RankReport::pairs(const std::string& mode, json mine) {
  const std::vector<json> all = gather(mine);
  if (!prints()) return;
  const int n = mesh_.size();
  const json& first = all.front();
  std::printf(
      "# pairs %s, %s x %zu messages, window %zu: MB/sec from the row's rank to the "
      "column's%s\n",
      mode.c_str(), size_text(first.at("size").get<double>()).c_str(),
      first.at("messages").get<std::size_t>(), first.at("window").get<std::size_t>(),
      mode == "in turn" ? ", each pair alone" : ", all pairs at once");
  std::printf("%-8s", "from\\to");
  for (int to = 0; to < n; ++to) std::printf(" %-9d", to);
  std::printf("\n");
  std::vector<double> rates;
  double bytes = 0, elapsed = 0;
  for (int from = 0; from < n; ++from) {
    const json& row = all[static_cast<std::size_t>(from)];
    std::printf("%-8d", from);
    for (int to = 0; to < n; ++to) {
      if (to == from) {
        std::printf(" %-9s", "-");
        continue;
      }
      // Each rank measured what reached it: column `to` is rank `to`'s figures.
      const double rate = all[static_cast<std::size_t>(to)]
                              .at("mb_per_s")
                              .at(static_cast<std::size_t>(from))
                              .get<double>();
      rates.push_back(rate);
      std::printf(" %-9.1f", rate);
    }
    std::printf("\n");
    bytes += row.at("bytes").get<double>();
    elapsed = std::max(elapsed, row.at("elapsed_s").get<double>());
  }
  std::vector<double> sorted = rates;
  const double low = percentile(sorted, 0), high = percentile(sorted, 100);
  const double aggregate = mode == "in turn" ? 0 : (elapsed > 0 ? bytes / elapsed / 1e6 : 0);
  std::printf("# min %.1f, median %.1f, max %.1f MB/sec", low, median_of(rates), high);
  if (mode != "in turn") std::printf("; aggregate %.1f MB/sec", aggregate);
  std::printf("\n");
  std::fflush(stdout);
  json summary = {{"mode", mode},
                  {"size", first.at("size")},
                  {"messages", first.at("messages")},
                  {"min_mb_per_s", low},
                  {"median_mb_per_s", median_of(rates)},
                  {"max_mb_per_s", high}};
  if (mode != "in turn") summary["aggregate_mb_per_s"] = aggregate;
  json matrix = json::array();  // [from][to]
  for (int from = 0; from < n; ++from) {
    json row = json::array();
    for (int to = 0; to < n; ++to) {
      row.push_back(
          all[static_cast<std::size_t>(to)].at("mb_per_s").at(static_cast<std::size_t>(from)));
    }
    matrix.push_back(row);
  }
  summary["matrix_mb_per_s"] = matrix;
  aggregate_["pairs"].push_back(summary);
  for (int r = 0; r < n; ++r)
    ranks_[static_cast<std::size_t>(r)]["pairs"].push_back(all[static_cast<std::size_t>(r)]);
}

void RankReport::alltoall(json mine) {
  const std::vector<json> all = gather(mine);
  if (!prints()) return;
  const int n = mesh_.size();
  const json& first = all.front();
  if (!aggregate_.contains("alltoall")) {
    std::printf(
        "# alltoall: every rank sends S bytes to each of the %d others per iteration "
        "(two-sided), %zu iteration(s) in flight; time: slowest rank; MB/sec: all ranks' "
        "bytes / time\n",
        n - 1, options_.depth);
    std::printf("%-8s %-8s %-8s %-9s %-10s %-10s %-10s %-9s %-9s\n", "bytes", "iters", "total",
                "time", "MB/sec", "rankMB/s", "usec/iter", "p50(us)", "p99(us)");
  }
  const auto size = first.at("size").get<double>();
  const auto iterations = first.at("iterations").get<double>();
  const double total = size * iterations * n * (n - 1);
  std::vector<double> seconds = column(all, json::json_pointer("/seconds"));
  const double time = *std::max_element(seconds.begin(), seconds.end());
  std::vector<double> means = column(all, json::json_pointer("/mean_us"));
  std::vector<double> samples = pooled(all, nullptr);
  const double p50 = percentile(samples, 50), p99 = percentile(samples, 99);
  const double rank_rate = median_of(column(all, json::json_pointer("/mb_per_s")));
  const double rate = time > 0 ? total / time / 1e6 : 0;
  std::printf("%-8s %-8.0f %-8s %-9.3f %-10.1f %-10.1f %-10.1f %-9.1f %-9.1f\n",
              size_text(size).c_str(), iterations, size_text(total).c_str(), time, rate, rank_rate,
              *std::max_element(means.begin(), means.end()), p50, p99);
  if (!options_.quiet) {
    for (int r = 0; r < n; ++r) {
      json row = all[static_cast<std::size_t>(r)];
      std::printf("#   rank %-4d %.1f MB/sec, p50 %.1f us, p99 %.1f us\n", r,
                  row.at("mb_per_s").get<double>(), row.at("p50_us").get<double>(),
                  row.at("p99_us").get<double>());
    }
  }
  std::fflush(stdout);
  aggregate_["alltoall"].push_back(
      {{"size", size},
       {"iterations", iterations},
       {"bytes", total},
       {"seconds", time},
       {"mb_per_s", rate},
       {"rank_mb_per_s_median", rank_rate},
       {"usec_per_iteration", *std::max_element(means.begin(), means.end())},
       {"p50_us", p50},
       {"p99_us", p99}});
  for (int r = 0; r < n; ++r) {
    ranks_[static_cast<std::size_t>(r)]["alltoall"].push_back(
        without_samples(all[static_cast<std::size_t>(r)]));
  }
}

void RankReport::expert(json mine) {
  const std::vector<json> all = gather(mine);
  if (!prints()) return;
  const int n = mesh_.size();
  const json& first = all.front();
  std::printf(
      "# ep: %zu tokens of %s bytes per rank, each to %zu of the %d others (seeded "
      "top-k, seed %llu); a write batch and a count notification per destination; "
      "combine writes them back\n",
      first.at("tokens").get<std::size_t>(), size_text(first.at("hidden").get<double>()).c_str(),
      first.at("topk").get<std::size_t>(), n - 1, static_cast<unsigned long long>(options_.seed));
  std::printf("%-9s %-8s %-9s %-7s %-10s %-9s %-9s %-10s %-8s\n", "phase", "tokens", "bytes",
              "iters", "usec/iter", "p50(us)", "p99(us)", "Mtokens/s", "GB/s");
  json summary = {{"tokens", first.at("tokens")},
                  {"hidden", first.at("hidden")},
                  {"topk", first.at("topk")},
                  {"iterations", first.at("iterations")}};
  for (const char* phase : {"dispatch", "combine"}) {
    const std::string at = std::string("/") + phase;
    std::vector<double> samples = pooled(all, phase);
    std::vector<double> means = column(all, json::json_pointer(at + "/mean_us"));
    double tokens = 0, bytes = 0, tokens_per_s = 0, gb_per_s = 0;
    for (const json& row : all) {
      tokens += row.at(phase).at("tokens").get<double>();
      bytes += row.at(phase).at("bytes").get<double>();
      tokens_per_s += row.at(phase).at("tokens_per_s").get<double>();
      gb_per_s += row.at(phase).at("gb_per_s").get<double>();
    }
    const double slowest = *std::max_element(means.begin(), means.end());
    const double p50 = percentile(samples, 50), p99 = percentile(samples, 99);
    std::printf("%-9s %-8.0f %-9s %-7zu %-10.1f %-9.1f %-9.1f %-10.3f %-8.3f\n", phase, tokens,
                size_text(bytes).c_str(), first.at("iterations").get<std::size_t>(), slowest, p50,
                p99, tokens_per_s / 1e6, gb_per_s);
    summary[phase] = {{"tokens_per_iteration", tokens},
                      {"bytes_per_iteration", bytes},
                      {"usec_per_iteration", slowest},
                      {"p50_us", p50},
                      {"p99_us", p99},
                      {"tokens_per_s", tokens_per_s},
                      {"gb_per_s", gb_per_s}};
  }
  if (!options_.quiet) {
    for (int r = 0; r < n; ++r) {
      const json& row = all[static_cast<std::size_t>(r)];
      std::printf(
          "#   rank %-4d dispatch p50 %.1f p99 %.1f us, combine p50 %.1f p99 %.1f us, "
          "%.3f Mtokens/s\n",
          r, row.at("dispatch").at("p50_us").get<double>(),
          row.at("dispatch").at("p99_us").get<double>(),
          row.at("combine").at("p50_us").get<double>(),
          row.at("combine").at("p99_us").get<double>(),
          row.at("dispatch").at("tokens_per_s").get<double>() / 1e6);
    }
  }
  std::fflush(stdout);
  aggregate_["ep"] = summary;
  for (int r = 0; r < n; ++r)
    ranks_[static_cast<std::size_t>(r)]["ep"] = without_samples(all[static_cast<std::size_t>(r)]);
}

void RankReport::finish(const Footprint& base, const Footprint& connected, const Footprint& end) {
  const MeshSetup& s = mesh_.setup();
  const World& world = mesh_.world();
  const json mine = {{"rank", world.rank()},
                     {"host", world.host()},
                     {"local_rank", world.local_rank()},
                     {"setup",
                      {{"wall_ms", s.wall_ms},
                       {"calls_ms", s.calls_ms},
                       {"calls_cpu_ms", s.calls_cpu_ms},
                       {"first_peer_us", s.first_peer_us},
                       {"per_peer_us", s.per_peer_us},
                       {"per_peer_mean_us", s.per_peer_mean_us},
                       {"first_peer_cpu_us", s.first_peer_cpu_us},
                       {"per_peer_cpu_us", s.per_peer_cpu_us},
                       {"per_peer_cpu_mean_us", s.per_peer_cpu_mean_us},
                       {"regions_ms", s.regions_ms},
                       {"close_ms", s.close_ms}}},
                     {"before_setup", footprint_json(base)},
                     {"after_setup", footprint_json(connected)},
                     {"after_traffic", footprint_json(end)}};
  const std::vector<json> all = gather(mine);
  if (!prints()) return;
  const int n = mesh_.size();
  const double peers = n > 1 ? n - 1 : 1;
  // setup+/total+: RSS growth since before the first connection, once every connection was
  // set up and after the traffic; first/peer: time in loom's setup calls (wall and CPU).
  if (!options_.quiet) {
    std::printf("%-5s %-10s %-9s %-5s %-8s %-9s %-9s %-9s %-9s %-9s %-9s %-11s %-8s\n", "rank",
                "host", "endpoints", "lanes", "RSS(MiB)", "setup+KiB", "total+KiB", "setup(ms)",
                "first(us)", "peer(us)", "peerCPU", "regions(ms)", "close(ms)");
  }
  std::vector<double> endpoints, lanes, setup_growth, end_growth, per_peer, per_peer_cpu,
      per_peer_mean, per_peer_cpu_mean, first_peer, wall;
  for (const json& r : all) {
    const json& setup = r.at("setup");
    const double before = r.at("before_setup").at("rss_kib").get<double>();
    const double grown = r.at("after_setup").at("rss_kib").get<double>() - before;
    const double grown_end = r.at("after_traffic").at("rss_kib").get<double>() - before;
    endpoints.push_back(r.at("after_traffic").at("endpoints").get<double>());
    lanes.push_back(r.at("after_traffic").at("lanes").get<double>());
    setup_growth.push_back(grown);
    end_growth.push_back(grown_end);
    per_peer.push_back(setup.at("per_peer_us").get<double>());
    per_peer_cpu.push_back(setup.at("per_peer_cpu_us").get<double>());
    per_peer_mean.push_back(setup.at("per_peer_mean_us").get<double>());
    per_peer_cpu_mean.push_back(setup.at("per_peer_cpu_mean_us").get<double>());
    first_peer.push_back(setup.at("first_peer_us").get<double>());
    wall.push_back(setup.at("wall_ms").get<double>());
    if (options_.quiet) continue;
    std::printf(
        "%-5d %-10.10s %-9zu %-5zu %-8.1f %-9.0f %-9.0f %-9.1f %-9.0f %-9.0f %-9.0f "
        "%-11.1f %-8.1f\n",
        r.at("rank").get<int>(), r.at("host").get<std::string>().c_str(),
        r.at("after_traffic").at("endpoints").get<std::size_t>(),
        r.at("after_traffic").at("lanes").get<std::size_t>(),
        r.at("after_traffic").at("rss_kib").get<double>() / 1024, grown, grown_end,
        setup.at("wall_ms").get<double>(), setup.at("first_peer_us").get<double>(),
        setup.at("per_peer_us").get<double>(), setup.at("per_peer_cpu_us").get<double>(),
        setup.at("regions_ms").get<double>(), setup.at("close_ms").get<double>());
  }
  auto high = [](std::vector<double> v) { return *std::max_element(v.begin(), v.end()); };
  auto low = [](std::vector<double> v) { return *std::min_element(v.begin(), v.end()); };
  const double setup_kib = median_of(setup_growth), end_kib = median_of(end_growth);
  std::printf(
      "# every rank: endpoints %.0f-%.0f, lanes %.0f-%.0f; RSS growth (median) %.0f KiB "
      "at setup, %.0f KiB after traffic (/%d peers: %.0f KiB, the lanes included)\n",
      low(endpoints), high(endpoints), low(lanes), high(lanes), setup_kib, end_kib, n - 1,
      end_kib / peers);
  std::printf(
      "# setup (medians over ranks): first peer %.0f us; each other peer %.0f us "
      "(%.0f us CPU), mean %.0f us (%.0f us CPU); wall %.1f ms (slowest rank)\n",
      median_of(first_peer), median_of(per_peer), median_of(per_peer_cpu), median_of(per_peer_mean),
      median_of(per_peer_cpu_mean), high(wall));
  std::fflush(stdout);
  aggregate_["resources"] = {{"endpoints_min", low(endpoints)},
                             {"endpoints_max", high(endpoints)},
                             {"lanes_min", low(lanes)},
                             {"lanes_max", high(lanes)},
                             {"rss_growth_setup_kib_median", setup_kib},
                             {"rss_growth_end_kib_median", end_kib},
                             {"setup_per_peer_us_median", median_of(per_peer)},
                             {"setup_per_peer_us_max", high(per_peer)},
                             {"setup_per_peer_cpu_us_median", median_of(per_peer_cpu)},
                             {"setup_per_peer_cpu_us_max", high(per_peer_cpu)},
                             {"setup_per_peer_mean_us_median", median_of(per_peer_mean)},
                             {"setup_per_peer_cpu_mean_us_median", median_of(per_peer_cpu_mean)},
                             {"setup_first_peer_us_median", median_of(first_peer)},
                             {"setup_wall_ms_max", high(wall)}};
  if (options_.json.empty()) return;
  const Config& c = mesh_.context().config();
  const auto nics = mesh_.context().nics();
  json nic_names = json::array();
  for (const auto& nic : nics) nic_names.push_back(nic.name);
  for (std::size_t r = 0; r < all.size(); ++r) ranks_[r].update(all[r]);
  const json document = {{"tool", "fi_p2p_alltoall"},
                         {"config",
                          {{"provider", nics.front().provider},
                           {"nics", nic_names},
                           {"ranks", n},
                           {"hosts", world.hosts()},
                           {"oversubscribed", oversubscribed_},
                           {"yield", mesh_.yields()},
                           {"data_rails", c.data_rails},
                           {"control_rails", c.ctrl_rails},
                           {"groups", c.ngroups},
                           {"verify", options_.verify},
                           {"window", options_.window},
                           {"depth", options_.depth},
                           {"warmup", options_.warmup}}},
                         {"aggregate", aggregate_},
                         {"ranks", ranks_}};
  std::ofstream out(options_.json);
  if (!out) throw std::runtime_error("cannot write " + options_.json);
  out << document.dump(2) << "\n";
}

}  // namespace loom::bench
