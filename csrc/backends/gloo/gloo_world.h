// The controller without MPI, on torch's own engine: the world of a launch that torchrun, Ray,
// Spark, Slurm or `horovodliterun --gloo` started. Python (horovodlite/common/rendezvous.py) meets
// the other ranks through a c10d store, creates the job's Gloo process group over it and registers
// it under a name; BuildGloo resolves that group from C++ (c10d::resolve_process_group) and builds
// the runtime on it. Inside a host the ranks talk through what the composition root gives
// (LocalParts below: shared memory, single copy of large messages on top), between hosts
// through the Gloo group (TCP):
//   control plane   the host's ranks negotiate through the local control plane; the hosts'
//                   roots (each host's lowest rank) exchange over Gloo
//                   (comm/hierarchical_control_plane), so
//                   a one-host job never touches Gloo while it trains;
//   transports      per process set, the local transport to the members on this host, Gloo to the
//                   others (comm/routed_transport; gloo_fabric.h);
//   collectives     horovodlite's own algorithms over them (comm/host_collectives): the ring,
//                   the hierarchical allreduce, the transport collectives - no native ones;
//   failures        a dead process on this host is named by the local parts at once; ranks
//                   elsewhere that stop answering by the watchdog (gloo_watchdog.h).
//
// This header has no torch types: the composition root (csrc/runtime, C++17) includes it; the
// implementation is compiled with torch's headers (the hvdl_gloo library).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_runtime.h"
#include "comm/control_plane.h"
#include "comm/transport.h"
#include "common/config.h"

namespace hvdl {

// What the rendezvous found out. Ranks are the job's (the process group's).
struct GlooLaunch {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks of this host, in rank order
  int cross_rank = 0, cross_size = 1;  // this host among the hosts, in order of their first rank
  std::vector<std::string> hosts;      // the host of each rank
  std::string process_group;           // the registered name of the job's Gloo process group
  std::string shm_prefix;              // "/hvdl-<job>-<round>-<host>": names this host's segments
  double timeout_seconds = 30;         // HOROVOD_GLOO_TIMEOUT_SECONDS: a silent peer fails a wait
  double beat_seconds = 1;             // the watchdog's heartbeat period (elastic: shorter)
  // One host of an elastic job: a registered process group without a backend whose store carries
  // the watchdog's heartbeats (with several hosts, `process_group`'s store does)
  std::string beats_group;
  int connections = 1;                 // HOROVOD_GLOO_CONNECTIONS: the group's contexts
};

// What the ranks of one host use among themselves; the composition root gives shared memory
// (runtime/shm_parts.h). Both are collective over `members` - job ranks, ascending, all on
// this host - and name their resources after `what` (unique per use within the launch).
struct LocalParts {
  std::function<Status(const std::vector<int>& members, const std::string& what,
                       std::unique_ptr<Transport>* out)>
      transport;
  // A control plane whose bitwise ORs carry up to `words` words.
  std::function<Status(const std::vector<int>& members, size_t words,
                       std::unique_ptr<ControlPlane>* out)>
      control;
};

// Builds the runtime on the calling (main) thread; collective over the job.
Status BuildGloo(const GlooLaunch& launch, const Config& config, const LocalParts& local,
                 CommRuntime* out);

}  // namespace hvdl
