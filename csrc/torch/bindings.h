// Registers the per-operation tensor bindings (enqueue_*, wait) on the _C module.
#pragma once

#include <pybind11/pybind11.h>

namespace hvdl {
void RegisterTorchOps(pybind11::module_& m);
}
