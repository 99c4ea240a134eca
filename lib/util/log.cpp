#include "util/log.hpp"

#include <mutex>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "loom/log.hpp"

namespace loom::util {
namespace {

// stderr, or the program's sink once set_log_sink() installed one. The base sink's mutex
// serialises lines and sink changes.
class SwitchSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  SwitchSink() { stderr_.set_pattern("[%H:%M:%S.%e] [loom %P] [%^%l%$] %v"); }

  void set(LogSink sink, void* user) {
    const std::lock_guard<std::mutex> lock(mutex_);
    sink_ = sink;
    user_ = user;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (sink_ == nullptr) {
      stderr_.log(msg);
      return;
    }
    sink_(to_level(msg.level), std::string_view(msg.payload.data(), msg.payload.size()), user_);
  }
  void flush_() override {
    if (sink_ == nullptr) stderr_.flush();
  }

 private:
  static LogLevel to_level(spdlog::level::level_enum level) {
    switch (level) {
      case spdlog::level::trace:
        return LogLevel::kTrace;
      case spdlog::level::debug:
        return LogLevel::kDebug;
      case spdlog::level::info:
        return LogLevel::kInfo;
      case spdlog::level::warn:
        return LogLevel::kWarn;
      default:
        return LogLevel::kError;
    }
  }

  spdlog::sinks::stderr_color_sink_st stderr_;
  LogSink sink_ = nullptr;
  void* user_ = nullptr;
};

// The process-wide sink behind log(): part of the one documented process-global logger.
const std::shared_ptr<SwitchSink>& switch_sink() {
  static const std::shared_ptr<SwitchSink> sink = std::make_shared<SwitchSink>();
  return sink;
}

}  // namespace

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>("loom", switch_sink());
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

void set_log_level(std::string_view level) {
  log().set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace loom::util

namespace loom {

void set_log_sink(LogSink sink, void* user) noexcept {
  util::switch_sink()->set(sink, user);
}

void set_log_level(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kTrace:
      return util::log().set_level(spdlog::level::trace);
    case LogLevel::kDebug:
      return util::log().set_level(spdlog::level::debug);
    case LogLevel::kInfo:
      return util::log().set_level(spdlog::level::info);
    case LogLevel::kWarn:
      return util::log().set_level(spdlog::level::warn);
    case LogLevel::kError:
      return util::log().set_level(spdlog::level::err);
    case LogLevel::kOff:
      return util::log().set_level(spdlog::level::off);
  }
}

}  // namespace loom
