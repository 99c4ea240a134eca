#include "errors.hpp"

#include <array>
#include <utility>

namespace loom::python {
namespace {

// Created once at import; the module keeps a reference to each.
struct Classes {
  PyObject* error = nullptr;
  PyObject* invalid = nullptr;
  PyObject* closed = nullptr;
  PyObject* retry = nullptr;
  PyObject* truncated = nullptr;
  PyObject* cancelled = nullptr;
  PyObject* peer = nullptr;
  PyObject* provider = nullptr;
};
Classes classes;

PyObject* make_class(py::module_& module, const char* name, const char* doc,
                     std::initializer_list<PyObject*> bases) {
  py::tuple base_tuple(bases.size());
  std::size_t i = 0;
  for (PyObject* base : bases) base_tuple[i++] = py::reinterpret_borrow<py::object>(base);
  const std::string qualified = std::string("loom.") + name;
  PyObject* cls =
      PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base_tuple.ptr(), /*dict=*/nullptr);
  if (cls == nullptr) throw py::error_already_set();
  module.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;
}

PyObject* class_for(Status status) {
  switch (status) {
    case Status::kInvalid:
      return classes.invalid;
    case Status::kRetry:
      return classes.retry;
    case Status::kTruncated:
      return classes.truncated;
    case Status::kCancelled:
      return classes.cancelled;
    case Status::kPeerError:
      return classes.peer;
    default:
      return classes.provider;
  }
}

[[noreturn]] void raise(PyObject* cls, Status status, const std::string& message,
                        const Error* setup = nullptr) {
  py::object instance = py::reinterpret_borrow<py::object>(cls)(message);
  instance.attr("status") = py::cast(status);
  instance.attr("message") = message;
  instance.attr("operation") = setup != nullptr ? py::cast(setup->operation()) : py::none();
  instance.attr("provider") = setup != nullptr ? py::cast(setup->provider()) : py::none();
  instance.attr("code") = setup != nullptr ? setup->code() : 0;
  PyErr_SetObject(cls, instance.ptr());
  throw py::error_already_set();
}

}  // namespace

void bind_errors(py::module_& module) {
  py::enum_<Status>(module, "Status", "What a loom call came to (loom::Status).")
      .value("OK", Status::kOk)
      .value("IN_PROGRESS", Status::kInProgress)
      .value("RETRY", Status::kRetry)
      .value("TRUNCATED", Status::kTruncated)
      .value("CANCELLED", Status::kCancelled)
      .value("INVALID", Status::kInvalid)
      .value("PEER_ERROR", Status::kPeerError)
      .value("ERROR", Status::kError);

  classes.error =
      make_class(module, "Error",
                 "A loom call failed. `status` (loom.Status) says how, `message` is "
                 "loom's explanation; errors of setup calls also carry `operation`, "
                 "`provider` and `code` (a libfabric or errno value, 0 for loom's own).",
                 {PyExc_Exception});
  classes.invalid = make_class(module, "InvalidError",
                               "Status.INVALID: a bad argument (unregistered or read-only buffer, "
                               "too many buffers, a corrupt handle or descriptor).",
                               {classes.error, PyExc_ValueError});
  classes.closed =
      make_class(module, "ClosedError", "The object, or the context it came from, is closed.",
                 {classes.invalid});
  classes.retry = make_class(module, "RetryError",
                             "Status.RETRY: too many requests in flight; finish some and retry.",
                             {classes.error});
  classes.truncated = make_class(module, "TruncatedError",
                                 "Status.TRUNCATED: a message larger than its receive buffer "
                                 "(it fails on both sides and writes nothing).",
                                 {classes.error});
  classes.cancelled =
      make_class(module, "CancelledError",
                 "Status.CANCELLED: the request's communicator was closed.", {classes.error});
  classes.peer = make_class(module, "PeerError",
                            "Status.PEER_ERROR: the peer closed, failed, refused, or was silent "
                            "for LOOM_PEER_TIMEOUT_MS.",
                            {classes.error, PyExc_ConnectionError});
  classes.provider = make_class(module, "ProviderError",
                                "Status.ERROR: the provider failed an operation, or a setup call "
                                "(opening NICs, registering memory) failed.",
                                {classes.error});
  // Class-level defaults, so that an instance made by Python code has them too.
  for (PyObject* cls : {classes.error, classes.invalid, classes.closed, classes.retry,
                        classes.truncated, classes.cancelled, classes.peer, classes.provider}) {
    py::handle handle(cls);
    handle.attr("status") = py::cast(cls == classes.error ? Status::kError : Status::kOk);
    handle.attr("message") = "";
    handle.attr("operation") = py::none();
    handle.attr("provider") = py::none();
    handle.attr("code") = 0;
  }
  const std::array<std::pair<PyObject*, Status>, 7> defaults{{
      {classes.invalid, Status::kInvalid},
      {classes.closed, Status::kInvalid},
      {classes.retry, Status::kRetry},
      {classes.truncated, Status::kTruncated},
      {classes.cancelled, Status::kCancelled},
      {classes.peer, Status::kPeerError},
      {classes.provider, Status::kError},
  }};
  for (const auto& [cls, status] : defaults) py::handle(cls).attr("status") = py::cast(status);

  py::register_exception_translator([](std::exception_ptr thrown) {
    if (!thrown) return;
    try {
      std::rethrow_exception(thrown);
    } catch (const Error& e) {
      try {
        raise(classes.provider, Status::kError, e.what(), &e);
      } catch (py::error_already_set& set) {
        set.restore();
      }
    }
  });
}

void raise_status(Status status, const std::string& message) {
  raise(class_for(status), status, message);
}

void raise_invalid(const std::string& message) {
  raise(classes.invalid, Status::kInvalid, message);
}

void raise_closed(const std::string& what) {
  raise(classes.closed, Status::kInvalid, what + " is closed");
}

void raise_setup(const Error& error, SetupFault fault) {
  switch (fault) {
    case SetupFault::kArgument:
      raise(classes.invalid, Status::kInvalid, error.what(), &error);
    case SetupFault::kPeer:
      raise(classes.peer, Status::kPeerError, error.what(), &error);
    case SetupFault::kProvider:
      break;
  }
  raise(classes.provider, Status::kError, error.what(), &error);
}

}  // namespace loom::python
