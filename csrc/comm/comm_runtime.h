// CommRuntime: what a launch's communication layer hands the core. The composition root
// (csrc/runtime) builds it - control plane, collective backends, device operations, fault
// tolerance hooks - and passes it to Context::Create; the core sees only these interfaces.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/backend_registry.h"
#include "comm/control_plane.h"
#include "comm/device_ops.h"

namespace hvdl {

struct Topology {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  bool thread_multiple = false;
  bool homogeneous = true;  // every node runs local_size ranks
};

struct CommRuntime {
  Topology topology;
  std::unique_ptr<ControlPlane> control;
  std::unique_ptr<DeviceOps> device_ops;  // device builds; declared first: outlives the backends
  BackendRegistry backends;
  std::shared_ptr<void> owner;  // keeps the transport's world (communicators) alive
  // Fault tolerance (a transport that survives lost ranks; both empty otherwise). Background
  // thread. `peer_failed`: a communication call reported failed ranks. `recover`: agree with
  // the survivors on who is left and keep them for the next init; *what says who was lost, in
  // one line.
  std::function<bool()> peer_failed;
  std::function<Status(std::string*)> recover;
};

}  // namespace hvdl
