// loom.Context, loom.Region, loom.Listener and the connectors (loom.Connector,
// loom.RmaConnector).
#include "context.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"
#include "p2p.hpp"
#include "rma.hpp"

namespace loom::python {
namespace {

bool known_variable(std::string_view name) {
  const auto variables = config_variables();
  return std::any_of(variables.begin(), variables.end(),
                     [&](const ConfigVariable& v) { return v.name == name; });
}

std::string config_text(py::handle value, const std::string& key) {
  if (PyBool_Check(value.ptr())) return value.ptr() == Py_True ? "1" : "0";
  if (PyLong_Check(value.ptr()) || PyUnicode_Check(value.ptr())) return py::str(value);
  if (PyList_Check(value.ptr()) || PyTuple_Check(value.ptr())) {
    std::string text;
    for (py::handle item : value) text += (text.empty() ? "" : ",") + std::string(py::str(item));
    return text;
  }
  throw py::type_error("config " + key + ": a bool, int, str, or list of str, not " +
                       Py_TYPE(value.ptr())->tp_name);
}

}  // namespace

Config make_config(const py::kwargs& kwargs) {
  // The environment's LOOM_* variables (what Config::from_env reads), then the keywords.
  std::map<std::string, std::string, std::less<>> values;
  const py::object environ = py::module_::import("os").attr("environ");
  for (const py::handle item : environ.attr("items")()) {
    const std::string name = py::str(item[py::int_(0)]);
    if (name.starts_with("LOOM_")) values[name] = py::str(item[py::int_(1)]);
  }
  for (const auto& [key_object, value] : kwargs) {
    const std::string key = py::str(key_object);
    std::string name = "LOOM_" + key;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::toupper(c); });
    if (!known_variable(name)) {
      throw py::type_error("unknown config keyword '" + key +
                           "' (loom.config_variables() lists them: LOOM_X is x=)");
    }
    if (value.is_none()) {
      values.erase(name);  // its default
    } else {
      values[name] = config_text(value, key);
    }
  }
  try {
    return Config::from_values(values);
  } catch (const Error& e) {
    raise_setup(e, SetupFault::kArgument);
  }
}

namespace {

std::vector<std::byte> handle_bytes(py::handle object) {
  Py_buffer view{};
  if (PyObject_GetBuffer(object.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  const auto* data = static_cast<const std::byte*>(view.buf);
  std::vector<std::byte> bytes(data, data + view.len);
  PyBuffer_Release(&view);
  return bytes;
}

Handle to_handle(py::handle object) {
  const std::vector<std::byte> bytes = handle_bytes(object);
  try {
    return Handle::from_bytes(bytes);
  } catch (const Error& e) {
    raise_setup(e, SetupFault::kArgument);
  }
}

class ListenerState final : public Closable {
 public:
  ListenerState(std::shared_ptr<ContextState> context, Listener listener)
      : context_(std::move(context)), listener_(std::move(listener)) {
    const auto view = listener_->handle().view();
    handle_.assign(reinterpret_cast<const char*>(view.data()), view.size());
  }
  ~ListenerState() override { close(); }

  void close() override {
    without_gil([&] {
      std::lock_guard lock(mutex_);
      if (listener_) listener_->close();
      listener_.reset();
    });
  }
  [[nodiscard]] py::bytes handle() const { return {handle_.data(), handle_.size()}; }

  // Listener::accept or accept_rma until one gives something or `timeout` passed (None).
  template <typename Accept, typename Wrap>
  py::object accept(std::optional<double> timeout, Accept&& accept, Wrap&& wrap) {
    decltype(accept(*listener_)) made;
    bool closed = false;
    wait_for(
        [&] {
          std::lock_guard lock(mutex_);
          if (!listener_) {
            closed = true;
            return StepResult{.done = true};
          }
          made = accept(*listener_);
          return StepResult{.done = made != nullptr};
        },
        timeout);
    if (closed) raise_closed("the listener");
    if (made == nullptr) return py::none();
    return wrap(context_, std::move(made));
  }

  [[nodiscard]] bool closed() {
    std::lock_guard lock(mutex_);  // never held long: taken with the GIL
    return !listener_;
  }

 private:
  std::shared_ptr<ContextState> context_;
  std::mutex mutex_;
  std::optional<Listener> listener_;  // under mutex_; none once closed
  std::string handle_;
};

// Connector and RmaConnector: poll() until the listener's side accepted.
template <typename LoomConnector>
class ConnectorState final : public Closable {
 public:
  ConnectorState(std::shared_ptr<ContextState> context, LoomConnector connector)
      : context_(std::move(context)), connector_(std::move(connector)) {}
  ~ConnectorState() override { close(); }
  void close() override {
    without_gil([&] {
      std::lock_guard lock(mutex_);
      connector_.reset();
    });
  }

  // One poll (timeout 0) or polls until made or `timeout` (None: no limit) passed.
  template <typename Wrap>
  py::object wait(std::optional<double> timeout, Wrap&& wrap) {
    decltype(connector_->poll()) made;
    std::optional<Error> failure;
    bool closed = false;
    const auto step = [&] {
      std::lock_guard lock(mutex_);
      if (!connector_) {
        closed = true;
        return StepResult{.done = true};
      }
      try {
        made = connector_->poll();
      } catch (const Error& e) {
        failure = e;
        return StepResult{.done = true};
      }
      return StepResult{.done = made != nullptr};
    };
    if (timeout && *timeout <= 0) {
      without_gil(step);
    } else {
      wait_for(step, timeout);
    }
    if (closed) raise_closed(taken_ ? "the connector (it made its connection)" : "the connector");
    if (failure) raise_setup(*failure, SetupFault::kPeer);
    if (made == nullptr) return py::none();
    taken_ = true;
    close();  // it made what it was for
    return wrap(context_, std::move(made));
  }

 private:
  std::shared_ptr<ContextState> context_;
  std::mutex mutex_;
  std::optional<LoomConnector> connector_;  // under mutex_; none once closed
  bool taken_ = false;
};

using P2pConnector = ConnectorState<Connector>;
using OneSidedConnector = ConnectorState<RmaConnector>;

py::dict nic_dict(const NicDescription& nic) {
  py::dict d;
  d["name"] = nic.name;
  d["provider"] = nic.provider;
  d["fabric"] = nic.fabric;
  d["address"] = nic.address;
  d["endpoint_mr"] = nic.endpoint_mr;
  d["locality"] = nic.locality;
  d["device_memory"] = nic.device_memory;
  d["device_memory_note"] = nic.device_memory_note;
  d["link_speed_mbps"] = nic.link_speed_mbps;
  d["max_message_size"] = nic.max_message_size;
  d["eager_max"] = nic.eager_max;
  return d;
}

template <typename T>
void bind_closing(py::class_<T, std::shared_ptr<T>>& cls) {
  cls.def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](T& self, const py::args&) {
        self.close();
        return false;
      });
}

}  // namespace

void bind_context(py::module_& module) {
  py::class_<ContextState, std::shared_ptr<ContextState>> context(
      module, "Context",
      "Opens the NICs the configuration selects: the LOOM_* environment variables, overridden "
      "by keywords named after them (provider='tcp', nics=['lo'], data_rails=2, "
      "peer_timeout_ms=1000; None: the default). Closing it (close(), or leaving a `with` "
      "block) closes everything made from it.");
  context
      .def(py::init([](const py::kwargs& kwargs) {
        return std::make_shared<ContextState>(make_config(kwargs));
      }))
      .def(
          "listen",
          [](const std::shared_ptr<ContextState>& self) {
            const std::shared_ptr<Context> core = self->get();
            auto state =
                std::make_shared<ListenerState>(self, without_gil([&] { return core->listen(); }));
            self->adopt(state);
            return state;
          },
          "A loom.Listener; its .handle (bytes, at most 128) goes to peers by any means.")
      .def(
          "connect",
          [](const std::shared_ptr<ContextState>& self, py::handle handle, std::uint64_t label) {
            const Handle parsed = to_handle(handle);
            const std::shared_ptr<Context> core = self->get();
            std::optional<Connector> connector;
            try {
              connector.emplace(without_gil([&] { return core->connect(parsed, label); }));
            } catch (const Error& e) {
              raise_setup(e, SetupFault::kArgument);
            }
            auto state = std::make_shared<P2pConnector>(self, std::move(*connector));
            self->adopt(state);
            return state;
          },
          py::arg("handle"), py::arg("label") = 0,
          "Starts connecting to a listener's handle (bytes); Connector.wait() gives the "
          "loom.SendComm once the listener's side accepted. `label` (an unsigned 64-bit number, "
          "a rank say) is both communicators' .label: the accepting side learns who connected.")
      .def(
          "connect_rma",
          [](const std::shared_ptr<ContextState>& self, py::handle handle, std::uint64_t label) {
            const Handle parsed = to_handle(handle);
            const std::shared_ptr<Context> core = self->get();
            std::optional<RmaConnector> connector;
            try {
              connector.emplace(without_gil([&] { return core->connect_rma(parsed, label); }));
            } catch (const Error& e) {
              raise_setup(e, SetupFault::kArgument);
            }
            auto state = std::make_shared<OneSidedConnector>(self, std::move(*connector));
            self->adopt(state);
            return state;
          },
          py::arg("handle"), py::arg("label") = 0,
          "A one-sided connection to a listener (taken there with Listener.accept_rma); "
          "RmaConnector.wait() gives the loom.RmaInitiator. `label` as for connect.")
      .def(
          "register_memory",
          [](const std::shared_ptr<ContextState>& self, py::handle buffer) {
            HeldBuffer held = HeldBuffer::acquire(buffer, false);
            if (held.size() == 0) raise_invalid("an empty buffer cannot be registered");
            auto region = std::make_shared<RegionState>(self, std::move(held));
            self->adopt(region);
            return region;
          },
          py::arg("buffer"),
          "Registers `buffer` (buffer protocol, __cuda_array_interface__ or __dlpack__) once "
          "for every communicator and connection of this context and returns a loom.Region, "
          "which holds the memory (a bytearray cannot be resized meanwhile) until closed. "
          "Posts of memory inside it use it.")
      .def(
          "nics",
          [](const std::shared_ptr<ContextState>& self) {
            const std::shared_ptr<Context> core = self->get();
            py::list list;
            for (const NicDescription& nic : core->nics()) list.append(nic_dict(nic));
            return list;
          },
          "The context's NICs (dicts), closest first.")
      .def("close", &ContextState::close,
           "Closes every communicator, connection, listener and region made from it, then the "
           "context. Idempotent.")
      .def_property_readonly("closed", &ContextState::closed);
  bind_closing(context);

  py::class_<RegionState, std::shared_ptr<RegionState>> region(
      module, "Region",
      "Memory registered on a context (Context.register_memory). Pass it, or any buffer inside "
      "its memory, to isend/irecv; give it to one-sided blocks and RmaTarget.export_region.");
  region.def_property_readonly("nbytes", [](const RegionState& r) { return r.buffer().size(); })
      .def_property_readonly("readonly", [](const RegionState& r) { return r.buffer().readonly(); })
      .def_property_readonly("device",
                             [](const RegionState& r) -> py::object {
                               if (r.buffer().type() == MemoryType::kHost) return py::str("cpu");
                               return py::str("cuda:" + std::to_string(r.buffer().device()));
                             })
      .def_property_readonly("closed", [](const RegionState& r) { return !r.open(); })
      .def("close", &RegionState::close,
           "Deregisters it (revoking what targets exported: that waits for their initiators) "
           "and lets go of the memory once the requests using it ended. Idempotent.")
      .def("__repr__", [](const RegionState& r) {
        return "<loom.Region " + std::to_string(r.buffer().size()) + " bytes" +
               (r.open() ? "" : " closed") + ">";
      });
  bind_closing(region);

  py::class_<ListenerState, std::shared_ptr<ListenerState>> listener(
      module, "Listener", "Waits for peers that connect with its handle.");
  listener.def_property_readonly("handle", &ListenerState::handle)
      .def(
          "accept",
          [](ListenerState& self, std::optional<double> timeout) {
            return self.accept(
                timeout, [](Listener& l) { return l.accept(); }, &wrap_recv_comm);
          },
          py::arg("timeout") = py::none(),
          "The loom.RecvComm of the next peer that connected, waiting for one up to `timeout` "
          "seconds (None: no limit; 0: just look); None if none came.")
      .def(
          "accept_rma",
          [](ListenerState& self, std::optional<double> timeout) {
            return self.accept(
                timeout, [](Listener& l) { return l.accept_rma(); }, &wrap_target);
          },
          py::arg("timeout") = py::none(),
          "The loom.RmaTarget of the next initiator that connected with connect_rma, as "
          "accept().")
      .def("close", &ListenerState::close)
      .def_property_readonly("closed", &ListenerState::closed);
  bind_closing(listener);

  py::class_<P2pConnector, std::shared_ptr<P2pConnector>> connector(
      module, "Connector", "A connect in progress (Context.connect).");
  connector
      .def(
          "wait",
          [](P2pConnector& self, std::optional<double> timeout) {
            return self.wait(timeout, &wrap_send_comm);
          },
          py::arg("timeout") = py::none(),
          "The loom.SendComm once the listener's side accepted, waiting up to `timeout` "
          "seconds (None: no limit); None before. Raises loom.PeerError if the listener "
          "refused or nothing answered within LOOM_CONNECT_TIMEOUT_MS.")
      .def(
          "poll", [](P2pConnector& self) { return self.wait(0.0, &wrap_send_comm); },
          "wait(timeout=0).")
      .def("close", &P2pConnector::close);
  bind_closing(connector);

  py::class_<OneSidedConnector, std::shared_ptr<OneSidedConnector>> rma_connector(
      module, "RmaConnector", "A one-sided connect in progress (Context.connect_rma).");
  rma_connector
      .def(
          "wait",
          [](OneSidedConnector& self, std::optional<double> timeout) {
            return self.wait(timeout, &wrap_initiator);
          },
          py::arg("timeout") = py::none(),
          "The loom.RmaInitiator once the listener's side accepted, as Connector.wait.")
      .def("poll", [](OneSidedConnector& self) { return self.wait(0.0, &wrap_initiator); })
      .def("close", &OneSidedConnector::close);
  bind_closing(rma_connector);
}

}  // namespace loom::python
