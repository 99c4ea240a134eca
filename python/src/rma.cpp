#include "rma.hpp"

#include <array>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "errors.hpp"

namespace loom::python {
namespace {

// A descriptor as one initiator imported it.
struct RemoteRegionObject {
  RemoteRegion handle;
  std::weak_ptr<RmaInitiatorState> owner;
};

std::size_t to_size(py::handle object, std::size_t block, const char* what) {
  const Py_ssize_t value = PyNumber_AsSsize_t(object.ptr(), PyExc_OverflowError);  // __index__
  if (value == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (value < 0) raise_invalid("block " + std::to_string(block) + ": negative " + what);
  return static_cast<std::size_t>(value);
}

// Blocks given as (local region, local offset, remote region, remote offset, length); the same
// regions in a row are looked at once.
class BlockParser {
 public:
  BlockParser(const std::shared_ptr<RmaInitiatorState>& self, Ops& ops, bool read)
      : self_(self), ops_(ops), read_(read) {}

  RmaBlock parse(py::handle item, std::size_t index) {
    const bool sequence = PyTuple_Check(item.ptr()) != 0 || PyList_Check(item.ptr()) != 0;
    if (!sequence || PySequence_Fast_GET_SIZE(item.ptr()) != 5) {
      throw py::type_error("block " + std::to_string(index) +
                           ": expected (local region, local offset, remote region, remote "
                           "offset, length)");
    }
    PyObject** fields = PySequence_Fast_ITEMS(item.ptr());
    const std::array<py::handle, 5> block{fields[0], fields[1], fields[2], fields[3], fields[4]};
    if (block[0].ptr() != last_local_) {
      if (!py::isinstance<RegionState>(block[0])) {
        throw py::type_error("block " + std::to_string(index) +
                             ": the local region must be a loom.Region");
      }
      auto region = block[0].cast<std::shared_ptr<RegionState>>();
      if (region->context() != self_->context()) {
        raise_invalid("block " + std::to_string(index) + ": a region of another context");
      }
      if (read_ && region->buffer().readonly()) {
        raise_invalid("block " + std::to_string(index) +
                      ": a read cannot land in a read-only "
                      "region");
      }
      local_ = region->handle();
      ops_.keep(std::move(region));
      last_local_ = block[0].ptr();
    }
    if (block[2].ptr() != last_remote_) {
      if (!py::isinstance<RemoteRegionObject>(block[2])) {
        throw py::type_error("block " + std::to_string(index) +
                             ": the remote region must be a loom.RemoteRegion");
      }
      const auto& remote = block[2].cast<const RemoteRegionObject&>();
      if (remote.owner.lock() != self_) {
        raise_invalid("block " + std::to_string(index) +
                      ": a remote region imported by another connection");
      }
      remote_ = remote.handle;
      last_remote_ = block[2].ptr();
    }
    return {local_, to_size(block[1], index, "local offset"), remote_,
            to_size(block[3], index, "remote offset"), to_size(block[4], index, "length")};
  }

 private:
  const std::shared_ptr<RmaInitiatorState>& self_;
  Ops& ops_;
  bool read_;
  PyObject* last_local_ = nullptr;
  MemoryRegion local_;
  PyObject* last_remote_ = nullptr;
  RemoteRegion remote_;
};

std::optional<Notification> to_notification(py::handle object) {
  if (object.is_none()) return std::nullopt;
  if (py::isinstance<Notification>(object)) return object.cast<Notification>();
  if (PyIndex_Check(object.ptr()) != 0) {
    return Notification{
        .tag = py::int_(py::reinterpret_borrow<py::object>(object)).cast<std::uint64_t>()};
  }
  throw py::type_error("notification: a loom.Notification, an int tag, or None");
}

py::object post_batch(const std::shared_ptr<RmaInitiatorState>& self, py::handle blocks,
                      py::handle notification, bool read) {
  auto ops = std::make_unique<Ops>(self);
  ops->add_entry(0);
  const py::list list = as_list(blocks, "blocks");
  std::vector<RmaBlock> parsed;
  parsed.reserve(list.size());
  BlockParser parser(self, *ops, read);
  for (std::size_t i = 0; i < list.size(); ++i) parsed.push_back(parser.parse(list[i], i));
  const std::optional<Notification> note = to_notification(notification);
  ops = run_post(*self, std::move(ops), [&](Outcome& outcome, Ops& posting) {
    RmaInitiator& rma = self->rma_locked();
    const Posted posted = read ? rma.read(parsed) : rma.write(parsed, note);
    if (posted.status != Status::kOk) {
      outcome.status = posted.status;
      outcome.message = rma.last_error();
      return;
    }
    posting.set_request(0, posted.request);
    outcome.posted = 1;
  });
  return make_request(std::move(ops));
}

std::vector<std::byte> to_bytes(py::handle object) {
  Py_buffer view{};
  if (PyObject_GetBuffer(object.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  const auto* data = static_cast<const std::byte*>(view.buf);
  std::vector<std::byte> bytes(data, data + view.len);
  PyBuffer_Release(&view);
  return bytes;
}

py::dict stats_dict(const RmaStats& stats) {
  py::dict d;
  d["batches"] = stats.batches;
  d["blocks"] = stats.blocks;
  d["bytes_written"] = stats.bytes_written;
  d["bytes_read"] = stats.bytes_read;
  d["notifications"] = stats.notifications;
  d["lane_id"] = stats.lane_id;
  d["lane_comms"] = stats.lane_comms;
  return d;
}

// Calls `f(initiator)` under its mutex without the GIL; ClosedError once it is closed.
template <typename F>
auto with_initiator(RmaInitiatorState& self, F&& f) {
  std::optional<std::invoke_result_t<F, RmaInitiator&>> result;
  without_gil([&] {
    std::lock_guard guard(self.mutex);
    if (self.open_locked()) result.emplace(f(self.rma_locked()));
  });
  if (!result) raise_closed("the connection");
  return std::move(*result);
}

// Calls `f(target)` under the target's mutex without the GIL; ClosedError once it is closed.
template <typename F>
auto with_target(RmaTargetState& self, F&& f) {
  std::optional<std::invoke_result_t<F, RmaTarget&>> result;
  without_gil([&] {
    std::lock_guard guard(self.mutex);
    if (RmaTarget* t = self.rma_locked()) result.emplace(f(*t));
  });
  if (!result) raise_closed("the connection");
  return std::move(*result);
}

py::object notification_or_none(const std::optional<Notification>& note) {
  return note ? py::cast(*note) : py::none();
}

}  // namespace

RmaInitiatorState::~RmaInitiatorState() {
  close();
}

void RmaInitiatorState::close() {
  std::vector<std::unique_ptr<Ops>> ended;  // their memory is ours again: dropped with the GIL
  without_gil([&] {
    std::lock_guard lock(mutex);
    std::unique_ptr<RmaInitiator> rma = std::move(rma_);
    if (rma != nullptr) rma->close();
    forget_locked(ended);
  });
}

RmaTargetState::~RmaTargetState() {
  close();
}

void RmaTargetState::close() {
  without_gil([&] {
    std::lock_guard lock(mutex);
    std::unique_ptr<RmaTarget> rma = std::move(rma_);
    if (rma != nullptr) rma->close();
  });
}

py::object wrap_initiator(const std::shared_ptr<ContextState>& context,
                          std::unique_ptr<RmaInitiator> rma) {
  auto state = std::make_shared<RmaInitiatorState>(context, std::move(rma));
  context->adopt(state);
  return py::cast(state);
}

py::object wrap_target(const std::shared_ptr<ContextState>& context,
                       std::unique_ptr<RmaTarget> rma) {
  auto state = std::make_shared<RmaTargetState>(context, std::move(rma));
  context->adopt(state);
  return py::cast(state);
}

void bind_rma(py::module_& module) {
  py::class_<Notification>(module, "Notification",
                           "What a write batch tells its target once every byte of it landed: "
                           "the application's tag and value, and the batch's block and byte "
                           "counts (filled in by loom).")
      .def(py::init([](std::uint64_t tag, std::uint64_t value) {
             return Notification{.tag = tag, .value = value};
           }),
           py::arg("tag") = 0, py::arg("value") = 0)
      .def_readwrite("tag", &Notification::tag)
      .def_readwrite("value", &Notification::value)
      .def_readonly("blocks", &Notification::blocks)
      .def_readonly("bytes", &Notification::bytes)
      .def("__repr__", [](const Notification& n) {
        return "Notification(tag=" + std::to_string(n.tag) + ", value=" + std::to_string(n.value) +
               ", blocks=" + std::to_string(n.blocks) + ", bytes=" + std::to_string(n.bytes) + ")";
      });

  py::class_<RemoteRegionObject>(module, "RemoteRegion",
                                 "A target's region as this initiator imported it "
                                 "(RmaInitiator.import_region).")
      .def(
          "forget",
          [](RemoteRegionObject& self) {
            const std::shared_ptr<RmaInitiatorState> owner = self.owner.lock();
            if (owner == nullptr) return;
            without_gil([&] {
              std::lock_guard lock(owner->mutex);
              if (owner->open_locked()) owner->rma_locked().forget(self.handle);
            });
          },
          "This handle names nothing from now on (batches posted with it go on).");

  py::class_<RmaInitiatorState, std::shared_ptr<RmaInitiatorState>>(
      module, "RmaInitiator",
      "The initiator's end of a one-sided connection (RmaConnector.wait): writes and reads "
      "batches of blocks straight into the target's exported regions.")
      .def(
          "import_region",
          [](const std::shared_ptr<RmaInitiatorState>& self, py::handle descriptor) {
            const std::vector<std::byte> bytes = to_bytes(descriptor);
            std::optional<RemoteRegion> region;
            std::optional<Error> failure;
            without_gil([&] {
              std::lock_guard lock(self->mutex);
              if (!self->open_locked()) return;
              try {
                region = self->rma_locked().import_region(bytes);
              } catch (const Error& e) {
                failure = e;
              }
            });
            if (failure) raise_setup(*failure, SetupFault::kArgument);
            if (!region) raise_closed("the connection");
            return RemoteRegionObject{*region, self};
          },
          py::arg("descriptor"),
          "Checks a descriptor the target exported for this connection (bytes) and returns a "
          "loom.RemoteRegion. A corrupt, foreign or stale one raises loom.InvalidError saying "
          "which.")
      .def(
          "write",
          [](const std::shared_ptr<RmaInitiatorState>& self, py::handle blocks,
             py::handle notification) { return post_batch(self, blocks, notification, false); },
          py::arg("blocks"), py::arg("notification") = py::none(),
          "Posts a batch of writes: `blocks` a list of (local loom.Region, local offset, "
          "loom.RemoteRegion, remote offset, length). `notification` (a loom.Notification, or "
          "an int tag) reaches the target's poll() once every byte of the batch is in its "
          "memory; it leaves once this side's progress (test/wait) saw the last write "
          "complete. Returns a loom.Request. Every block is checked first: a bad one refuses "
          "the batch (loom.InvalidError naming it); loom.RetryError with 128 batches in "
          "flight.")
      .def(
          "read",
          [](const std::shared_ptr<RmaInitiatorState>& self, py::handle blocks) {
            return post_batch(self, blocks, py::none(), true);
          },
          py::arg("blocks"),
          "Posts a batch of reads from the target's regions into local ones; a loom.Request.")
      .def("close", &RmaInitiatorState::close,
           "Waits for what the provider holds (at most LOOM_PEER_TIMEOUT_MS), tells the target "
           "and leaves the lane; pending batches raise loom.CancelledError. Idempotent.")
      .def_property_readonly("closed",
                             [](RmaInitiatorState& self) {
                               std::unique_lock lock = self.lock();
                               return !self.open_locked();
                             })
      .def("stats",
           [](RmaInitiatorState& self) {
             return stats_dict(with_initiator(self, [](RmaInitiator& i) { return i.stats(); }));
           })
      .def_property_readonly(
          "label",
          [](RmaInitiatorState& self) {
            return with_initiator(self, [](RmaInitiator& i) { return i.label(); });
          },
          "The label given to Context.connect_rma (0 if none).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](RmaInitiatorState& self, const py::args&) {
        self.close();
        return false;
      });

  py::class_<RmaTargetState, std::shared_ptr<RmaTargetState>>(
      module, "RmaTarget",
      "The target's end of a one-sided connection (Listener.accept_rma): exports regions and "
      "hands out the notifications of batches that landed.")
      .def(
          "export_region",
          [](RmaTargetState& self, const std::shared_ptr<RegionState>& region) {
            if (region->context() != self.context()) raise_invalid("a region of another context");
            if (region->buffer().readonly()) {
              raise_invalid("a read-only region cannot be exported: the initiator may write it");
            }
            const MemoryRegion handle = region->handle();
            const std::vector<std::byte> descriptor =
                with_target(self, [&](RmaTarget& t) { return t.export_region(handle); });
            return py::bytes(reinterpret_cast<const char*>(descriptor.data()), descriptor.size());
          },
          py::arg("region"),
          "The descriptor (bytes, at most 192) of a loom.Region of this context for this "
          "connection's initiator, to ship by any means. Closing the region revokes it.")
      .def(
          "poll",
          [](RmaTargetState& self) {
            return notification_or_none(with_target(self, [](RmaTarget& t) { return t.poll(); }));
          },
          "Makes progress; the next loom.Notification whose batch landed, in post order, or "
          "None. The target must keep calling it (on shm its progress carries the writes).")
      .def(
          "wait",
          [](RmaTargetState& self, std::optional<double> timeout) {
            std::optional<Notification> note;
            bool closed = false;
            wait_for(
                [&] {
                  std::lock_guard lock(self.mutex);
                  RmaTarget* target = self.rma_locked();
                  if (target == nullptr) {
                    closed = true;
                    return StepResult{.done = true};
                  }
                  note = target->poll();
                  return StepResult{.done = note.has_value()};
                },
                timeout);
            if (closed) raise_closed("the connection");
            return notification_or_none(note);
          },
          py::arg("timeout") = py::none(),
          "poll() until a notification comes (returned) or `timeout` seconds passed (None), "
          "the GIL released.")
      .def("close", &RmaTargetState::close,
           "Leaves the lane; the context's regions stay registered until closed. Idempotent.")
      .def("stats",
           [](RmaTargetState& self) {
             return stats_dict(with_target(self, [](RmaTarget& t) { return t.stats(); }));
           })
      .def_property_readonly(
          "label",
          [](RmaTargetState& self) {
            return with_target(self, [](RmaTarget& t) { return t.label(); });
          },
          "The label the initiator's side gave Context.connect_rma (0 if none): which peer this "
          "connection is.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](RmaTargetState& self, const py::args&) {
        self.close();
        return false;
      });
}

}  // namespace loom::python
