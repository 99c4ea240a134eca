// loom.SendComm and loom.RecvComm: isend/irecv/iflush of Python buffers, and isend_many and
// irecv_many, which post a window of messages in one call.
#pragma once

#include <memory>

#include <pybind11/pybind11.h>

#include "loom/loom.hpp"
#include "ops.hpp"
#include "state.hpp"

namespace loom::python {

class CommState : public OpOwner {
 public:
  CommState(std::shared_ptr<ContextState> context, std::unique_ptr<Communicator> comm)
      : OpOwner(std::move(context)), comm_(std::move(comm)) {}
  ~CommState() override;
  void close() override;

  Status test_locked(Request request, std::span<std::size_t> sizes) override {
    return comm_->test(request, sizes);
  }
  [[nodiscard]] std::string last_error_locked() const override { return comm_->last_error(); }
  [[nodiscard]] bool open_locked() const override { return comm_ != nullptr; }
  [[nodiscard]] const char* noun() const noexcept override { return "communicator"; }
  // Under `mutex`, while open_locked().
  [[nodiscard]] Communicator& comm_locked() noexcept { return *comm_; }

 private:
  std::unique_ptr<Communicator> comm_;  // under `mutex`; null once closed
};

class SendCommState final : public CommState {
 public:
  using CommState::CommState;
  SendComm& send_locked() noexcept { return static_cast<SendComm&>(comm_locked()); }
};

class RecvCommState final : public CommState {
 public:
  using CommState::CommState;
  RecvComm& recv_locked() noexcept { return static_cast<RecvComm&>(comm_locked()); }
};

// Python objects for communicators loom made (the context closes them with itself).
py::object wrap_send_comm(const std::shared_ptr<ContextState>& context,
                          std::unique_ptr<SendComm> comm);
py::object wrap_recv_comm(const std::shared_ptr<ContextState>& context,
                          std::unique_ptr<RecvComm> comm);

void bind_p2p(py::module_& module);

}  // namespace loom::python
