// What the Python objects hold: a context and what it opened (regions, listeners, connectors,
// communicators, one-sided connections), each closable once, the context closing them all.
//
// Threads: Python code may use one object from several threads, while loom lets one thread at a
// time into a communicator. Every loom call that may block or progress runs with the GIL
// released, under the object's own mutex, which is only ever taken without the GIL (so a thread
// holding it may wait for the GIL, never the other way round). Everything else (the Python
// references, the context's lists) is guarded by the GIL.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // every file: type casters must agree across them

#include "buffers.hpp"
#include "loom/loom.hpp"

namespace loom::python {

namespace py = pybind11;

inline bool finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// Runs `f` with the GIL released (held on during interpreter shutdown, when it must not be).
template <typename F>
decltype(auto) without_gil(F&& f) {
  if (finalizing()) return f();
  py::gil_scoped_release release;
  return f();
}

// Something a Context closes with itself.
class Closable {
 public:
  virtual ~Closable() = default;
  // Idempotent; the GIL held (released inside while loom blocks).
  virtual void close() = 0;
};

class ContextState {
 public:
  explicit ContextState(const Config& config);
  ~ContextState();
  ContextState(const ContextState&) = delete;
  ContextState& operator=(const ContextState&) = delete;

  // The context, for a call made without the GIL (a copy: close() may run meanwhile).
  // Raises ClosedError once closed.
  std::shared_ptr<Context> get() const;
  [[nodiscard]] bool closed() const noexcept { return context_ == nullptr; }
  // Closes every child that is still open, then the context.
  void close();
  void adopt(const std::shared_ptr<Closable>& child);

  // The context's regions, found by the memory a post names.
  struct Range {
    const std::byte* begin;
    std::size_t size;
    MemoryType type;
    int device;
    MemoryRegion handle;
    const void* owner;  // the RegionState
  };
  void add_range(const Range& range) { ranges_.push_back(range); }
  void remove_range(const void* owner);
  // The region holding [data, data + size), or null.
  [[nodiscard]] const MemoryRegion* find(const std::byte* data, std::size_t size, MemoryType type,
                                         int device) const noexcept;

 private:
  std::shared_ptr<Context> context_;
  std::vector<std::weak_ptr<Closable>> children_;
  std::vector<Range> ranges_;
};

// A context region (Context.register_memory) and the Python memory it registered. The memory
// stays held while the region is open and while requests posted with it run (`users`).
class RegionState final : public Closable {
 public:
  RegionState(std::shared_ptr<ContextState> context, HeldBuffer buffer);
  ~RegionState() override;
  void close() override;

  [[nodiscard]] bool open() const noexcept { return region_.valid(); }
  // Raises ClosedError once closed.
  [[nodiscard]] const MemoryRegion& handle() const;
  [[nodiscard]] const HeldBuffer& buffer() const noexcept { return buffer_; }
  [[nodiscard]] const std::shared_ptr<ContextState>& context() const noexcept { return context_; }
  // A posted request uses the region until it ended: its memory is held till then.
  void hold() noexcept { ++users_; }
  void let_go() noexcept;

 private:
  std::shared_ptr<ContextState> context_;
  HeldBuffer buffer_;
  Region region_;
  std::size_t users_ = 0;
};

// Waits the way fi_p2p_bw does, then politely: calls a step (without the GIL) until it says
// done, spinning while it completes things and for 10 ms without a completion (a 16 MiB message
// at 1.7 GB/s: giving up the CPU within a transfer only slows it on a loaded host), then
// yielding the CPU each turn, and sleeping in 50 us steps after 100 ms. Every 100 ms it takes
// the GIL to let Python run its signal handlers (a KeyboardInterrupt raises out of the wait).
// `timeout` in seconds; none: no limit.
class Waiter {
 public:
  explicit Waiter(std::optional<double> timeout);
  // After a step that did not finish: whether to take another (false once the timeout passed,
  // or a signal handler raised).
  bool again(bool progressed);
  [[nodiscard]] bool interrupted() const noexcept { return interrupted_; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
  Clock::time_point last_progress_;
  Clock::time_point next_signal_check_;
  std::optional<Clock::time_point> deadline_;
  unsigned spins_ = 0;
  bool interrupted_ = false;
};

struct StepResult {
  bool done = false;
  bool progressed = false;
};

// Returns whether the step said done before the timeout. Raises what a signal handler raised.
template <typename Step>
bool wait_for(Step&& step, std::optional<double> timeout) {
  Waiter waiter(timeout);
  bool done = false;
  without_gil([&] {
    for (;;) {
      const StepResult result = step();
      if (result.done) {
        done = true;
        return;
      }
      if (!waiter.again(result.progressed)) return;
    }
  });
  if (waiter.interrupted()) throw py::error_already_set();
  return done;
}

// Sequence arguments: `object` as a list of items (a tuple, list, or any iterable).
py::list as_list(py::handle object, const char* what);

}  // namespace loom::python
