// Failures that can repeat at every poll (a CQ that cannot be read, a receive that cannot be
// reposted) must not flood the log: the first is logged, then at most one per interval, which
// says how many were left out since the one before.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace loom::util {

class LogLimit {
 public:
  static constexpr std::chrono::seconds kInterval{1};

  // Whether to log this occurrence; when true, left_out() says how many were not logged since.
  [[nodiscard]] bool admit() noexcept {
    const auto now = std::chrono::steady_clock::now();
    if (logged_ && now - last_ < kInterval) {
      ++pending_;
      return false;
    }
    logged_ = true;
    last_ = now;
    left_out_ = pending_;
    pending_ = 0;
    return true;
  }
  [[nodiscard]] std::uint64_t left_out() const noexcept { return left_out_; }
  // " (N more since the last report)", or nothing: for the line admit() allowed.
  [[nodiscard]] std::string suffix() const {
    return left_out_ == 0 ? std::string()
                          : " (" + std::to_string(left_out_) + " more since the last report)";
  }

 private:
  bool logged_ = false;
  std::chrono::steady_clock::time_point last_{};
  std::uint64_t pending_ = 0;
  std::uint64_t left_out_ = 0;
};

}  // namespace loom::util
