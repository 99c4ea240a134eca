#include "util/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace loom::util {

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("loom");
    l->set_pattern("[%H:%M:%S.%e] [loom %P] [%^%l%$] %v");
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

void set_log_level(std::string_view level) {
  log().set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace loom::util
