// loom.Context and what it opens directly: regions, listeners, connectors.
#pragma once

#include <pybind11/pybind11.h>

#include "loom/loom.hpp"

namespace loom::python {

namespace py = pybind11;

// The LOOM_* environment variables, overridden by keywords named after them (data_rails=2 for
// LOOM_DATA_RAILS). Raises TypeError for an unknown keyword, InvalidError for a bad value.
Config make_config(const py::kwargs& kwargs);

void bind_context(py::module_& module);

}  // namespace loom::python
