// Direct-connect meshes in network namespaces this test makes itself: hosts joined pairwise by
// veth pairs, each pair its own subnet, no routes between the others. Every transfer must leave
// through the NIC on the peer's subnet, which the communicator reports and the interfaces' byte
// counters confirm. Needs root (ip netns); without it the binary exits 77 (meson: skipped).
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include "p2p/messages.hpp"
#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

int run_quietly(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str());
}

std::string link_state(const std::string& netns, const std::string& ifname) {
  std::string out;
  if (FILE* pipe = ::popen(("ip -n " + netns + " -o link show dev " + ifname).c_str(), "r")) {
    char buffer[512];
    while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
    ::pclose(pipe);
  }
  return out;
}

// Named network namespaces with veth links between them; all deleted (links with them) at the
// end. Names carry the pid so parallel runs never meet.
class Mesh {
 public:
  explicit Mesh(const std::vector<std::string>& hosts) {
    for (const auto& host : hosts) {
      const std::string name = "loom" + std::to_string(::getpid()) + host;
      require(run_quietly("ip netns add " + name) == 0, "ip netns add " + name + " failed");
      names_[host] = name;
      run_quietly("ip -n " + name + " link set lo up");
    }
  }
  ~Mesh() {
    for (const auto& [host, name] : names_) run_quietly("ip netns del " + name);
  }
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // A veth pair: `a_if` in host a with a_cidr, `b_if` in host b with b_cidr.
  void link(const std::string& a, const std::string& a_if, const std::string& a_cidr,
            const std::string& b, const std::string& b_if, const std::string& b_cidr) {
    const std::string na = names_.at(a), nb = names_.at(b);
    require(run_quietly("ip link add " + a_if + " netns " + na + " type veth peer name " + b_if +
                        " netns " + nb) == 0,
            "ip link add " + a_if + " failed");
    for (const auto& [ns, ifname, cidr] :
         {std::tuple{na, a_if, a_cidr}, std::tuple{nb, b_if, b_cidr}}) {
      require(run_quietly("ip -n " + ns + " addr add " + cidr + " dev " + ifname) == 0 &&
                  run_quietly("ip -n " + ns + " link set " + ifname + " up") == 0,
              "configuring " + ifname + " failed");
    }
    // A veth has carrier (and libfabric lists it) a moment after both ends are up.
    for (const auto& end : {std::pair{na, a_if}, std::pair{nb, b_if}}) {
      poll_until(
          [&] { return link_state(end.first, end.second).find("state UP") != std::string::npos; },
          [] { std::this_thread::sleep_for(10ms); }, end.second + " coming up", 10s);
    }
  }
  [[nodiscard]] const std::string& name(const std::string& host) const { return names_.at(host); }

 private:
  std::map<std::string, std::string> names_;
};

void enter(const std::string& netns) {
  const int fd = ::open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
  require(fd >= 0, "cannot open netns " + netns);
  const int rc = ::setns(fd, CLONE_NEWNET);
  ::close(fd);
  require(rc == 0, "setns " + netns + " failed");
}

struct Traffic {
  std::uint64_t rx = 0;
  std::uint64_t tx = 0;
};

// The byte counters of `ifname` in this process's network namespace.
Traffic traffic(const std::string& ifname) {
  std::ifstream dev("/proc/self/net/dev");
  std::string line;
  while (std::getline(dev, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != ifname) continue;
    std::istringstream fields(line.substr(colon + 1));
    Traffic t;
    std::uint64_t skip = 0;
    fields >> t.rx;
    for (int i = 0; i < 7; ++i) fields >> skip;
    fields >> t.tx;
    return t;
  }
  throw Failure("no interface " + ifname + " in this namespace");
}

// Runs `listener` in namespace x and `connector` in namespace y, each in a process of its own
// (the test process keeps its namespace).
std::string run_across(const std::string& x, const std::string& y,
                       const std::function<void(Channel&)>& listener,
                       const std::function<void(Channel&)>& connector) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string failure;
    try {
      enter(x);
      failure = run_pair(listener, [&](Channel& channel) {
        enter(y);
        connector(channel);
      });
    } catch (const std::exception& e) {
      failure = e.what();
    }
    (void)!::write(fds[1], failure.data(), failure.size());
    std::fflush(nullptr);
    ::_exit(failure.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string failure;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) failure.append(buffer, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (failure.empty() && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    failure = "namespace process failed (status " + std::to_string(status) + ")";
  }
  return failure;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ",") + n;
  return text;
}

bool same_set(std::vector<std::string> a, std::vector<std::string> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

// The interface at the other end of the link: "ba" for "ab", "p1" for "q1".
std::string facing_name(const std::string& name) {
  if (name.size() == 2 && std::isalpha(static_cast<unsigned char>(name[1]))) {
    return std::string{name[1], name[0]};
  }
  return std::string(1, name[0] == 'p' ? 'q' : 'p') + name.substr(1);
}

Config mesh_config(unsigned data_rails) {
  Config config = test_config(data_rails);
  config.connect_timeout_ms = 5000;
  return config;
}

// One verified message of `size` bytes from the connector to the listener. Each side checks the
// NICs of its data rails and that its interfaces carried the payload (`quiet` ones did not).
struct Leg {
  std::vector<std::string> nics;   // expected data rail NICs, in rail order
  std::vector<std::string> quiet;  // interfaces that must not carry the payload
};

void check_traffic(const Leg& leg, const std::map<std::string, Traffic>& before, std::size_t size,
                   bool receiving) {
  const std::size_t share = size / leg.nics.size();
  for (const auto& ifname : leg.nics) {
    // A send completes once tcp holds the bytes; the kernel may still be sending the last of
    // them, so the sender's counter gets a moment to catch up.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    std::uint64_t moved = 0;
    for (;;) {
      const Traffic now = traffic(ifname);
      moved = receiving ? now.rx - before.at(ifname).rx : now.tx - before.at(ifname).tx;
      if (moved >= share * 9 / 10 || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    require(moved >= share * 9 / 10, ifname + " carried " + std::to_string(moved) +
                                         " bytes, expected at least " +
                                         std::to_string(share * 9 / 10));
  }
  for (const auto& ifname : leg.quiet) {
    const Traffic now = traffic(ifname);
    const std::uint64_t moved = (now.rx - before.at(ifname).rx) + (now.tx - before.at(ifname).tx);
    require(moved < size / 8, ifname + " carried " + std::to_string(moved) +
                                  " bytes of a transfer that is not its subnet's");
  }
}

std::map<std::string, Traffic> snapshot(const Leg& leg) {
  std::map<std::string, Traffic> counters;
  for (const auto& i : leg.nics) counters[i] = traffic(i);
  for (const auto& i : leg.quiet) counters[i] = traffic(i);
  return counters;
}

std::string transfer(const Mesh& mesh, const std::string& x, const Leg& at_x, const std::string& y,
                     const Leg& at_y, std::size_t size, std::uint64_t seed) {
  const unsigned rails = static_cast<unsigned>(at_x.nics.size());
  auto listener = [&](Channel& channel) {
    Context context(mesh_config(rails));
    Listener listen = context.listen();
    send_handle(channel, listen.handle());
    std::unique_ptr<RecvComm> in = accept_one(listen);
    const auto nics = in->stats().data_nics;
    require(same_set(nics, at_x.nics),
            "receiver's data rails on " + joined(nics) + ", expected " + joined(at_x.nics));
    const std::string text = joined(nics);
    channel.send_bytes(std::as_bytes(std::span(text)));
    const auto before = snapshot(at_x);
    std::vector<std::byte> buffer(size);
    const CloseOnUnwind guard{in.get()};  // a failure frees `buffer` before `in`
    MemoryRegion region = in->register_memory(buffer.data(), size);
    RecvBuffer target{buffer.data(), size, 3, region};
    Request request;
    require(post_into(in->irecv({&target, 1}), request) == Status::kOk, in->last_error());
    require(finish(*in, request) == size, "delivered size");
    const std::string error = check_pattern(buffer, seed);
    require(error.empty(), error);
    check_traffic(at_x, before, size, true);
    channel.barrier();
  };
  auto connector = [&](Channel& channel) {
    Context context(mesh_config(rails));
    std::unique_ptr<SendComm> out = connect_one(context, recv_handle(channel), 10s);
    const auto nics = out->stats().data_nics;
    require(same_set(nics, at_y.nics),
            "sender's data rails on " + joined(nics) + ", expected " + joined(at_y.nics));
    // Rail i of the receiver faces rail i of the sender: interface names here end in the
    // number of their link.
    const auto theirs = channel.recv_bytes();
    const std::string facing(reinterpret_cast<const char*>(theirs.data()), theirs.size());
    std::string expected;
    for (const auto& n : nics) expected += (expected.empty() ? "" : ",") + facing_name(n);
    require(facing == expected, "receiver's rails " + facing + " do not face ours (" +
                                    joined(nics) + "), expected " + expected);
    const auto before = snapshot(at_y);
    std::vector<std::byte> buffer(size);
    const CloseOnUnwind guard{out.get()};  // a failure frees `buffer` before `out`
    fill_pattern(buffer, seed);
    MemoryRegion region = out->register_memory(buffer.data(), size);
    Request request;
    require(post_into(out->isend(buffer.data(), size, 3, region), request) == Status::kOk,
            out->last_error());
    finish(*out, request);
    check_traffic(at_y, before, size, false);
    channel.barrier();
  };
  return run_across(mesh.name(x), mesh.name(y), listener, connector);
}

}  // namespace

TEST_CASE("netns three hosts joined pairwise each reach the others over their pair's subnet",
          "[netns]") {
  Mesh mesh({"a", "b", "c"});
  mesh.link("a", "ab", "10.77.1.1/24", "b", "ba", "10.77.1.2/24");
  mesh.link("b", "bc", "10.77.2.1/24", "c", "cb", "10.77.2.2/24");
  mesh.link("a", "ac", "10.77.3.1/24", "c", "ca", "10.77.3.2/24");
  constexpr std::size_t kSize = 8u << 20;
  struct Pair {
    std::string listener, connector;
    Leg at_listener, at_connector;
  };
  const Pair pairs[] = {
      {"a", "b", {{"ab"}, {"ac"}}, {{"ba"}, {"bc"}}},
      {"b", "c", {{"bc"}, {"ba"}}, {{"cb"}, {"ca"}}},
      {"c", "a", {{"ca"}, {"cb"}}, {{"ac"}, {"ab"}}},
      {"a", "c", {{"ac"}, {"ab"}}, {{"ca"}, {"cb"}}},
  };
  std::uint64_t seed = 500;
  for (const Pair& p : pairs) {
    INFO(p.connector << " -> " << p.listener);
    const std::string failure =
        transfer(mesh, p.listener, p.at_listener, p.connector, p.at_connector, kSize, ++seed);
    INFO(failure);
    CHECK(failure.empty());
  }
}

TEST_CASE("netns a host with no NIC on any of the listener's subnets gets an error naming them",
          "[netns]") {
  Mesh mesh({"a", "b", "c"});
  mesh.link("a", "ab", "10.77.1.1/24", "b", "ba", "10.77.1.2/24");
  mesh.link("b", "bc", "10.77.2.1/24", "c", "cb", "10.77.2.2/24");
  // c asks a (whose only subnet c does not share, and to which it has no route) to connect.
  auto listener = [&](Channel& channel) {
    Context context(mesh_config(1));
    Listener listen = context.listen();
    send_handle(channel, listen.handle());
    require(channel.recv_value<int>() == 1, "connector out of step");
    require(listen.accept() == nullptr, "accepted a connect that cannot have arrived");
  };
  auto connector = [&](Channel& channel) {
    Config config = mesh_config(1);
    config.connect_timeout_ms = 1500;
    Context context(config);
    const Handle handle = recv_handle(channel);
    std::string error;
    try {
      connect_one(context, handle, 10s);
    } catch (const Error& e) {
      error = e.what();
    }
    channel.send_value(1);
    std::fprintf(stderr, "the connector's error: %s\n", error.c_str());
    for (const char* expected : {"10.77.1.1", "10.77.2.0/24", "cb", "routed"}) {
      require(error.find(expected) != std::string::npos,
              "the error does not name " + std::string(expected) + ": " + error);
    }
  };
  const std::string failure = run_across(mesh.name("a"), mesh.name("c"), listener, connector);
  INFO(failure);
  CHECK(failure.empty());
}

TEST_CASE("netns two NICs on two subnets carry one striped message, one data rail each",
          "[netns]") {
  Mesh mesh({"p", "q"});
  mesh.link("p", "p1", "10.78.1.1/24", "q", "q1", "10.78.1.2/24");
  mesh.link("p", "p2", "10.78.2.1/24", "q", "q2", "10.78.2.2/24");
  // Rail i of the receiver faces rail i of the sender, on the same subnet.
  const std::string failure =
      transfer(mesh, "p", {{"p1", "p2"}, {}}, "q", {{"q1", "q2"}, {}}, 64u << 20, 700);
  INFO(failure);
  CHECK(failure.empty());
}

}  // namespace loom::test

int main(int argc, char** argv) {
  if (::geteuid() != 0) {
    std::puts("skipped: the network-namespace tests need root (ip netns)");
    return 77;
  }
  const std::string probe = "loomprobe" + std::to_string(::getpid());
  if (loom::test::run_quietly("ip netns add " + probe) != 0) {
    std::puts("skipped: network namespaces are not allowed here (ip netns add failed)");
    return 77;
  }
  loom::test::run_quietly("ip netns del " + probe);
  // tcp over whatever NICs each namespace has: the test is about choosing among them.
  setenv("LOOM_PROVIDER", "tcp", 1);
  setenv("FI_PROVIDER", "tcp", 1);
  unsetenv("LOOM_NICS");
  return Catch::Session().run(argc, argv);
}
