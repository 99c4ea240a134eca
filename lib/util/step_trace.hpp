// Timestamps at the steps of a message's path (isend, irecv, test, CQ reads, provider posts),
// for finding where a round trip's time goes: bench/scripts/step_trace.py reads them. Built
// in only with -Dstep_trace=true; otherwise record_step is empty and compiles away.
//
// Each thread that records writes to its own file, <TMPDIR or /tmp>/loom-steps.<pid>.<tid>,
// through a shared mapping: what was recorded survives _exit and a kill. An entry is 8 bytes:
// nanoseconds since the thread's first step (steady clock) << 8 | the step. The file holds up to
// kStepTraceEntries; later steps are not recorded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom_build_config.h"

namespace loom::util {

// The numbers are the file format: bench/scripts/step_trace.py names them. Add at the end.
enum class Step : std::uint8_t {
  kIsendBegin = 1,
  kIsendEnd,
  kIrecvBegin,
  kIrecvEnd,
  kTestBegin,     // a test or wait of a request, before the lane's lock
  kTestFinished,  // ... that found the request finished
  kCqEntries,     // fi_cq_read returned completions
  kSendBegin,     // fi_send, fi_inject, fi_tsenddata or fi_tinjectdata called
  kSendEnd,
  kWriteBegin,  // any RMA write or read
  kWriteEnd,
  kRecvPostBegin,  // fi_recv or fi_trecv
  kRecvPostEnd,
  kControlIn,  // a control message taken from the lane
};

inline constexpr std::size_t kStepTraceEntries = std::size_t{1} << 21;

// Appends `step` to the calling thread's file. Built in every build (so it keeps compiling and
// its test runs); called from the data path only through record_step.
void record_step_to_file(Step step) noexcept;

// The path of the calling thread's file.
std::string step_file_path();

inline void record_step([[maybe_unused]] Step step) noexcept {
  if constexpr (LOOM_STEP_TRACE != 0) record_step_to_file(step);
}

// Records `begin` now and `end` when it goes out of scope.
class StepSpan {
 public:
  StepSpan(Step begin, Step end) noexcept : end_(end) { record_step(begin); }
  ~StepSpan() { record_step(end_); }
  StepSpan(const StepSpan&) = delete;
  StepSpan& operator=(const StepSpan&) = delete;

 private:
  Step end_;
};

}  // namespace loom::util
