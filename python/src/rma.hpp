// The one-sided API: loom.RmaInitiator (import_region, write and read batches of blocks, each a
// loom.Request), loom.RmaTarget (export_region, poll and wait for notifications),
// loom.RemoteRegion and loom.Notification.
#pragma once

#include <memory>
#include <mutex>

#include <pybind11/pybind11.h>

#include "loom/loom.hpp"
#include "ops.hpp"
#include "state.hpp"

namespace loom::python {

class RmaInitiatorState final : public OpOwner {
 public:
  RmaInitiatorState(std::shared_ptr<ContextState> context, std::unique_ptr<RmaInitiator> rma)
      : OpOwner(std::move(context)), rma_(std::move(rma)) {}
  ~RmaInitiatorState() override;
  void close() override;

  Status test_locked(Request request, std::span<std::size_t> /*sizes*/) override {
    return rma_->test(request);
  }
  [[nodiscard]] std::string last_error_locked() const override { return rma_->last_error(); }
  [[nodiscard]] bool open_locked() const override { return rma_ != nullptr; }
  [[nodiscard]] const char* noun() const noexcept override { return "connection"; }
  [[nodiscard]] RmaInitiator& rma_locked() noexcept { return *rma_; }

 private:
  std::unique_ptr<RmaInitiator> rma_;  // under `mutex`; null once closed
};

class RmaTargetState final : public Closable {
 public:
  RmaTargetState(std::shared_ptr<ContextState> context, std::unique_ptr<RmaTarget> rma)
      : context_(std::move(context)), rma_(std::move(rma)) {}
  ~RmaTargetState() override;
  void close() override;

  [[nodiscard]] const std::shared_ptr<ContextState>& context() const noexcept { return context_; }
  std::mutex mutex;
  // Under `mutex`; null once closed.
  [[nodiscard]] RmaTarget* rma_locked() noexcept { return rma_.get(); }

 private:
  std::shared_ptr<ContextState> context_;
  std::unique_ptr<RmaTarget> rma_;
};

py::object wrap_initiator(const std::shared_ptr<ContextState>& context,
                          std::unique_ptr<RmaInitiator> rma);
py::object wrap_target(const std::shared_ptr<ContextState>& context,
                       std::unique_ptr<RmaTarget> rma);

void bind_rma(py::module_& module);

}  // namespace loom::python
