// loom's logger. spdlog checks the level before formatting, so a disabled debug() costs a
// compare; nothing on the per-message path logs above trace.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

namespace loom::util {

// The process-wide "loom" logger (stderr). This is the one documented process-global: log
// output and its level belong to the process, not to a context.
spdlog::logger& log();

// Accepts the LOOM_LOG_LEVEL words (trace, debug, info, warn, error, off).
void set_log_level(std::string_view level);

}  // namespace loom::util
