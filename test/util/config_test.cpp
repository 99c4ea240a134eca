#include "loom/config.hpp"

#include <new>
#include <string>

#include <catch2/catch.hpp>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/error.hpp"

namespace loom {

// Config() is the table's default column parsed: each default parses, is in its row's range,
// and reading the whole column back as values gives the same Config.
TEST_CASE("config: the table's defaults round-trip through Config", "[util]") {
  const Config defaults;
  CHECK_NOTHROW(defaults.validate());
  std::map<std::string, std::string, std::less<>> column;
  for (const auto& var : config_variables()) {
    column.emplace(var.name, var.default_value);
    CHECK(var.name.starts_with("LOOM_"));
    CHECK_FALSE(var.doc.empty());
    INFO(var.name << "=" << var.default_value);
    CHECK(Config::from_values({{std::string(var.name), std::string(var.default_value)}}) ==
          defaults);
  }
  CHECK(column.size() == config_variables().size());  // no variable twice
  CHECK(Config::from_values(column) == defaults);
  CHECK(Config::from_values({}) == defaults);
  // A few defaults the rest of loom is written against.
  CHECK(defaults.data_rails == 1);
  CHECK(defaults.eager_max == 16384);
  CHECK(defaults.log_level == "warn");
  CHECK(defaults.nics.empty());
}

// Every row writes its own member: a non-default value for one variable changes the Config,
TEST_CASE("config: every variable sets a field", "[util]") {
  const std::map<std::string, std::string, std::less<>> other = {
      {"LOOM_PROVIDER", "shm"},          {"LOOM_NICS", "lo"},
      {"LOOM_LOOPBACK_ONLY", "1"},       {"LOOM_DATA_RAILS", "2"},
      {"LOOM_CTRL_RAILS", "2"},          {"LOOM_NGROUPS", "0"},
      {"LOOM_QP_DEPTH_MULTIPLIER", "2"}, {"LOOM_EAGER_MAX", "1k"},
      {"LOOM_EAGER_CREDITS", "3"},       {"LOOM_INJECT_MAX", "0"},
      {"LOOM_MIN_STRIPE", "1m"},         {"LOOM_MR_CACHE_ENTRIES", "7"},
      {"LOOM_LOG_LEVEL", "off"},         {"LOOM_CONNECT_TIMEOUT_MS", "5"},
      {"LOOM_PEER_TIMEOUT_MS", "6"},     {"LOOM_FORCE_FLUSH", "1"},
      {"LOOM_TOPOLOGY_XML", "/x.xml"},   {"LOOM_GPU", "0000:13:00.0"},
      {"LOOM_DEVICE_MEMORY", "0"},       {"LOOM_GPU_FLUSH", "0"},
      {"LOOM_CUDA_DMABUF", "0"},         {"LOOM_CARRY_CONTROL", "0"},
      {"LOOM_PEER_ISOLATION", "0"},      {"LOOM_CUDA_IPC", "1"},
      {"LOOM_PROGRESS_THREAD", "0"},     {"LOOM_EAGER_FRAGMENTS", "2"},
  };
  const Config defaults;
  for (const auto& var : config_variables()) {
    INFO(var.name);
    const auto value = other.find(var.name);
    REQUIRE(value != other.end());  // a new variable needs a line above
    CHECK_FALSE(Config::from_values({{value->first, value->second}}) == defaults);
  }
  CHECK(other.size() == config_variables().size());
  // ... and no two rows write the same one: leaving any one variable out changes the result.
  const Config all = Config::from_values(other);
  for (const auto& var : config_variables()) {
    INFO(var.name);
    auto without = other;
    without.erase(without.find(var.name));
    CHECK_FALSE(Config::from_values(without) == all);
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

// LOOM_EAGER_CREDITS takes a number or "auto" (the default: the provider's profile decides).
TEST_CASE("config: eager credits are a number or auto", "[util]") {
  CHECK_FALSE(Config{}.eager_credits.has_value());
  CHECK(Config::from_values({{"LOOM_EAGER_CREDITS", "0"}}).eager_credits == 0u);
  CHECK(Config::from_values({{"LOOM_EAGER_CREDITS", "256"}}).eager_credits == 256u);
  CHECK_FALSE(Config::from_values({{"LOOM_EAGER_CREDITS", "auto"}}).eager_credits.has_value());
  CHECK_FALSE(Config{}.eager_fragments.has_value());
  CHECK(Config::from_values({{"LOOM_EAGER_FRAGMENTS", "4"}}).eager_fragments == 4u);
  CHECK_THROWS(Config::from_values({{"LOOM_EAGER_FRAGMENTS", "0"}}));
  CHECK_THROWS(Config::from_values({{"LOOM_EAGER_FRAGMENTS", "5"}}));
  CHECK_THROWS_WITH(
      Config::from_values({{"LOOM_EAGER_CREDITS", "257"}}),
      Catch::Contains("LOOM_EAGER_CREDITS=\"257\"") && Catch::Contains("[0, 256] or auto"));
  CHECK_THROWS_WITH(Config::from_values({{"LOOM_EAGER_CREDITS", "Auto"}}),
                    Catch::Contains("LOOM_EAGER_CREDITS"));
  Config c;
  c.eager_credits = 300;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("LOOM_EAGER_CREDITS"));
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
