// fi_p2p_bw: what a fabric gives through loom, with fabtests' options and columns: tagged
// messages (p2p_bw/session.hpp), or one-sided batches with --op write|read
// (p2p_bw/rma_session.hpp).
//   server: fi_p2p_bw [options]        client: fi_p2p_bw [options] SERVER
//   one host: fi_p2p_bw --loopback [options]
#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/oob.hpp"
#include "common/options.hpp"
#include "common/report.hpp"
#include "loom/p2p.hpp"
#include "p2p_bw/rma_session.hpp"
#include "p2p_bw/session.hpp"

namespace {

using loom::bench::Options;

// Pins this process to `core` (fabtests' --pin-core): two spinning processes sharing a core
// halve what loopback can show.
void pin_to(const std::vector<int>& cores, std::size_t which) {
  if (cores.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cores[std::min(which, cores.size() - 1)], &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) std::perror("fi_p2p_bw: --pin-core");
}

template <typename Session>
int run_session(const Options& options, loom::bench::Oob& oob) {
  Session session(options, oob);
  const auto setup = session.connect_all();
  loom::bench::Report report(options, session.context());
  const bool prints = options.is_client();
  if (prints) report.header();
  for (std::size_t i = 0; i < options.sizes.size(); ++i) {
    auto figures = session.measure(options.sizes[i]);
    if (prints) {
      report.row(figures);
      report.progress(i + 1, options.sizes.size());
    }
  }
  oob.sync();
  if (prints) {
    const auto stats = session.context().stats();
    const loom::bench::ProtocolCounts protocol = session.protocol_counts();
    report.footer(setup, stats, protocol);
    report.write_json(setup, stats, protocol);
  }
  return 0;
}

int run(const Options& options, loom::bench::Oob& oob) {
  options.memory.check();  // before any fabric setup: a missing GPU is the error to report
  return options.one_sided() ? run_session<loom::bench::RmaSession>(options, oob)
                             : run_session<loom::bench::Session>(options, oob);
}

int run_loopback(Options options) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    std::perror("fi_p2p_bw: socketpair");
    return 1;
  }
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("fi_p2p_bw: fork");
    return 1;
  }
  const auto timeout = std::chrono::seconds(options.timeout_s);
  if (child == 0) {
    ::close(fds[0]);
    pin_to(options.pin_cores, 0);
    int code = 0;
    try {
      loom::bench::Oob oob(fds[1], timeout);
      code = run(options, oob);  // server: no server address
    } catch (const loom::Error& e) {
      code = 1;  // a setup error: the client meets the same one and reports it
    } catch (const loom::bench::SharedError& e) {
      code = 1;  // the client reports it
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fi_p2p_bw (server): %s\n", e.what());
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(fds[1]);
  pin_to(options.pin_cores, 1);
  options.server = "127.0.0.1";
  int code = 0;
  try {
    loom::bench::Oob oob(fds[0], timeout);
    code = run(options, oob);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_bw: %s\n", e.what());
    code = 1;
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) code = code ? code : 1;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    if (loom::bench::parse_options(argc, argv, options) == loom::bench::ParseResult::kExit) {
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_bw: %s (try --help)\n", e.what());
    return 2;
  }
  if (options.provider_settings) {
    try {
      loom::bench::apply_provider_settings(loom::bench::make_config(options));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fi_p2p_bw: %s\n", e.what());  // a bad LOOM_* variable
      return 2;
    }
  }
  if (options.loopback) return run_loopback(options);
  pin_to(options.pin_cores, 0);
  try {
    const auto timeout = std::chrono::seconds(options.timeout_s);
    auto oob = options.is_client()
                   ? loom::bench::Oob::connect(options.server, options.port, timeout)
                   : loom::bench::Oob::accept(options.source, options.port, timeout);
    return run(options, oob);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_p2p_bw: %s\n", e.what());
    return 1;
  }
}
