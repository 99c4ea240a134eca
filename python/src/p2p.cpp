#include "p2p.hpp"

#include <array>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"

namespace loom::python {
namespace {

// One buffer of a post, resolved with the GIL held.
struct Target {
  std::byte* data = nullptr;
  std::size_t size = 0;
  MemoryType type = MemoryType::kHost;
  int device = 0;
  std::optional<MemoryRegion> region;  // a context region holding it; none: registered for the post
};

// Resolves the buffers of one call; the same object given again in a row is resolved once.
class Resolver {
 public:
  Resolver(Ops& ops, ContextState& context, bool writable)
      : ops_(ops), context_(context), writable_(writable) {}

  Target get(py::handle object) {
    if (object.ptr() == last_) return last_target_;
    last_target_ = resolve(object);
    last_ = object.ptr();
    return last_target_;
  }

 private:
  Target resolve(py::handle object) {
    if (py::isinstance<RegionState>(object)) {
      auto region = object.cast<std::shared_ptr<RegionState>>();
      if (region->context().get() != &context_) raise_invalid("a region of another context");
      const MemoryRegion& handle = region->handle();
      const HeldBuffer& buffer = region->buffer();
      if (writable_ && buffer.readonly()) raise_invalid("a read-only region cannot receive data");
      Target target{buffer.data(), buffer.size(), buffer.type(), buffer.device(), handle};
      ops_.keep(std::move(region));
      return target;
    }
    HeldBuffer held = HeldBuffer::acquire(object, writable_);
    Target target{held.data(), held.size(), held.type(), held.device(), std::nullopt};
    if (const MemoryRegion* region =
            context_.find(held.data(), held.size(), held.type(), held.device())) {
      target.region = *region;
    }
    ops_.keep(std::move(held));
    return target;
  }

  Ops& ops_;
  ContextState& context_;
  bool writable_;
  PyObject* last_ = nullptr;
  Target last_target_;
};

// Regions registered on the communicator for one post, for memory no context region holds:
// deregistered when the post returns (loom keeps each until the requests using it ended).
class TemporaryRegions {
 public:
  explicit TemporaryRegions(Communicator& comm) : comm_(comm) {}
  ~TemporaryRegions() {
    for (const MemoryRegion& region : made_) comm_.deregister(region);
  }
  TemporaryRegions(const TemporaryRegions&) = delete;
  TemporaryRegions& operator=(const TemporaryRegions&) = delete;

  // Throws loom::Error where the provider refuses the registration.
  MemoryRegion get(const Target& target) {
    if (target.region) return *target.region;
    if (target.size == 0) return {};
    return made_.emplace_back(
        comm_.register_memory(target.data, target.size, target.type, target.device));
  }

 private:
  Communicator& comm_;
  std::vector<MemoryRegion> made_;
};

// An int, or anything with __index__ (numpy integers).
bool is_integer(py::handle object) {
  return PyIndex_Check(object.ptr()) != 0;
}

Tag to_tag(py::handle object) {
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(object.ptr()));
  if (!index) throw py::error_already_set();
  const unsigned long long value = PyLong_AsUnsignedLongLong(index.ptr());
  if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (value > std::numeric_limits<Tag>::max()) throw py::value_error("a tag is 32 bits");
  return static_cast<Tag>(value);
}

// `tags`: one int for every message, or one per message.
std::vector<Tag> to_tags(py::handle tags, std::size_t count) {
  if (is_integer(tags)) return std::vector<Tag>(count, to_tag(tags));
  const py::list list = as_list(tags, "tags");
  if (list.size() != count) {
    raise_invalid(std::to_string(count) + " buffers and " + std::to_string(list.size()) + " tags");
  }
  std::vector<Tag> result;
  result.reserve(count);
  for (py::handle tag : list) result.push_back(to_tag(tag));
  return result;
}

// kRetry for a call whose `count` posts do not all fit: nothing of it is posted.
bool fits(OpOwner& self, std::size_t count, Outcome& outcome) {
  if (self.in_flight + count <= kMaxRequestsPerComm) return true;
  outcome.status = Status::kRetry;
  outcome.message = std::to_string(count) + " more requests do not fit beside the " +
                    std::to_string(self.in_flight) + " in flight (a communicator keeps " +
                    std::to_string(kMaxRequestsPerComm) + "); finish some first";
  return false;
}

py::object isend(const std::shared_ptr<SendCommState>& self, py::handle buffer, Tag tag) {
  auto ops = std::make_unique<Ops>(self);
  const Target target = Resolver(*ops, *self->context(), false).get(buffer);
  ops->add_entry(1);
  ops = run_post(*self, std::move(ops), [&](Outcome& outcome, Ops& posting) {
    SendComm& comm = self->send_locked();
    TemporaryRegions temporary(comm);
    const Posted posted = comm.isend(target.data, target.size, tag, temporary.get(target));
    if (posted.status != Status::kOk) {
      outcome.status = posted.status;
      outcome.message = comm.last_error();
      return;
    }
    posting.set_request(0, posted.request);
    outcome.posted = 1;
  });
  return make_request(std::move(ops));
}

// isend_many and irecv_many: one request per buffer, all posted in one call or none.
// `post_one(target, tag, region)` posts one (under the communicator's lock, as run_post holds
// it); `what` names a failed one ("message 3: ...").
template <typename State, typename PostOne>
py::object post_many(const std::shared_ptr<State>& self, py::handle buffers, py::handle tags,
                     bool writable, const char* what, PostOne&& post_one) {
  const py::list list = as_list(buffers, "buffers");
  const std::vector<Tag> tag_list = to_tags(tags, list.size());
  auto ops = std::make_unique<Ops>(self);
  ops->reserve(list.size(), list.size());
  std::vector<Target> targets;
  targets.reserve(list.size());
  Resolver resolver(*ops, *self->context(), writable);
  for (py::handle buffer : list) {
    targets.push_back(resolver.get(buffer));
    ops->add_entry(1);
  }
  ops = run_post(*self, std::move(ops), [&](Outcome& outcome, Ops& posting) {
    if (!fits(*self, targets.size(), outcome)) return;
    Communicator& comm = self->comm_locked();
    TemporaryRegions temporary(comm);
    for (std::size_t i = 0; i < targets.size(); ++i) {
      const Posted posted = post_one(targets[i], tag_list[i], temporary.get(targets[i]));
      if (posted.status != Status::kOk) {
        outcome.status = posted.status;
        outcome.message = std::string(what) + " " + std::to_string(i) + ": " + comm.last_error();
        return;
      }
      posting.set_request(i, posted.request);
      outcome.posted = i + 1;
    }
  });
  return make_requests(std::move(ops));
}

py::object isend_many(const std::shared_ptr<SendCommState>& self, py::handle buffers,
                      py::handle tags) {
  return post_many(self, buffers, tags, false, "message",
                   [&](const Target& t, Tag tag, MemoryRegion region) {
                     return self->send_locked().isend(t.data, t.size, tag, region);
                   });
}

// The receive buffers of one irecv (or iflush): `buffers` one object and `tags` an int, or
// sequences of the same length.
std::vector<Target> receive_targets(Ops& ops, ContextState& context, py::handle buffers,
                                    std::vector<Tag>& tags, py::handle tag_object) {
  std::vector<Target> targets;
  Resolver resolver(ops, context, true);
  if (is_integer(tag_object)) {
    targets.push_back(resolver.get(buffers));
    tags.assign(1, to_tag(tag_object));
    return targets;
  }
  const py::list list = as_list(buffers, "buffers");
  if (list.empty() || list.size() > kMaxRecvBuffers) {
    raise_invalid("an irecv takes 1 to " + std::to_string(kMaxRecvBuffers) + " buffers, not " +
                  std::to_string(list.size()));
  }
  tags = to_tags(tag_object, list.size());
  for (py::handle buffer : list) targets.push_back(resolver.get(buffer));
  return targets;
}

template <typename Call>
py::object post_receive(const std::shared_ptr<RecvCommState>& self, py::handle buffers,
                        py::handle tags, Call&& call) {
  auto ops = std::make_unique<Ops>(self);
  std::vector<Tag> tag_list;
  const std::vector<Target> targets =
      receive_targets(*ops, *self->context(), buffers, tag_list, tags);
  ops->add_entry(targets.size());
  ops = run_post(*self, std::move(ops), [&](Outcome& outcome, Ops& posting) {
    RecvComm& comm = self->recv_locked();
    TemporaryRegions temporary(comm);
    std::array<RecvBuffer, kMaxRecvBuffers> posted_buffers;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      posted_buffers[i] = {targets[i].data, targets[i].size, tag_list[i],
                           temporary.get(targets[i])};
    }
    const Posted posted = call(comm, std::span(posted_buffers.data(), targets.size()));
    if (posted.status != Status::kOk) {
      outcome.status = posted.status;
      outcome.message = comm.last_error();
      return;
    }
    posting.set_request(0, posted.request);
    outcome.posted = 1;
  });
  return make_request(std::move(ops));
}

py::object irecv_many(const std::shared_ptr<RecvCommState>& self, py::handle buffers,
                      py::handle tags) {
  return post_many(self, buffers, tags, true, "receive",
                   [&](const Target& t, Tag tag, MemoryRegion region) {
                     const RecvBuffer buffer{t.data, t.size, tag, region};
                     return self->recv_locked().irecv({&buffer, 1});
                   });
}

// Calls `f(comm)` under the communicator's mutex without the GIL; ClosedError once it is closed.
template <typename F>
auto with_comm(CommState& self, F&& f) {
  std::optional<std::invoke_result_t<F, Communicator&>> result;
  without_gil([&] {
    std::lock_guard lock(self.mutex);
    if (self.open_locked()) result.emplace(f(self.comm_locked()));
  });
  if (!result) raise_closed("the communicator");
  return std::move(*result);
}

py::dict comm_stats(CommState& self) {
  const CommStats stats = with_comm(self, [](Communicator& c) { return c.stats(); });
  py::dict d;
  d["messages"] = stats.messages;
  d["bytes"] = stats.bytes;
  d["eager"] = stats.eager;
  d["eager_fragmented"] = stats.eager_fragmented;
  d["rendezvous"] = stats.rendezvous;
  d["control_pushed_back"] = stats.control_pushed_back;
  d["lane_id"] = stats.lane_id;
  d["lane_comms"] = stats.lane_comms;
  d["data_nics"] = stats.data_nics;
  return d;
}

template <typename State>
void bind_common(py::class_<State, std::shared_ptr<State>>& cls) {
  cls.def("close", &State::close,
          "Closes the communicator (loom's Communicator::close: pending requests are cancelled "
          "and raise loom.CancelledError; the peer's fail with loom.PeerError). Idempotent; "
          "blocks about a round trip, at most LOOM_PEER_TIMEOUT_MS, with the GIL released.")
      .def_property_readonly("closed",
                             [](State& self) {
                               std::unique_lock lock = self.lock();
                               return !self.open_locked();
                             })
      .def(
          "stats", [](State& self) { return comm_stats(self); },
          "Counters: messages, bytes, eager, rendezvous, lane_id, lane_comms, data_nics.")
      .def_property_readonly(
          "label",
          [](State& self) { return with_comm(self, [](Communicator& c) { return c.label(); }); },
          "The label the connecting side gave Context.connect (0 if none), the same at both "
          "ends: which peer an accepted communicator is.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](State& self, const py::args&) {
        self.close();
        return false;
      });
}

}  // namespace

CommState::~CommState() {
  close();
}

void CommState::close() {
  std::vector<std::unique_ptr<Ops>> ended;  // their memory is ours again: dropped with the GIL
  without_gil([&] {
    std::lock_guard lock(mutex);
    std::unique_ptr<Communicator> comm = std::move(comm_);
    if (comm != nullptr) comm->close();
    forget_locked(ended);
  });
}

py::object wrap_send_comm(const std::shared_ptr<ContextState>& context,
                          std::unique_ptr<SendComm> comm) {
  auto state = std::make_shared<SendCommState>(context, std::move(comm));
  context->adopt(state);
  return py::cast(state);
}

py::object wrap_recv_comm(const std::shared_ptr<ContextState>& context,
                          std::unique_ptr<RecvComm> comm) {
  auto state = std::make_shared<RecvCommState>(context, std::move(comm));
  context->adopt(state);
  return py::cast(state);
}

void bind_p2p(py::module_& module) {
  py::class_<SendCommState, std::shared_ptr<SendCommState>> send(
      module, "SendComm",
      "The sending end of a communicator (Connector.wait). Messages land in the receives the "
      "peer posts, in order; each must carry its buffer's tag.");
  bind_common(send);
  send.def("isend", &isend, py::arg("buffer"), py::arg("tag"),
           "Posts `buffer` (an object with the buffer protocol, a CUDA array, or a loom.Region) "
           "and returns a loom.Request. Memory of a context region (Context.register_memory) "
           "goes as it is; other memory is registered for this message alone. Raises "
           "loom.RetryError with 128 requests in flight, loom.InvalidError for a message larger "
           "than the NICs take, loom.ClosedError, loom.PeerError.")
      .def("isend_many", &isend_many, py::arg("buffers"), py::arg("tags"),
           "Posts one message per buffer of `buffers` (tags: one int for all, or one each) in "
           "one call and returns them as a loom.Requests. Nothing is posted when they do not "
           "all fit in the communicator's 128 requests (loom.RetryError).");

  py::class_<RecvCommState, std::shared_ptr<RecvCommState>> recv(
      module, "RecvComm", "The receiving end of a communicator (Listener.accept).");
  bind_common(recv);
  recv.def(
          "irecv",
          [](const std::shared_ptr<RecvCommState>& self, py::handle buffers, py::handle tags) {
            return post_receive(self, buffers, tags,
                                [](RecvComm& comm, auto span) { return comm.irecv(span); });
          },
          py::arg("buffers"), py::arg("tags"),
          "Posts a receive and returns a loom.Request. `buffers` one writable buffer and `tags` "
          "an int, or up to 8 buffers and as many tags: a grouped receive that takes the next "
          "as many messages, each into the buffer whose tag is its own. Request.sizes gives "
          "what each buffer got. A message larger than its buffer fails on both sides "
          "(loom.TruncatedError). A read-only buffer raises loom.InvalidError.")
      .def("irecv_many", &irecv_many, py::arg("buffers"), py::arg("tags"),
           "Posts one receive of one buffer per element of `buffers` (tags: one int for all, or "
           "one each) in one call; a loom.Requests. All or nothing, as isend_many.")
      .def(
          "iflush",
          [](const std::shared_ptr<RecvCommState>& self, py::handle buffers) {
            py::object tags = py::int_(0);  // one buffer
            if (PyList_Check(buffers.ptr()) != 0 || PyTuple_Check(buffers.ptr()) != 0) {
              py::list zeros;
              for (std::size_t i = 0; i < py::len(buffers); ++i) zeros.append(0);
              tags = zeros;
            }
            return post_receive(self, buffers, tags,
                                [](RecvComm& comm, auto span) { return comm.iflush(span); });
          },
          py::arg("buffers"),
          "Makes what was received into `buffers` (one, or a list) visible to the GPU "
          "(GPUDirect RDMA); a loom.Request. Done at its first test for host memory.");
}

}  // namespace loom::python
