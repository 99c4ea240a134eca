// fi_p2p_hub: what each extra peer costs one process. One hub and P peer processes on this
// host (loopback NICs only); the hub sets up N communicators each way with peer 1, 2, ... in
// turn, sends and checks one message on each, and at each checkpoint of --peers prints its
// lanes, endpoints, RSS and setup time.
//   fi_p2p_hub [--peers 1,2,4,8,16,32] [--comms-per-peer N] [-S SIZE] [--eager N] [--groups m]
//              [--timeout S] [--json FILE] [-q]
// The hub forks every peer before it makes its loom::Context; handles travel on a socketpair
// per peer.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/options.hpp"
#include "common/report.hpp"
#include "p2p_hub/hub_link.hpp"
#include "p2p_hub/hub_watchdog.hpp"

namespace {

using namespace loom::bench;
using Clock = std::chrono::steady_clock;

constexpr unsigned kMaxPeers = 256;

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// false: --help was printed. Throws std::invalid_argument with a one-line reason.
bool parse(int argc, char** argv, HubOptions& o) {
  CLI::App app{
      "fi_p2p_hub: what each extra peer costs one process through loom (lanes, endpoints, RSS,\n"
      "setup time). Forks the largest --peers count of peer processes on this host; the hub\n"
      "sets up N communicators each way with each peer in turn and checks one message on each.\n"
      "Rows: setup = the hub's loom calls that set a peer's comms up (connect, each connector's\n"
      "first poll and the one that returned its comm, each accept that returned one), median\n"
      "over the peers added since the previous row; handshake = wall time from sending the\n"
      "hub's handle to all 2N comms ready (median likewise); KiB/peer = RSS growth per peer\n"
      "since 1 peer."};
  app.get_formatter()->column_width(30);
  std::vector<unsigned> peers;
  std::string size = "1m";
  app.add_option("--peers", peers, "checkpoints, e.g. 1,2,4 (default 1,2,4,8,16,32)")
      ->delimiter(',')
      ->check(CLI::Range(1u, kMaxPeers));
  app.add_option("--comms-per-peer", o.comms, "send comms and receive comms per peer (default 1)")
      ->check(CLI::Range(1u, kMaxCommsPerPeer));
  app.add_option("-S,--size", size, "bytes of each message, k/m/g suffixes (default 1m)");
  app.add_option("--eager", o.eager,
                 "small messages (8 B-16 KiB) each way on each comm before the -S one (default 0)");
  add_shared_options(app, o.groups, o.timeout_s, "seconds for the whole run (default 120)", o.json,
                     "also write the rows and per-peer figures as JSON");
  app.add_flag("-q,--quiet", o.quiet, "only the header and the rows");
  if (!parse_command_line(app, argc, argv)) return false;
  if (peers.empty()) peers = {1, 2, 4, 8, 16, 32};
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  o.checkpoints = peers;
  try {
    o.size = parse_size(size);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("-S: ") + e.what());
  }
  if (o.size == 0) throw std::invalid_argument("-S: messages need at least one byte");
  if (o.size * o.comms > (std::size_t{1} << 30)) {
    throw std::invalid_argument("-S: size x comms per peer above 1 GiB");
  }
  return true;
}

struct PeerFigures {
  unsigned peer = 0;
  double setup_us = 0;
  double handshake_us = 0;
  double transfer_us = 0;  // from the comms' setup to the peer's ok
  long rss_setup_kib = 0;  // the hub's once this peer's comms were set up
  long rss_kib = 0;        // ... and once a message went each way on each
  std::size_t lanes = 0;
  std::size_t endpoints = 0;
  std::uint64_t lanes_opened = 0;
  std::vector<std::pair<std::string, std::size_t>> endpoints_per_nic;
};

struct Row {
  unsigned peers = 0;
  double growth_kib = NAN;  // RSS growth per peer since 1 peer; NaN at 1
  double setup_us = 0;      // medians over the peers added since the previous row
  double handshake_us = 0;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string endpoints_text(const PeerFigures& f) {
  std::string text;
  for (const auto& [nic, count] : f.endpoints_per_nic) {
    text += (text.empty() ? "" : ",") + nic + "=" + std::to_string(count);
  }
  return text.empty() ? "-" : text;
}

class Hub {
 public:
  Hub(const HubOptions& options, const loom::Config& config, std::vector<Oob>& oobs,
      Watchdog& watchdog)
      : options_(options),
        oobs_(oobs),
        watchdog_(watchdog),
        context_(config),
        listener_(context_.listen()) {
    // Once for every peer, before the first: RSS growth is the peers' alone.
    send_buffer_.assign(options.comms * options.size, std::byte{0});
    recv_buffer_.assign(options.comms * options.size, std::byte{0});
    rss_before_kib_ = resident_kib();
  }

  // Adds peers 1..P in turn, printing a row at each checkpoint. Throws std::runtime_error
  // naming the peer and the step.
  void run();
  // Closes the hub's comms; returns what failed ("" when nothing did).
  std::string close_comms();
  void write_json(bool ok, const std::string& error) const;

 private:
  void header() const;
  PeerFigures add_peer(unsigned peer);
  void row(unsigned peers);

  const HubOptions& options_;
  std::vector<Oob>& oobs_;
  Watchdog& watchdog_;
  loom::Context context_;
  loom::Listener listener_;
  // Declared before the comms, which may write into them until they are closed.
  HostBuffer send_buffer_;
  HostBuffer recv_buffer_;
  std::vector<loom::Handle> handles_;  // each peer's listen handle
  std::vector<HubLink> links_;
  std::vector<PeerFigures> peers_;
  std::vector<Row> rows_;
  double close_ms_ = 0;
  long rss_before_kib_ = 0;  // before the first peer (context, listener and buffers made)
};

void Hub::header() const {
  const loom::Config& c = context_.config();
  const auto nics = context_.nics();
  std::printf("# fi_p2p_hub (loom) provider %s, %zu NIC(s):", nics.front().provider.c_str(),
              nics.size());
  for (const auto& nic : nics) std::printf(" %s", nic.name.c_str());
  std::printf("; size %s, comms per peer %u, groups %u%s, peers %u\n",
              size_text(static_cast<double>(options_.size)).c_str(), options_.comms, c.ngroups,
              c.ngroups == 0 ? " (no sharing)" : "", options_.peers());
  std::printf("%-6s %-6s %-16s %-9s %-9s %-10s %-13s\n", "peers", "lanes", "endpoints/NIC",
              "RSS(MiB)", "KiB/peer", "setup(us)", "handshake(us)");
  std::fflush(stdout);
}

void Hub::run() {
  header();
  // Every peer's handle first: then the peers have made their contexts and wait, idle, while
  // the hub measures.
  for (unsigned peer = 1; peer <= options_.peers(); ++peer) {
    const std::string step = "peer " + std::to_string(peer) + ": waiting for its listen handle";
    watchdog_.pending(step);
    try {
      auto [kind, body] = receive_message(oobs_[peer - 1]);
      if (kind == HubMessage::kFailed) throw std::runtime_error(text_of(body));
      if (kind != HubMessage::kHandle) throw std::runtime_error("unexpected message");
      handles_.push_back(loom::Handle::from_bytes(body));
    } catch (const std::exception& e) {
      throw std::runtime_error(step + ": " + e.what());
    }
  }
  for (unsigned peer = 1; peer <= options_.peers(); ++peer) {
    peers_.push_back(add_peer(peer));
    const PeerFigures& f = peers_.back();
    if (!options_.quiet) {
      std::printf(
          "# peer %u: setup %.0f us, handshake %.0f us, RSS %.1f MiB, lanes %zu (%llu "
          "opened), endpoints %zu\n",
          peer, f.setup_us, f.handshake_us, static_cast<double>(f.rss_kib) / 1024, f.lanes,
          static_cast<unsigned long long>(f.lanes_opened), f.endpoints);
      std::fflush(stdout);
    }
    if (std::binary_search(options_.checkpoints.begin(), options_.checkpoints.end(), peer)) {
      row(peer);
    }
  }
}

PeerFigures Hub::add_peer(unsigned peer) {
  Oob& oob = oobs_[peer - 1];
  const std::string who = "peer " + std::to_string(peer);
  std::string step;
  auto at = [&](const char* what) {
    step = what;
    watchdog_.pending(who + ": " + what);
  };
  bool reported = false;  // the peer's ok, which can come while the hub still polls its sends
  unsigned passes = 0;
  const Watch watch = [&](std::size_t done, std::size_t total) {
    watchdog_.progress(done, total);
    if ((++passes & 63) != 0 || !oob.readable()) return;
    auto [kind, body] = receive_message(oob);
    if (kind == HubMessage::kOk && !reported) {
      reported = true;
      return;
    }
    if (kind == HubMessage::kFailed) throw std::runtime_error("the peer failed: " + text_of(body));
    throw std::runtime_error("unexpected message from the peer");
  };
  try {
    PeerFigures f;
    f.peer = peer;
    at("connect/accept");
    const auto start = Clock::now();
    send_message(oob, HubMessage::kHandle, listener_.handle().view());
    links_.push_back(open_link(context_, listener_, handles_[peer - 1], options_.comms, watch));
    f.handshake_us = micros_since(start);
    f.setup_us = links_.back().setup_us;
    f.rss_setup_kib = resident_kib();
    const auto transfer_start = Clock::now();
    at("transfer");
    exchange_traffic(links_.back(), peer, Direction::kToPeer, options_, send_buffer_, recv_buffer_,
                     watch);
    at("waiting for the peer's ok");
    if (!reported) {
      auto [kind, body] = receive_message(oob);
      if (kind == HubMessage::kFailed)
        throw std::runtime_error("the peer failed: " + text_of(body));
      if (kind != HubMessage::kOk) throw std::runtime_error("unexpected message from the peer");
    }
    f.transfer_us = micros_since(transfer_start);
    at("stats");
    f.rss_kib = resident_kib();
    const loom::ContextStats stats = context_.stats();
    f.lanes = stats.lanes.size();
    f.lanes_opened = stats.lanes_opened;
    f.endpoints_per_nic = stats.endpoints_per_nic;
    for (const auto& lane : stats.lanes) f.endpoints += lane.endpoints;
    return f;
  } catch (const std::exception& e) {
    throw std::runtime_error(who + ": " + step + ": " + e.what());
  }
}

void Hub::row(unsigned peers) {
  Row r;
  r.peers = peers;
  const unsigned first = rows_.empty() ? 1 : rows_.back().peers + 1;
  std::vector<double> setup, handshake;
  for (unsigned p = first; p <= peers; ++p) {
    setup.push_back(peers_[p - 1].setup_us);
    handshake.push_back(peers_[p - 1].handshake_us);
  }
  r.setup_us = median(setup);
  r.handshake_us = median(handshake);
  const PeerFigures& f = peers_[peers - 1];
  std::string growth = "-";
  if (peers > 1) {
    r.growth_kib = static_cast<double>(f.rss_kib - peers_.front().rss_kib) / (peers - 1);
    char text[32];
    std::snprintf(text, sizeof text, "%.0f", r.growth_kib);
    growth = text;
  }
  rows_.push_back(r);
  std::printf("%-6u %-6zu %-16s %-9.1f %-9s %-10.0f %-13.0f\n", peers, f.lanes,
              endpoints_text(f).c_str(), static_cast<double>(f.rss_kib) / 1024, growth.c_str(),
              r.setup_us, r.handshake_us);
  std::fflush(stdout);
}

std::string Hub::close_comms() {
  watchdog_.pending("closing the hub's comms");
  std::string failed;
  const auto start = Clock::now();
  for (std::size_t i = 0; i < links_.size(); ++i) {
    if (const std::string why = links_[i].close(); !why.empty()) {
      failed += (failed.empty() ? "" : "; ") + ("peer " + std::to_string(i + 1) + ": " + why);
    }
  }
  close_ms_ = micros_since(start) / 1000;
  return failed;
}

void Hub::write_json(bool ok, const std::string& error) const {
  if (options_.json.empty()) return;
  using nlohmann::json;
  const loom::Config& c = context_.config();
  const auto nics = context_.nics();
  json nic_names = json::array();
  for (const auto& nic : nics) nic_names.push_back(nic.name);
  auto per_nic = [](const PeerFigures& f) {
    json out = json::object();
    for (const auto& [nic, count] : f.endpoints_per_nic) out[nic] = count;
    return out;
  };
  json rows = json::array();
  for (const Row& r : rows_) {
    const PeerFigures& f = peers_[r.peers - 1];
    rows.push_back(
        {{"peers", r.peers},
         {"lanes", f.lanes},
         {"lanes_opened", f.lanes_opened},
         {"endpoints", f.endpoints},
         {"endpoints_per_nic", per_nic(f)},
         {"rss_kib", f.rss_kib},
         {"rss_growth_kib_per_peer", std::isnan(r.growth_kib) ? json(nullptr) : json(r.growth_kib)},
         {"setup_us_median", r.setup_us},
         {"handshake_us_median", r.handshake_us}});
  }
  json per_peer = json::array();
  for (const PeerFigures& f : peers_) {
    per_peer.push_back({{"peer", f.peer},
                        {"setup_us", f.setup_us},
                        {"handshake_us", f.handshake_us},
                        {"transfer_us", f.transfer_us},
                        {"rss_setup_kib", f.rss_setup_kib},
                        {"rss_kib", f.rss_kib},
                        {"lanes", f.lanes},
                        {"lanes_opened", f.lanes_opened},
                        {"endpoints", f.endpoints},
                        {"endpoints_per_nic", per_nic(f)}});
  }
  const json document = {{"tool", "fi_p2p_hub"},
                         {"ok", ok},
                         {"error", error},
                         {"config",
                          {{"provider", nics.front().provider},
                           {"nics", nic_names},
                           {"size", options_.size},
                           {"comms_per_peer", options_.comms},
                           {"groups", c.ngroups},
                           {"data_rails", c.data_rails},
                           {"control_rails", c.ctrl_rails},
                           {"peers", options_.peers()},
                           {"checkpoints", options_.checkpoints},
                           {"timeout_s", options_.timeout_s}}},
                         {"rows", rows},
                         {"per_peer", per_peer},
                         {"close_ms", close_ms_},
                         {"rss_before_kib", rss_before_kib_}};
  std::ofstream out(options_.json);
  if (!out) throw std::runtime_error("cannot write " + options_.json);
  out << document.dump(2) << "\n";
}

// Waits for every peer to exit; prints each that failed (with what it reported, once for
// each text: every peer meets an error of the environment alike) and returns how many.
// `hub_context_error`: why the hub's own context failed, if it did.
std::size_t wait_peers(Watchdog& watchdog, std::vector<Oob>& oobs,
                       const std::string& hub_context_error) {
  std::map<std::string, std::size_t> said;  // a peer's report -> the first peer to make it
  std::vector<bool> done(watchdog.children(), false);
  std::size_t left = done.size(), failed = 0;
  std::size_t named = 0;  // `left` when the watchdog was last told
  while (left > 0) {
    if (named != left) {
      std::string which;
      for (std::size_t i = 0; i < done.size() && which.size() < 200; ++i) {
        if (!done[i]) which += (which.empty() ? "" : ", ") + std::to_string(i + 1);
      }
      watchdog.pending("waiting for peer(s) " + which + " to exit");
      named = left;
    }
    bool reaped = false;
    for (std::size_t i = 0; i < done.size(); ++i) {
      if (done[i]) continue;
      const std::optional<int> status = watchdog.try_reap(i);
      if (!status) continue;
      done[i] = true;
      --left;
      reaped = true;
      if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) continue;
      ++failed;
      std::string report;
      try {
        while (oobs[i].readable()) {
          auto [kind, body] = receive_message(oobs[i]);
          if (kind == HubMessage::kFailed) report = text_of(body);
        }
      } catch (const std::exception&) {
        // The end of the socket: nothing more was said.
      }
      if (!report.empty()) {
        const auto [first, fresh] = said.emplace(report, i + 1);
        if (!hub_context_error.empty() && report == "context: " + hub_context_error) {
          report = ": context: as the hub's";
        } else if (!fresh) {
          report = ": as peer " + std::to_string(first->second);
        } else {
          report = ": " + report;
        }
      }
      if (watchdog.expired()) continue;
      std::fprintf(stderr, "fi_p2p_hub: peer %zu: %s %d%s\n", i + 1,
                   WIFEXITED(*status) ? "exited with status" : "killed by signal",
                   WIFEXITED(*status) ? WEXITSTATUS(*status) : WTERMSIG(*status), report.c_str());
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return failed;
}

// Forks peer `peer`, which runs run_peer and exits. Returns its pid and keeps the hub's end of
// its socketpair in `oobs`.
pid_t fork_peer(const HubOptions& options, const loom::Config& config, unsigned peer,
                Clock::time_point start, std::vector<Oob>& oobs) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
  }
  const pid_t hub = ::getpid();
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  const auto timeout = std::chrono::seconds(options.timeout_s);
  if (child == 0) {
    ::close(fds[0]);
    oobs.clear();  // the hub's ends of earlier peers: they must see the hub go when it goes
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != hub) ::_exit(1);
    int code = 1;
    {
      Oob oob(fds[1], timeout);
      // A little after the hub's own deadline, so that the hub is the one to report it.
      code = run_peer(options, config, peer, oob, start + timeout + std::chrono::seconds(5));
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(fds[1]);
  oobs.emplace_back(fds[0], timeout);
  return child;
}

}  // namespace

int main(int argc, char** argv) {
  HubOptions options;
  loom::Config config;
  try {
    if (!parse(argc, argv, options)) return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_hub: %s (try --help)\n", e.what());
    return 2;
  }
  try {
    config = hub_config(options);  // before any fork: an invalid LOOM_* is one error
    loom::bench::apply_provider_settings(config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_hub: %s\n", e.what());
    return 2;
  }
  const auto start = Clock::now();
  std::vector<Oob> oobs;
  oobs.reserve(options.peers());
  std::vector<pid_t> children;
  std::string error;
  for (unsigned peer = 1; peer <= options.peers() && error.empty(); ++peer) {
    try {
      children.push_back(fork_peer(options, config, peer, start, oobs));
    } catch (const std::exception& e) {
      error = "forking peer " + std::to_string(peer) + ": " + e.what();
      std::fprintf(stderr, "fi_p2p_hub: %s\n", error.c_str());
    }
  }
  Watchdog watchdog(std::chrono::seconds(options.timeout_s), start, children);
  // After the deadline the watchdog speaks: a peer it killed is no news.
  auto complain = [&](const std::string& text) {
    if (!watchdog.expired()) std::fprintf(stderr, "fi_p2p_hub: %s\n", text.c_str());
  };
  std::optional<Hub> hub;
  std::string hub_context_error;
  if (error.empty()) {
    try {
      watchdog.pending("the hub's context");
      hub.emplace(options, config, oobs, watchdog);
      hub->run();
    } catch (const std::exception& e) {
      if (!hub) hub_context_error = e.what();
      error = std::string(hub ? "" : "hub: ") + e.what();
      complain(error);
    }
  }
  // Peers not reached yet get finish instead of the hub's handle, and exit.
  watchdog.pending("sending finish to the peers");
  for (Oob& oob : oobs) {
    try {
      send_message(oob, HubMessage::kFinish);
    } catch (const std::exception&) {
      // A peer that is gone: its exit status says why.
    }
  }
  if (hub) {
    if (const std::string failed = hub->close_comms(); !failed.empty()) {
      complain(failed);
      if (error.empty()) error = failed;
    }
  }
  const std::size_t failed_peers = wait_peers(watchdog, oobs, hub_context_error);
  if (error.empty() && failed_peers > 0) {
    error = std::to_string(failed_peers) + " peer(s) failed";
  }
  if (hub) {
    try {
      hub->write_json(error.empty(), error);
    } catch (const std::exception& e) {
      complain(e.what());
      if (error.empty()) error = e.what();
    }
  }
  watchdog.pending("closing the hub's context");
  hub.reset();
  return error.empty() ? 0 : 1;
}
