// The `loom` extension module: loom's two-sided and one-sided API for Python buffers.
#include <pybind11/pybind11.h>

#include "context.hpp"
#include "errors.hpp"
#include "ops.hpp"
#include "p2p.hpp"
#include "rma.hpp"

namespace py = pybind11;

namespace {

// Debian's libfabric links the psm providers' libinfinipath, whose constructor (run when this
// module loaded libloom) installs its own handlers for SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL
// and SIGABRT: Ctrl-C then ended the interpreter with status 1 instead of raising
// KeyboardInterrupt, and faulthandler lost its hooks. Python's handlers go back (only the main
// thread may set them: imported elsewhere, they stay as libinfinipath left them).
void restore_python_signal_handlers() {
  try {
    const py::module_ signal = py::module_::import("signal");
    for (const char* name : {"SIGINT", "SIGTERM", "SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT"}) {
      const py::object number = signal.attr(name);
      const py::object handler = signal.attr("getsignal")(number);
      if (!handler.is_none()) signal.attr("signal")(number, handler);  // none: not Python's
    }
    const py::module_ faulthandler = py::module_::import("faulthandler");
    if (faulthandler.attr("is_enabled")().cast<bool>()) faulthandler.attr("enable")();
  } catch (py::error_already_set&) {
    // Not the main thread: signal.signal refuses.
  }
}

}  // namespace

PYBIND11_MODULE(loom, module) {
  using namespace loom;
  using namespace loom::python;
  module.doc() =
      "loom: tagged two-sided messages and one-sided batches over libfabric, moving any object "
      "with the buffer protocol (numpy arrays, bytearray, memoryview) and, in a CUDA build, "
      "CUDA arrays (__cuda_array_interface__, __dlpack__). Blocking calls release the GIL.";
  module.attr("__version__") = LOOM_PY_VERSION;
  module.attr("MAX_RECV_BUFFERS") = kMaxRecvBuffers;
  module.attr("MAX_REQUESTS_PER_COMM") = kMaxRequestsPerComm;
  module.attr("MAX_HANDLE_BYTES") = kMaxHandleBytes;
  module.attr("MAX_REGION_DESCRIPTOR_BYTES") = kMaxRegionDescriptorBytes;

  restore_python_signal_handlers();
  bind_errors(module);
  bind_ops(module);
  bind_context(module);
  bind_p2p(module);
  bind_rma(module);

  module.def(
      "config_variables",
      [] {
        py::list rows;
        for (const ConfigVariable& v : config_variables()) {
          rows.append(py::make_tuple(std::string(v.name), std::string(v.default_value),
                                     std::string(v.doc)));
        }
        return rows;
      },
      "Every LOOM_* variable as (name, default, doc); Context(x=...) sets LOOM_X.");
  module.def(
      "recommended_provider_settings",
      [](const py::kwargs& kwargs) {
        py::list rows;
        for (const ProviderSetting& s : recommended_provider_settings(make_config(kwargs))) {
          rows.append(py::make_tuple(s.name, s.value, s.why));
        }
        return rows;
      },
      "The provider parameters (environment variables) loom recommends for the configuration "
      "the keywords and environment give, as (name, value, why): set those the environment "
      "lacks before the first Context, as fi_p2p_bw does (loom never writes the environment).");
  module.def("remove_process_leftovers", &remove_process_leftovers, py::arg("pid"),
             "For a supervisor whose loom process was killed: removes what it left on this host "
             "(shm's regions in /dev/shm). Call it after the process was reaped; returns how "
             "many objects it removed.");
}
