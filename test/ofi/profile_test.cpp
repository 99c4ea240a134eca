// Provider profiles: which settings loom recommends for which families, that loom leaves the
// environment alone, and what a killed process leaves behind (for other processes, and for a
// later one given its pid).
#include "providers/profile.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <rdma/fabric.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ofi/nic.hpp"
#include "ofi/rail_set.hpp"
#include "ofi/selection.hpp"
#include "util/env.hpp"

namespace {

using loom::providers::settings_for;

std::map<std::string, std::string> defaults_for(std::string_view requested) {
  std::map<std::string, std::string> out;
  for (const auto& d : settings_for(requested)) out.emplace(d.name, d.value);
  return out;
}

std::string env(const char* name) {
  return loom::util::environment(name).value_or("<unset>");
}

// A file named as shm's regions are, for `pid`.
std::filesystem::path fake_region(pid_t pid, const char* name) {
  std::filesystem::path path = "/dev/shm/" + std::to_string(pid) + ":" + name;
  std::ofstream(path) << "region";
  return path;
}

}  // namespace

TEST_CASE("provider profiles: environment defaults for the named family", "[profile]") {
  using Defaults = std::map<std::string, std::string>;
  CHECK(defaults_for("shm").empty());
  // rxm over tcp or verbs: per-connection bounce buffers (README, Providers).
  const Defaults rxm{{"FI_OFI_RXM_USE_SRX", "1"}, {"FI_OFI_RXM_MSG_RX_SIZE", "256"}};
  CHECK(defaults_for("tcp;ofi_rxm") == rxm);
  CHECK(defaults_for("verbs;ofi_rxm") == rxm);
  CHECK(defaults_for("cxi,shm") == Defaults{{"FI_CXI_RX_MATCH_MODE", "hybrid"}});
  // EFA turns device RDMA on where the device has it; forcing it aborts on first-generation
  // devices, so loom never sets it.
  CHECK(defaults_for("efa").empty());

  using loom::providers::profile_for;
  CHECK(profile_for("tcp;ofi_rxm").family == "tcp");
  CHECK(profile_for("verbs;ofi_rxm").family == "verbs");
  CHECK(profile_for("epmr").family.empty());
  CHECK(profile_for("udp;ofi_rxd").family == "udp");
  CHECK(!profile_for("udp;ofi_rxd").no_inject.empty());
  CHECK(profile_for("tcp;ofi_rxm").no_inject.empty());
  CHECK(profile_for("sockets").peer_gone_errors.size() == 1);
  CHECK(profile_for("shm").peer_gone_errors.size() == 1);
}

// The README's main command names no provider: libfabric picks one, so every family's
// settings are recommended, each variable once.
TEST_CASE("provider profiles: every family's defaults when none is named", "[profile]") {
  for (const char* requested : {"", "^efa", "psm3"}) {
    INFO("requested " << requested);
    CHECK(defaults_for(requested) ==
          std::map<std::string, std::string>{{"FI_OFI_RXM_USE_SRX", "1"},
                                             {"FI_OFI_RXM_MSG_RX_SIZE", "256"},
                                             {"FI_CXI_RX_MATCH_MODE", "hybrid"}});
    CHECK(settings_for(requested).size() == 3);
  }
}

// Setting every family's defaults at once is safe only while no two families disagree.
TEST_CASE("provider profiles: no variable gets two different defaults", "[profile]") {
  std::map<std::string, std::string> seen;
  for (const loom::providers::Profile* profile : loom::providers::all_profiles()) {
    for (const auto& env : profile->settings) {
      const auto it = seen.emplace(env.name, env.value).first;
      INFO(env.name << " set by " << profile->family);
      CHECK(it->second == env.value);
    }
  }
  CHECK(seen.count("FI_OFI_RXM_USE_SRX") == 1);
}

// loom recommends provider settings but never writes them: a setenv would race any other
// thread's getenv (util/env.hpp). Opening NICs for the family that recommends one leaves the
// environment as it was.
TEST_CASE("provider settings: opening NICs leaves the environment untouched", "[profile]") {
  unsetenv("FI_OFI_RXM_USE_SRX");
  unsetenv("FI_CXI_RX_MATCH_MODE");
  loom::Config config;
  config.provider = "tcp";
  config.nics = {"lo"};
  REQUIRE_FALSE(loom::ofi::recommended_settings(config).empty());
  const auto nics = loom::ofi::open_nics(config);
  CHECK_FALSE(nics.empty());
  CHECK(env("FI_OFI_RXM_USE_SRX") == "<unset>");
  CHECK(env("FI_CXI_RX_MATCH_MODE") == "<unset>");
}

// tcp;ofi_rxm reports an inject size of 64 bytes unless asked for more: loom asks for
// LOOM_INJECT_MAX and room for a control message beside it, so that small messages (and the
// control messages they carry) leave without a completion to reap.
TEST_CASE("inject size: the provider is asked for LOOM_INJECT_MAX", "[profile]") {
  for (const std::size_t wanted : {std::size_t{4096}, std::size_t{1024}}) {
    loom::Config config;
    config.provider = "tcp";
    config.nics = {"lo"};
    config.inject_max = wanted;
    const auto nics = loom::ofi::open_nics(config);
    REQUIRE_FALSE(nics.empty());
    CHECK(nics.front()->attributes().inject_size == wanted + loom::ofi::kInjectHeadroom);
  }
}

// A lane's endpoints and their CQs are only used under the lane's lock, so loom asks rxm again
// for FI_THREAD_COMPLETION (its profile says so), and rxm then takes no lock of its own per
// call. rxm answers FI_THREAD_SAFE unless asked for manual data progress too.
TEST_CASE("threading: tcp;ofi_rxm grants FI_THREAD_COMPLETION with manual data progress",
          "[profile]") {
  loom::Config config;
  config.provider = "tcp";
  config.nics = {"lo"};
  const auto nics = loom::ofi::open_nics(config);
  REQUIRE_FALSE(nics.empty());
  const fi_domain_attr& domain = *nics.front()->info().domain_attr;
  CHECK(domain.threading == FI_THREAD_COMPLETION);
  CHECK(domain.data_progress == FI_PROGRESS_MANUAL);
}

// The default asks rxm for its whole buffer (16 KiB unless FI_OFI_RXM_BUFFER_SIZE is lower).
// A provider that refuses is asked for less: run alone with FI_OFI_RXM_BUFFER_SIZE=8192 (its
// own meson test; rxm reads the variable once per process), rxm refuses 16 KiB and grants 8.
TEST_CASE("inject size: the default asks for rxm's buffer, and less where it is smaller",
          "[profile][rxm-buffer]") {
  loom::Config config;
  config.provider = "tcp";
  config.nics = {"lo"};
  const std::string buffer = env("FI_OFI_RXM_BUFFER_SIZE");
  const std::size_t rxm_buffer = buffer == "<unset>" ? 16384 : std::stoul(buffer);
  REQUIRE(config.inject_max + loom::ofi::kInjectHeadroom == 16384);
  const auto nics = loom::ofi::open_nics(config);
  REQUIRE_FALSE(nics.empty());
  INFO("FI_OFI_RXM_BUFFER_SIZE " << buffer);
  CHECK(nics.front()->attributes().inject_size == std::min<std::size_t>(rxm_buffer, 16384));
}

TEST_CASE("provider leftovers: a dead process's shm regions go, a running one's stay",
          "[profile]") {
  using loom::providers::remove_leftovers_of;
  if (!std::filesystem::is_directory("/dev/shm")) {
    SUCCEED("no /dev/shm");
    return;
  }
  // This process runs: nothing of it is touched.
  const auto own = fake_region(::getpid(), "loom-test-own");
  CHECK(remove_leftovers_of(::getpid()) == 0);
  CHECK(std::filesystem::exists(own));
  std::filesystem::remove(own);

  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  const auto first = fake_region(child, "loom-test-a");
  const auto second = fake_region(child, "loom-test-b");
  const auto other = fake_region(child + 1, "loom-test-other");  // another pid's: kept
  // Exited but not reaped: its pid is still taken, so nothing goes yet.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(remove_leftovers_of(child) == 0);
  CHECK(std::filesystem::exists(first));
  REQUIRE(::waitpid(child, nullptr, 0) == child);
  CHECK(remove_leftovers_of(child) == 2);
  CHECK_FALSE(std::filesystem::exists(first));
  CHECK_FALSE(std::filesystem::exists(second));
  CHECK(std::filesystem::exists(other));
  std::filesystem::remove(other);
  CHECK(remove_leftovers_of(0) == 0);
  CHECK(remove_leftovers_of(-1) == 0);
}

namespace {

// A file named as one of shm's regions for this process that nobody holds, as an earlier
// process with the same pid, killed, leaves them. Empty path if the name is taken.
std::filesystem::path stale_region(const std::string& name) {
  const std::string path = "/dev/shm/" + std::to_string(::getpid()) + ":" + name;
  const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) return {};
  const bool written = ::write(fd, "region", 6) == 6;
  ::close(fd);
  REQUIRE(written);
  return path;
}

}  // namespace

// What decides is whether any process holds the file (a write lease is refused otherwise), not
// its name or age: a live process of another pid namespace sharing /dev/shm may have the same
// pid, so its regions our names; a child here stands in for it.
TEST_CASE("provider leftovers: regions under our pid that nobody holds go, held ones stay",
          "[profile]") {
  if (!std::filesystem::is_directory("/dev/shm")) {
    SUCCEED("no /dev/shm");
    return;
  }
  const auto stale = stale_region("loom-test-stale");
  const auto open_here = stale_region("loom-test-open");
  const auto mapped_here = stale_region("loom-test-mapped");
  const auto mapped_there = stale_region("loom-test-mapped-by-another-process");
  REQUIRE_FALSE(
      (stale.empty() || open_here.empty() || mapped_here.empty() || mapped_there.empty()));
  const int held = ::open(open_here.c_str(), O_RDONLY);
  REQUIRE(held >= 0);
  const int fd = ::open(mapped_here.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  void* mapped = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(mapped != MAP_FAILED);
  int ready[2];
  int release[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(release) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int theirs = ::open(mapped_there.c_str(), O_RDWR);
    void* map = theirs < 0 ? MAP_FAILED
                           : ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, theirs, 0);
    if (theirs >= 0) ::close(theirs);
    const char state = map == MAP_FAILED ? 'f' : 'm';
    char go = 0;
    if (::write(ready[1], &state, 1) != 1 || ::read(release[0], &go, 1) != 1) ::_exit(2);
    ::_exit(0);
  }
  char state = 0;
  REQUIRE(::read(ready[0], &state, 1) == 1);
  REQUIRE(state == 'm');

  CHECK(loom::providers::remove_own_stale_leftovers() == 1);
  CHECK_FALSE(std::filesystem::exists(stale));
  CHECK(std::filesystem::exists(open_here));
  CHECK(std::filesystem::exists(mapped_here));
  CHECK(std::filesystem::exists(mapped_there));

  // Once the other process let go, nothing holds its file: it goes too.
  REQUIRE(::write(release[1], "g", 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(status == 0);
  CHECK(loom::providers::remove_own_stale_leftovers() == 1);
  CHECK_FALSE(std::filesystem::exists(mapped_there));

  ::close(held);
  ::munmap(mapped, 4096);
  for (int p : {ready[0], ready[1], release[0], release[1]}) ::close(p);
  std::filesystem::remove(open_here);
  std::filesystem::remove(mapped_here);
}

// shm 1.17 names an endpoint's region <pid>:<uid>:<index of the endpoint in the process> and
// refuses to make one over a file whose recorded owner lives, and the owner it reads for a
// region our pid's earlier holder left is us. Opening NICs removes those nobody holds first.
// Its own meson test, with shm's environment.
TEST_CASE("provider leftovers: shm endpoints open over regions an earlier holder of our pid left",
          "[shm-leftovers]") {
  if (!std::filesystem::is_directory("/dev/shm")) {
    SUCCEED("no /dev/shm");
    return;
  }
  // Every index this process's next endpoints could take (names already taken are live ones).
  struct Planted {
    std::vector<std::filesystem::path> paths;
    ~Planted() {
      for (const auto& path : paths) std::filesystem::remove(path);
    }
  } planted;
  for (int index = 0; index < 128; ++index) {
    auto path = stale_region(std::to_string(::getuid()) + ":" + std::to_string(index));
    if (!path.empty()) planted.paths.push_back(std::move(path));
  }
  REQUIRE(planted.paths.size() > 64);
  {
    loom::Config config;
    config.provider = "shm";
    std::vector<std::unique_ptr<loom::ofi::Nic>> nics;
    REQUIRE_NOTHROW(nics = loom::ofi::open_nics(config));
    REQUIRE_FALSE(nics.empty());
    std::vector<loom::ofi::Nic*> pointers{nics.front().get()};
    std::unique_ptr<loom::ofi::RailSet> rails;
    REQUIRE_NOTHROW(rails = std::make_unique<loom::ofi::RailSet>(
                        pointers, loom::ofi::RailSetShape{.data_rails = 1, .control_rails = 1}));
    for (const auto& path : planted.paths) {
      // Gone, or remade by shm as a live region of this process.
      if (std::filesystem::exists(path)) CHECK(std::filesystem::file_size(path) != 6);
    }
  }
}
