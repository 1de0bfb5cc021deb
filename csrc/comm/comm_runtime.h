// CommRuntime: what a launch's communication layer hands the core. The composition root
// (csrc/runtime) builds it - control plane, collective backends, device operations, fault
// tolerance hooks - and passes it to Context::Create; the core sees only these interfaces.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/allreduce_planner.h"
#include "comm/backend_registry.h"
#include "comm/control_plane.h"
#include "comm/device_ops.h"
#include "comm/fabric.h"

namespace hvdl {

struct Topology {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  bool thread_multiple = false;
  bool homogeneous = true;  // every node runs local_size ranks
};

// Members are destroyed in reverse order: the world last, the planner first.
struct CommRuntime {
  Topology topology;
  std::shared_ptr<void> owner;  // keeps the transport's world (communicators) alive
  std::unique_ptr<ControlPlane> control;
  std::unique_ptr<Fabric> fabric;  // the transports per process set (null: none)
  std::unique_ptr<DataBackend> natives;  // the transport family's own collectives (null: none)
  std::unique_ptr<DeviceOps> device_ops;  // device builds; outlives the backends
  // Behind a pointer: the planner and the backends point at it and at each other, and the runtime
  // moves into the Context.
  std::unique_ptr<BackendRegistry> backends = std::make_unique<BackendRegistry>();
  std::unique_ptr<AllreducePlanner> planner;
  // Fault tolerance (a transport that survives lost ranks; both empty otherwise). Background
  // thread. `peer_failed`: a communication call reported failed ranks. `recover`: agree with
  // the survivors on who is left and keep them for the next init; *what says who was lost, in
  // one line.
  std::function<bool()> peer_failed;
  std::function<Status(std::string*)> recover;
  // Watching the job's peers where no launcher does (may be empty): called once the Context
  // runs; the watcher calls `lost(why)` from a thread of its own when ranks are gone.
  std::function<void(std::function<void(const std::string& why)> lost)> watch;
  // Stops the watcher (blocking); the Context calls it before it is destroyed.
  std::function<void()> stop_watching;
  // Any thread (Context::Abort): ends every wait of the transports early with `why`.
  std::function<void(const std::string& why)> cancel;
  // After losing ranks, this process may start a new runtime: the transport's next world does
  // not count the lost ones (the Gloo controller meets in a fresh rendezvous round). MPI's
  // world does count them until MPI_Finalize, so there a lost rank ends horovodlite here.
  bool restartable_after_loss = false;
};

}  // namespace hvdl
