// Posted operations as Python sees them: loom.Request (one isend, irecv, iflush or one-sided
// batch) and loom.Requests (the many posted by one isend_many/irecv_many call, tested together
// at the cost of one Python call). They hold the memory they move until loom reported them done,
// so that Python cannot free or resize it under the provider; one dropped while it runs is
// adopted by its communicator, which finishes it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "buffers.hpp"
#include "errors.hpp"
#include "loom/loom.hpp"
#include "state.hpp"

namespace loom::python {

class Ops;

// A communicator or one-sided initiator: what requests are posted on and tested through.
class OpOwner : public Closable, public std::enable_shared_from_this<OpOwner> {
 public:
  explicit OpOwner(std::shared_ptr<ContextState> context) : context_(std::move(context)) {}
  ~OpOwner() override;

  // loom's calls, with `mutex` held and the GIL released; only while open_locked().
  virtual Status test_locked(Request request, std::span<std::size_t> sizes) = 0;
  [[nodiscard]] virtual std::string last_error_locked() const = 0;
  [[nodiscard]] virtual bool open_locked() const = 0;
  // What the owner is called in messages ("communicator", "connection").
  [[nodiscard]] virtual const char* noun() const noexcept = 0;

  [[nodiscard]] const std::shared_ptr<ContextState>& context() const noexcept { return context_; }
  // Takes `mutex` without blocking while holding the GIL.
  [[nodiscard]] std::unique_lock<std::mutex> lock();

  std::mutex mutex;
  // Under `mutex`: requests posted and not yet reported done; the wait_all pass in which the
  // oldest of them was still in progress; the dropped ones it finishes.
  std::size_t in_flight = 0;
  std::uint64_t busy_pass = 0;
  std::vector<std::unique_ptr<Ops>> orphans;

  // Under `mutex`: tests the orphans, moving the finished ones to `ended` (to be destroyed with
  // the GIL held, which lets go of their memory).
  void progress_orphans_locked(std::vector<std::unique_ptr<Ops>>& ended);

 protected:
  // For close(): under `mutex`, after loom's object closed.
  void forget_locked(std::vector<std::unique_ptr<Ops>>& ended);

 private:
  std::shared_ptr<ContextState> context_;
};

// One posted request's record.
struct Entry {
  Request request;
  Status status = Status::kInProgress;
  std::uint32_t first_size = 0;  // into Ops::sizes
  std::uint32_t size_count = 0;
};

// The requests of one post call and the memory they use.
class Ops {
 public:
  explicit Ops(std::shared_ptr<OpOwner> owner) : owner_(std::move(owner)) {}
  ~Ops();  // the GIL held
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  // Building, with the GIL (before the post).
  void reserve(std::size_t entries, std::size_t sizes) {
    entries_.reserve(entries);
    sizes_.reserve(sizes);
  }
  Entry& add_entry(std::size_t sizes);
  void set_request(std::size_t i, Request request) noexcept { entries_[i].request = request; }
  void keep(HeldBuffer buffer) { held_.push_back(std::move(buffer)); }
  void keep(std::shared_ptr<RegionState> region);
  // After the post: the entries that were posted, oldest first (the others are dropped).
  void posted(std::size_t count);

  // One pass over the pending entries, oldest first, stopping at one still in progress (the
  // owner's progress is shared: testing later ones would read the same queues again). The
  // owner's mutex held, the GIL released. Returns whether any entry ended. `pass` marks the
  // owner busy for wait_all. A closed owner cancels every pending entry.
  bool progress_locked(OpOwner& owner, std::uint64_t pass = 0);
  // progress_locked with the mutex taken; without the GIL.
  bool progress();

  [[nodiscard]] std::size_t pending() const noexcept {
    return pending_.load(std::memory_order_acquire);
  }
  [[nodiscard]] bool done() const noexcept { return pending() == 0; }
  // With the GIL, once done: lets go of the memory; raises the first failure.
  void settle();
  void raise_failure() const;
  [[nodiscard]] Status status() const noexcept;

  [[nodiscard]] const std::vector<Entry>& entries() const noexcept { return entries_; }
  [[nodiscard]] std::span<const std::size_t> sizes(const Entry& e) const noexcept {
    return {sizes_.data() + e.first_size, e.size_count};
  }
  [[nodiscard]] const std::shared_ptr<OpOwner>& owner() const noexcept { return owner_; }
  // Hands this to its owner, who finishes it; false where the owner is closed (then nothing
  // runs any more and it can be destroyed).
  static bool orphan(std::unique_ptr<Ops>& ops);

 private:
  std::shared_ptr<OpOwner> owner_;  // null once orphaned (its owner holds it then)
  std::vector<Entry> entries_;
  std::vector<std::size_t> sizes_;
  std::vector<HeldBuffer> held_;
  std::vector<std::shared_ptr<RegionState>> regions_;  // each hold()ed
  std::atomic<std::size_t> pending_{0};
  std::size_t first_pending_ = 0;
  Status failure_ = Status::kOk;
  std::size_t failure_index_ = 0;
  std::string failure_message_;
};

// The Python objects.
struct RequestObject {
  explicit RequestObject(std::unique_ptr<Ops> posted) : ops(std::move(posted)) {}
  RequestObject(const RequestObject&) = delete;
  RequestObject& operator=(const RequestObject&) = delete;
  ~RequestObject();
  std::unique_ptr<Ops> ops;
};
struct RequestsObject {
  explicit RequestsObject(std::unique_ptr<Ops> posted) : ops(std::move(posted)) {}
  RequestsObject(const RequestsObject&) = delete;
  RequestsObject& operator=(const RequestsObject&) = delete;
  ~RequestsObject();
  std::unique_ptr<Ops> ops;
};

// What a post came to, decided without the GIL and raised with it.
struct Outcome {
  Status status = Status::kOk;
  std::string message;
  bool closed = false;
  std::size_t posted = 0;
};

// Runs `post(outcome, ops)` (without the GIL, the owner's mutex held, its finished orphans
// reaped), which posts and says how far it got; raises what it came to, or returns the ops with
// the requests posted. loom::Error (a registration refused) becomes ProviderError.
template <typename Post>
std::unique_ptr<Ops> run_post(OpOwner& self, std::unique_ptr<Ops> ops, Post&& post) {
  Outcome outcome;
  std::vector<std::unique_ptr<Ops>> ended;  // destroyed with the GIL, at return
  without_gil([&] {
    std::lock_guard lock(self.mutex);
    if (!self.open_locked()) {
      outcome.closed = true;
      return;
    }
    self.progress_orphans_locked(ended);
    try {
      post(outcome, *ops);
    } catch (const Error& e) {
      outcome.status = Status::kError;
      outcome.message = e.what();
    }
    self.in_flight += outcome.posted;
  });
  ops->posted(outcome.posted);
  if (outcome.closed) raise_closed(std::string("the ") + self.noun());
  if (outcome.status != Status::kOk) {
    if (outcome.posted > 0) {
      outcome.message +=
          " (the " + std::to_string(outcome.posted) + " requests before it were posted and run on)";
      Ops::orphan(ops);
    }
    raise_status(outcome.status, outcome.message);
  }
  return ops;
}

// Wraps posted ops into a Python Request / Requests.
py::object make_request(std::unique_ptr<Ops> ops);
py::object make_requests(std::unique_ptr<Ops> ops);

// Binds Request, Requests and loom.wait_all.
void bind_ops(py::module_& module);

}  // namespace loom::python
