// loom's exceptions in Python: loom.Error and one subclass per way a call fails, each carrying
// loom's Status and message. Argument errors that are not loom's (an object that is no buffer at
// all) stay Python's TypeError.
#pragma once

#include <string>

#include <pybind11/pybind11.h>

#include "loom/error.hpp"

namespace loom::python {

namespace py = pybind11;

// Defines loom.Error, its subclasses and loom.Status on the module, and translates loom::Error
// (thrown by setup calls) into loom.ProviderError wherever a binding lets it through.
void bind_errors(py::module_& module);

// Raises the subclass for `status` (kInvalid: InvalidError, kPeerError: PeerError, ...) with
// loom's message. The GIL must be held.
[[noreturn]] void raise_status(Status status, const std::string& message);
// InvalidError: a bad argument loom refused, or that the binding refuses before calling loom.
[[noreturn]] void raise_invalid(const std::string& message);
// ClosedError (an InvalidError): the object, or what it came from, was closed.
[[noreturn]] void raise_closed(const std::string& what);
// A loom::Error from a setup call, as InvalidError (bad argument), PeerError or ProviderError.
enum class SetupFault { kArgument, kPeer, kProvider };
[[noreturn]] void raise_setup(const Error& error, SetupFault fault);

}  // namespace loom::python
