// The composition root: the one place that knows which transports, control planes and device
// backends this build has, picks them for a launch, and hands them to the core.
//
// StartContext parses the configuration, builds the communication runtime and creates the Context
// on it. A launch's runtime is its transport family's control plane, Fabric (transports per
// process set) and native collectives - today MPI's (backends/mpi) - plus what every launch gets:
// the host collectives over them (comm/host_collectives), in CUDA builds the CUDA device
// operations, NCCL and host staging, and the allreduce planner. A new transport family is a
// ControlPlane, a Fabric of Transports, and a Build function here. Everything below
// csrc/runtime sees interfaces only (comm/*.h); #if HVDL_WITH_* lives here, in the backends' own
// folders and in CMake.
#pragma once

#include <memory>
#include <vector>

#include "backends/gloo/gloo_world.h"
#include "comm/comm_runtime.h"
#include "common/config.h"
#include "core/context.h"

namespace hvdl {

// What the launch gives horovodlite to run on: MPI (mpirun, srun with PMI) or the Gloo
// controller (torchrun, Ray, Spark, Slurm without PMI, horovodliterun --gloo), chosen by Python
// from the environment (horovodlite/common/launch_env.py).
struct LaunchOptions {
  enum class Controller { kMpi, kGloo };
  Controller controller = Controller::kMpi;
  // MPI
  bool has_comm = false;  // an mpi4py communicator, as its Fortran handle
  int comm_f2c = 0;
  std::vector<int> ranks;  // or a list of MPI_COMM_WORLD ranks
  // Gloo: what the rendezvous found (horovodlite/common/rendezvous.py)
  GlooLaunch gloo;
};

// Builds the runtime on the calling (main) thread; collective over the job.
Status BuildCommRuntime(const LaunchOptions& launch, const Config& config, CommRuntime* out);

// Parses the configuration (HOROVOD_* from the environment), builds the communication runtime
// and creates the Context on it. Main thread; collective over the job.
Status StartContext(const LaunchOptions& launch, const InitOptions& options,
                    std::unique_ptr<Context>* out);

}  // namespace hvdl
