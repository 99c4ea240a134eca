#include "ops.hpp"

#include <optional>

#include "errors.hpp"

namespace loom::python {

OpOwner::~OpOwner() = default;

std::unique_lock<std::mutex> OpOwner::lock() {
  std::unique_lock lock(mutex, std::try_to_lock);
  if (!lock.owns_lock()) without_gil([&] { lock.lock(); });
  return lock;
}

void OpOwner::progress_orphans_locked(std::vector<std::unique_ptr<Ops>>& ended) {
  for (auto it = orphans.begin(); it != orphans.end();) {
    (*it)->progress_locked(*this);
    if ((*it)->done()) {
      ended.push_back(std::move(*it));
      it = orphans.erase(it);
    } else {
      ++it;
    }
  }
}

void OpOwner::forget_locked(std::vector<std::unique_ptr<Ops>>& ended) {
  for (auto& ops : orphans) ended.push_back(std::move(ops));
  orphans.clear();
  in_flight = 0;
}

Ops::~Ops() {
  for (const auto& region : regions_) region->let_go();
}

Entry& Ops::add_entry(std::size_t sizes) {
  Entry& e = entries_.emplace_back();
  e.first_size = static_cast<std::uint32_t>(sizes_.size());
  e.size_count = static_cast<std::uint32_t>(sizes);
  sizes_.resize(sizes_.size() + sizes, 0);
  return e;
}

void Ops::keep(std::shared_ptr<RegionState> region) {
  for (const auto& r : regions_) {
    if (r == region) return;
  }
  region->hold();
  regions_.push_back(std::move(region));
}

void Ops::posted(std::size_t count) {
  entries_.resize(count);
  pending_.store(count, std::memory_order_release);
}

bool Ops::progress_locked(OpOwner& owner, std::uint64_t pass) {
  std::size_t pending = pending_.load(std::memory_order_relaxed);
  if (pending == 0) return false;
  if (!owner.open_locked()) {
    for (std::size_t i = first_pending_; i < entries_.size(); ++i) {
      if (entries_[i].status != Status::kInProgress) continue;
      entries_[i].status = Status::kCancelled;
      if (failure_ == Status::kOk) {
        failure_ = Status::kCancelled;
        failure_index_ = i;
        failure_message_ = std::string("cancelled: the ") + owner.noun() + " was closed";
      }
    }
    first_pending_ = entries_.size();
    pending_.store(0, std::memory_order_release);
    return true;
  }
  bool ended = false;
  for (; first_pending_ < entries_.size(); ++first_pending_) {
    Entry& e = entries_[first_pending_];
    if (e.status != Status::kInProgress) continue;
    const Status status =
        owner.test_locked(e.request, {sizes_.data() + e.first_size, e.size_count});
    if (status == Status::kInProgress) {
      owner.busy_pass = pass;
      break;
    }
    e.status = status;
    --owner.in_flight;
    --pending;
    ended = true;
    if (status != Status::kOk && failure_ == Status::kOk) {
      failure_ = status;
      failure_index_ = first_pending_;
      failure_message_ = owner.last_error_locked();
    }
  }
  pending_.store(pending, std::memory_order_release);
  return ended;
}

bool Ops::progress() {
  std::lock_guard lock(owner_->mutex);
  return progress_locked(*owner_);
}

void Ops::settle() {
  if (!done()) return;
  held_.clear();
  for (const auto& region : regions_) region->let_go();
  regions_.clear();
}

Status Ops::status() const noexcept {
  return done() ? failure_ : Status::kInProgress;
}

void Ops::raise_failure() const {
  if (failure_ == Status::kOk) return;
  std::string message = failure_message_;
  if (entries_.size() > 1) {
    message = "request " + std::to_string(failure_index_) + " of " +
              std::to_string(entries_.size()) + ": " + message;
  }
  raise_status(failure_, message);
}

bool Ops::orphan(std::unique_ptr<Ops>& ops) {
  const std::shared_ptr<OpOwner> owner = ops->owner_;  // outlives the lock
  std::unique_lock lock = owner->lock();
  if (!owner->open_locked()) return false;  // closed: loom is done with the memory
  ops->owner_.reset();
  owner->orphans.push_back(std::move(ops));
  return true;
}

RequestObject::~RequestObject() {
  if (ops && !ops->done() && Ops::orphan(ops)) return;
}

RequestsObject::~RequestsObject() {
  if (ops && !ops->done() && Ops::orphan(ops)) return;
}

namespace {

bool test(Ops& ops) {
  if (!ops.done()) without_gil([&] { ops.progress(); });
  if (!ops.done()) return false;
  ops.settle();
  ops.raise_failure();
  return true;
}

bool wait(Ops& ops, std::optional<double> timeout) {
  if (!ops.done()) {
    wait_for([&] { return StepResult{.done = (ops.progress(), ops.done())}; }, timeout);
  }
  return test(ops);
}

py::object sizes_tuple(const Ops& ops, const Entry& e) {
  const auto sizes = ops.sizes(e);
  py::tuple result(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) result[i] = sizes[i];
  return result;
}

// loom.wait_all: every request of the list tested in passes, oldest first, each owner once
// per pass while its oldest request is still in progress (as fi_p2p_bw waits).
bool wait_all(const py::handle& requests, std::optional<double> timeout) {
  const py::list list = as_list(requests, "requests");
  std::vector<Ops*> all;
  all.reserve(list.size());
  for (py::handle item : list) {
    if (py::isinstance<RequestObject>(item)) {
      all.push_back(item.cast<RequestObject&>().ops.get());
    } else if (py::isinstance<RequestsObject>(item)) {
      all.push_back(item.cast<RequestsObject&>().ops.get());
    } else {
      throw py::type_error(std::string("wait_all takes loom.Request and loom.Requests, not ") +
                           Py_TYPE(item.ptr())->tp_name);
    }
  }
  const bool done = wait_for(
      [&] {
        // Numbered across calls and threads: an owner's mark never matches a later pass.
        static std::atomic<std::uint64_t> passes{0};
        const std::uint64_t pass = passes.fetch_add(1, std::memory_order_relaxed) + 1;
        StepResult result{.done = true};
        for (Ops* ops : all) {
          if (ops->done()) continue;
          OpOwner& owner = *ops->owner();
          {
            std::lock_guard lock(owner.mutex);
            if (owner.busy_pass != pass) result.progressed |= ops->progress_locked(owner, pass);
          }
          result.done = result.done && ops->done();
        }
        return result;
      },
      timeout);
  for (Ops* ops : all) ops->settle();
  for (Ops* ops : all) {
    if (ops->done()) ops->raise_failure();
  }
  return done;
}

constexpr const char* kTestDoc =
    "Makes progress. True once done; raises the loom.Error subclass of its failure (every time "
    "it is asked); False while it runs.";
constexpr const char* kWaitDoc =
    "Makes progress until done (True), or until `timeout` seconds passed (False: it still "
    "runs). Raises as test() does. The GIL is released while it waits.";

}  // namespace

py::object make_request(std::unique_ptr<Ops> ops) {
  return py::cast(std::make_unique<RequestObject>(std::move(ops)));
}

py::object make_requests(std::unique_ptr<Ops> ops) {
  return py::cast(std::make_unique<RequestsObject>(std::move(ops)));
}

void bind_ops(py::module_& module) {
  py::class_<RequestObject>(module, "Request",
                            "One posted operation: an isend, irecv (of one or several buffers), "
                            "iflush, or one-sided batch. It holds the memory it moves until it is "
                            "done; dropped while it runs, its communicator finishes it.")
      .def(
          "test", [](RequestObject& self) { return test(*self.ops); }, kTestDoc)
      .def(
          "wait",
          [](RequestObject& self, std::optional<double> timeout) {
            return wait(*self.ops, timeout);
          },
          py::arg("timeout") = py::none(), kWaitDoc)
      .def_property_readonly("done", [](const RequestObject& self) { return self.ops->done(); })
      .def_property_readonly(
          "status", [](const RequestObject& self) { return self.ops->status(); },
          "loom.Status: IN_PROGRESS until done, then its outcome.")
      .def_property_readonly(
          "sizes",
          [](const RequestObject& self) -> py::object {
            if (!self.ops->done()) return py::none();
            return sizes_tuple(*self.ops, self.ops->entries().front());
          },
          "Once done: the bytes delivered into each buffer of a receive, or sent (a tuple); "
          "None before.")
      .def("__repr__", [](const RequestObject& self) {
        return "<loom.Request " + std::string(py::str(py::cast(self.ops->status()))) + ">";
      });

  py::class_<RequestsObject>(module, "Requests",
                             "The requests one isend_many or irecv_many call posted, tested and "
                             "waited for together.")
      .def(
          "test", [](RequestsObject& self) { return test(*self.ops); }, kTestDoc)
      .def(
          "wait",
          [](RequestsObject& self, std::optional<double> timeout) {
            return wait(*self.ops, timeout);
          },
          py::arg("timeout") = py::none(), kWaitDoc)
      .def_property_readonly("done", [](const RequestsObject& self) { return self.ops->done(); })
      .def_property_readonly("status",
                             [](const RequestsObject& self) { return self.ops->status(); })
      .def_property_readonly(
          "sizes",
          [](const RequestsObject& self) -> py::object {
            if (!self.ops->done()) return py::none();
            py::list sizes;
            for (const Entry& e : self.ops->entries()) sizes.append(self.ops->sizes(e)[0]);
            return sizes;
          },
          "Once done: the bytes each request sent or delivered (a list); None before.")
      .def("__len__", [](const RequestsObject& self) { return self.ops->entries().size(); })
      .def("__repr__", [](const RequestsObject& self) {
        return "<loom.Requests " + std::to_string(self.ops->entries().size()) + " " +
               std::string(py::str(py::cast(self.ops->status()))) + ">";
      });

  module.def("wait_all", &wait_all, py::arg("requests"), py::arg("timeout") = py::none(),
             "Waits for every loom.Request and loom.Requests of `requests`: True once all are "
             "done, False if `timeout` seconds passed first. Raises the first failure among "
             "them once none runs any more. One call, the GIL released, each communicator "
             "tested once per pass (oldest request first), as loom's benchmark waits.");
}

}  // namespace loom::python
