// A communicator's port on a lane that only counts the deferred work its lane runs for it: what
// the mux tests ask of who runs deferred work, and when.
#pragma once

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

}  // namespace loom::test
