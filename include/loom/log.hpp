// Where loom's log lines go. By default they go to stderr; a program that has its own logger
// (a plugin host such as NCCL) installs a sink and gets every line loom emits instead.
#pragma once

#include <cstdint>
#include <string_view>

namespace loom {

// kOff is only a threshold (set_log_level): no line is ever logged at it.
enum class LogLevel : std::uint8_t { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// Receives one formatted line (no trailing newline). Called from whichever thread logs, one
// call at a time; it must not call back into loom.
using LogSink = void (*)(LogLevel level, std::string_view message, void* user);

// Sends loom's log lines to `sink` (with `user`) instead of stderr; nullptr restores stderr.
// Thread-safe. The sink must stay callable until it is replaced.
void set_log_sink(LogSink sink, void* user) noexcept;

// Sets the level below which loom drops lines (kOff: all of them). Thread-safe. A Context sets
// it from its Config (LOOM_LOG_LEVEL) when it is created.
void set_log_level(LogLevel level) noexcept;

}  // namespace loom
