#include "state.hpp"

#include <algorithm>
#include <thread>

#include <sched.h>

#include "errors.hpp"

namespace loom::python {

ContextState::ContextState(const Config& config)
    : context_(without_gil([&] { return std::make_shared<Context>(config); })) {}

ContextState::~ContextState() {
  close();
}

std::shared_ptr<Context> ContextState::get() const {
  if (context_ == nullptr) raise_closed("the context");
  return context_;
}

void ContextState::adopt(const std::shared_ptr<Closable>& child) {
  std::erase_if(children_, [](const std::weak_ptr<Closable>& c) { return c.expired(); });
  children_.push_back(child);
}

void ContextState::close() {
  // Children close in the reverse of their making: communicators and connections before the
  // listeners and regions they came from or use.
  while (!children_.empty()) {
    const std::shared_ptr<Closable> child = children_.back().lock();
    children_.pop_back();
    if (child != nullptr) child->close();
  }
  ranges_.clear();
  std::shared_ptr<Context> context = std::move(context_);
  if (context != nullptr) without_gil([&] { context.reset(); });
}

void ContextState::remove_range(const void* owner) {
  std::erase_if(ranges_, [&](const Range& r) { return r.owner == owner; });
}

const MemoryRegion* ContextState::find(const std::byte* data, std::size_t size, MemoryType type,
                                       int device) const noexcept {
  for (const Range& r : ranges_) {
    if (r.type == type && r.device == device && data >= r.begin && size <= r.size &&
        static_cast<std::size_t>(data - r.begin) <= r.size - size) {
      return &r.handle;
    }
  }
  return nullptr;
}

RegionState::RegionState(std::shared_ptr<ContextState> context, HeldBuffer buffer)
    : context_(std::move(context)), buffer_(std::move(buffer)) {
  const std::shared_ptr<Context> core = context_->get();
  region_ = without_gil([&] {
    return core->register_memory(buffer_.data(), buffer_.size(), buffer_.type(), buffer_.device());
  });
  context_->add_range(
      {buffer_.data(), buffer_.size(), buffer_.type(), buffer_.device(), region_.handle(), this});
}

RegionState::~RegionState() {
  close();
}

const MemoryRegion& RegionState::handle() const {
  if (!region_.valid()) raise_closed("the region");
  return region_.handle();
}

void RegionState::close() {
  if (!region_.valid()) return;
  context_->remove_range(this);
  // Deregistering revokes what one-sided targets exported of it: that waits for the initiators.
  without_gil([&] { region_.reset(); });
  if (users_ == 0) buffer_.release();
}

void RegionState::let_go() noexcept {
  if (--users_ == 0 && !region_.valid()) buffer_.release();
}

Waiter::Waiter(std::optional<double> timeout)
    : start_(Clock::now()), last_progress_(start_), next_signal_check_(start_) {
  if (timeout) {
    deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(std::max(*timeout, 0.0)));
  }
}

bool Waiter::again(bool progressed) {
  ++spins_;
  if (!progressed && (spins_ & 15) != 0) return true;  // the clock is read every 16th spin
  const auto now = Clock::now();
  if (progressed) last_progress_ = now;
  if (deadline_ && now >= *deadline_) return false;
  if (now >= next_signal_check_) {
    next_signal_check_ = now + std::chrono::milliseconds(100);
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      interrupted_ = true;
      return false;
    }
  }
  const auto idle = now - last_progress_;
  if (idle > std::chrono::milliseconds(100)) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  } else if (idle > std::chrono::milliseconds(10)) {
    sched_yield();
  }
  return true;
}

py::list as_list(py::handle object, const char* what) {
  if (PyList_Check(object.ptr())) return py::reinterpret_borrow<py::list>(object);
  if (!py::isinstance<py::iterable>(object)) {
    throw py::type_error(std::string(what) + " must be a sequence, not " +
                         Py_TYPE(object.ptr())->tp_name);
  }
  return py::list(py::reinterpret_borrow<py::object>(object));
}

}  // namespace loom::python
