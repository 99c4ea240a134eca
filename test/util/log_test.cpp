#include "loom/log.hpp"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "util/log.hpp"

namespace loom {
namespace {

struct Captured {
  std::vector<std::pair<LogLevel, std::string>> lines;
};

void capture(LogLevel level, std::string_view message, void* user) {
  static_cast<Captured*>(user)->lines.emplace_back(level, std::string(message));
}

}  // namespace

TEST_CASE("log: a sink receives loom's lines at their level until it is removed", "[util]") {
  Captured captured;
  set_log_level(LogLevel::kInfo);
  set_log_sink(capture, &captured);
  util::log().info("first {}", 1);
  util::log().debug("below the level");
  util::log().warn("second");
  set_log_sink(nullptr, nullptr);
  util::log().warn("to stderr again");
  set_log_level(LogLevel::kWarn);
  REQUIRE(captured.lines.size() == 2);
  CHECK(captured.lines[0] == std::pair{LogLevel::kInfo, std::string("first 1")});
  CHECK(captured.lines[1] == std::pair{LogLevel::kWarn, std::string("second")});
}

}  // namespace loom
