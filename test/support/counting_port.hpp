// A communicator's port on a lane that only counts the deferred work its lane runs for it: what
// the mux tests ask of who runs deferred work, and when.
#pragma once

#include <mutex>
#include <span>

#include "mux/lane.hpp"

namespace loom::test {

struct CountingPort final : mux::CommPort {
  int runs = 0;
  void on_control(const mux::ControlHeader&, std::span<const std::byte>) override {}
  void on_remote_write(mux::WriteImmediate) override {}
  void on_deferred() override { ++runs; }
  [[nodiscard]] bool drained() const noexcept override { return true; }
  [[nodiscard]] bool abandoned() const noexcept override { return false; }
  void abandon_registrations() noexcept override {}
};

// A CountingPort attached to `lane` while it lives, each call under the lane's lock as a
// communicator's would be. Destroy it before the lane is left.
class AttachedCounter {
 public:
  explicit AttachedCounter(mux::Lane& lane) : lane_(lane) {
    std::lock_guard lock(lane_.lock());
    id_ = lane_.attach(port_);
  }
  ~AttachedCounter() {
    std::lock_guard lock(lane_.lock());
    lane_.detach(id_);
  }
  AttachedCounter(const AttachedCounter&) = delete;
  AttachedCounter& operator=(const AttachedCounter&) = delete;

  // Work for the lane's next progress (Lane::defer).
  void defer() {
    std::lock_guard lock(lane_.lock());
    lane_.defer(port_, id_);
  }
  [[nodiscard]] int runs() const noexcept { return port_.runs; }

 private:
  mux::Lane& lane_;
  CountingPort port_;
  mux::CommId id_ = 0;
};

}  // namespace loom::test
