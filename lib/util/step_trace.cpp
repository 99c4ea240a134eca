// The step trace's recording side (step_trace.hpp).
#include "util/step_trace.hpp"

#include <chrono>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace loom::util {
namespace {

// One per recording thread: its own file, so recording takes no lock.
class StepFile {
 public:
  StepFile() noexcept {
    const std::string path = step_file_path();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    constexpr std::size_t kBytes = kStepTraceEntries * sizeof(std::uint64_t);
    if (::ftruncate(fd, static_cast<off_t>(kBytes)) == 0) {
      void* mapped = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (mapped != MAP_FAILED) entries_ = static_cast<std::uint64_t*>(mapped);
    }
    ::close(fd);
    start_ = std::chrono::steady_clock::now();
  }
  ~StepFile() {
    if (entries_ != nullptr) ::munmap(entries_, kStepTraceEntries * sizeof(std::uint64_t));
  }
  StepFile(const StepFile&) = delete;
  StepFile& operator=(const StepFile&) = delete;

  void record(Step step) noexcept {
    if (entries_ == nullptr || count_ == kStepTraceEntries) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start_)
                        .count();
    entries_[count_++] = (static_cast<std::uint64_t>(ns) << 8) | static_cast<std::uint8_t>(step);
  }

 private:
  std::uint64_t* entries_ = nullptr;
  std::size_t count_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

std::string step_file_path() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/loom-steps." +
         std::to_string(::getpid()) + "." + std::to_string(::syscall(SYS_gettid));
}

void record_step_to_file(Step step) noexcept {
  thread_local StepFile file;
  file.record(step);
}

}  // namespace loom::util
