#include "loom/config.hpp"

#include <new>
#include <string>

#include <catch2/catch.hpp>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/error.hpp"

namespace loom {

TEST_CASE("config: the table's defaults are Config's defaults", "[util]") {
  std::map<std::string, std::string, std::less<>> defaults;
  for (const auto& var : config_variables()) {
    if (!var.default_value.empty()) defaults.emplace(var.name, var.default_value);
  }
  Config parsed = Config::from_values(defaults);
  Config plain;
  CHECK(parsed.data_rails == plain.data_rails);
  CHECK(parsed.ctrl_rails == plain.ctrl_rails);
  CHECK(parsed.ngroups == plain.ngroups);
  CHECK(parsed.qp_depth_multiplier == plain.qp_depth_multiplier);
  CHECK(parsed.eager_max == plain.eager_max);
  CHECK(parsed.min_stripe == plain.min_stripe);
  CHECK(parsed.mr_cache_entries == plain.mr_cache_entries);
  CHECK(parsed.log_level == plain.log_level);
  CHECK(parsed.connect_timeout_ms == plain.connect_timeout_ms);
  CHECK(parsed.peer_timeout_ms == plain.peer_timeout_ms);
  CHECK(parsed.force_flush == plain.force_flush);
  CHECK(parsed.device_memory == plain.device_memory);
  CHECK(parsed.gpu_flush == plain.gpu_flush);
  CHECK(parsed.cuda_dmabuf == plain.cuda_dmabuf);
  CHECK(parsed.loopback_only == plain.loopback_only);
  for (const auto& var : config_variables()) {
    CHECK(var.name.starts_with("LOOM_"));
    CHECK_FALSE(var.doc.empty());
  }
}

TEST_CASE("config: values, suffixes and lists parse", "[util]") {
  Config c = Config::from_values({{"LOOM_DATA_RAILS", "4"},
                                  {"LOOM_EAGER_MAX", "8k"},
                                  {"LOOM_INJECT_MAX", "0"},
                                  {"LOOM_MIN_STRIPE", "1m"},
                                  {"LOOM_NICS", "lo,eth9,,x"},
                                  {"LOOM_FORCE_FLUSH", "yes"},
                                  {"LOOM_LOG_LEVEL", "debug"},
                                  {"LOOM_NGROUPS", "0"}});
  CHECK(c.data_rails == 4);
  CHECK(c.eager_max == 8192);
  CHECK(c.inject_max == 0);
  CHECK(c.min_stripe == 1048576);
  CHECK(c.nics == std::vector<std::string>{"lo", "eth9", "x"});
  CHECK(c.force_flush);
  CHECK(c.log_level == "debug");
  CHECK(c.ngroups == 0);
}

TEST_CASE("config: invalid values are errors naming the variable", "[util]") {
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_DATA_RAILS", "0"}}),
                    Catch::Contains("LOOM_DATA_RAILS=\"0\"") && Catch::Contains("[1, 16]"));
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_DATA_RAILS", "two"}}),
                    Catch::Contains("LOOM_DATA_RAILS"));
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_EAGER_MAX", "4q"}}),
                    Catch::Contains("LOOM_EAGER_MAX"));
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_EAGER_MAX", "99999999999999g"}}),
                    Catch::Contains("LOOM_EAGER_MAX"));
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_INJECT_MAX", "2m"}}),
                    Catch::Contains("LOOM_INJECT_MAX"));
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_FORCE_FLUSH", "maybe"}}),
                    Catch::Contains("LOOM_FORCE_FLUSH"));
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_LOG_LEVEL", "loud"}}),
                    Catch::Contains("LOOM_LOG_LEVEL"));
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_DATA_RAIL", "2"}}),
                    Catch::Contains("unknown variable LOOM_DATA_RAIL"));
  Config c;
  c.ctrl_rails = 0;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("LOOM_CTRL_RAILS"));
  c = Config{};
  c.log_level = "loud";
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("LOOM_LOG_LEVEL"));
}

// validate() is const and may be given a const object (Context's default argument binds a
// temporary Config to a const reference): it must only read. Shown on a Config in pages made
// read-only, in a child, so that a write kills the child and not the test.
TEST_CASE("config: validate() only reads the Config", "[util]") {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* memory = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(memory != MAP_FAILED);
  static_assert(sizeof(Config) <= 4096);
  auto* config = new (memory) Config();
  config->log_level = "info";  // short: kept inside the object, on the protected page
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (mprotect(memory, page, PROT_READ) != 0) _exit(2);
    try {
      static_cast<const Config*>(config)->validate();
    } catch (...) {
      _exit(3);
    }
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("child " << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                        : "exited " + std::to_string(WEXITSTATUS(status))));
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  config->~Config();
  munmap(memory, page);
}

}  // namespace loom
