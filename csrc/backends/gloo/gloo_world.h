// The controller without MPI, on torch's own engine: the world of a launch that torchrun, Ray,
// Spark, Slurm or `horovodliterun --gloo` started. Python (horovodlite/common/rendezvous.py) meets
// the other ranks through a c10d store, creates the job's Gloo process group over it and registers
// it under a name; BuildGloo resolves that group from C++ (c10d::resolve_process_group) and builds
// the runtime on it: the control plane (gloo_control_plane.h) and the transports of every process
// set (gloo_fabric.h). Every collective then runs horovodlite's own algorithms over them
// (comm/host_collectives): there are no native collectives here.
//
// This header has no torch types: the composition root (csrc/runtime, C++17) includes it; the
// implementation is compiled with torch's headers (the hvdl_gloo library).
#pragma once

#include <string>
#include <vector>

#include "comm/comm_runtime.h"
#include "common/config.h"

namespace hvdl {

// What the rendezvous found out. Ranks are the job's (the process group's).
struct GlooLaunch {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the ranks of this host, in rank order
  int cross_rank = 0, cross_size = 1;  // this host among the hosts, in order of their first rank
  std::vector<std::string> hosts;      // the host of each rank
  std::string process_group;           // the registered name of the job's Gloo process group
  double timeout_seconds = 30;         // HOROVOD_GLOO_TIMEOUT_SECONDS: a silent peer fails a wait
};

// Builds the runtime on the calling (main) thread; collective over the job.
Status BuildGloo(const GlooLaunch& launch, const Config& config, CommRuntime* out);

}  // namespace hvdl
