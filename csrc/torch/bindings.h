// Registers the per-operation tensor bindings (enqueue_*, wait) on the _C module.
//
// The bindings do not own or find the runtime: the module that registers them says where the
// running Context and the process's HandleTable are (python/module.cc), so this folder and
// csrc/python never include each other's headers the other way round.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>

#include "core/context.h"
#include "core/handle_table.h"

namespace hvdl {

struct TorchOpsHost {
  // The running Context; throws ArgumentError (HorovodArgumentError) before init.
  std::function<Context&()> context;
  // The process's handle table (outlives every Context).
  HandleTable* handles = nullptr;
};

void RegisterTorchOps(pybind11::module_& m, TorchOpsHost host);

}  // namespace hvdl
