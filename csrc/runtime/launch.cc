#include "runtime/launch.h"

#if HVDL_WITH_MPI
#include <mpi.h>

#include "backends/mpi/mpi_backend.h"
#include "backends/mpi/mpi_control_plane.h"
#include "backends/mpi/mpi_util.h"
#include "backends/mpi/mpi_world.h"
#endif
#if HVDL_WITH_CUDA
#include "backends/cuda/cuda_device_ops.h"
#include "comm/host_staging.h"
#endif
#if HVDL_WITH_NCCL
#include "backends/nccl/nccl_backend.h"
#endif

namespace hvdl {

Status BuildCommRuntime(const LaunchOptions& launch, const Config& config, CommRuntime* out) {
#if HVDL_WITH_MPI
  MpiWorldOptions mo;
  mo.has_comm = launch.has_comm;
  mo.comm_f2c = launch.comm_f2c;
  mo.ranks = launch.ranks;
  std::unique_ptr<MpiWorld> world;
  HVDL_RETURN_IF_ERROR(MpiWorld::Create(mo, &world));
  Topology& t = out->topology;
  t.rank = world->rank();
  t.size = world->size();
  t.local_rank = world->local_rank();
  t.local_size = world->local_size();
  t.cross_rank = world->cross_rank();
  t.cross_size = world->cross_size();
  t.thread_multiple = world->thread_multiple();
  t.homogeneous = world->homogeneous();
  out->control = std::make_unique<MpiControlPlane>(world->control());
  auto mpi = std::make_unique<MpiBackend>(world.get(), config);
  DataBackend* host = mpi.get();
  out->backends.Add(std::move(mpi));
#if HVDL_WITH_CUDA
  out->device_ops = std::make_unique<CudaDeviceOps>(t.rank);
#if HVDL_WITH_NCCL
  if (config.gpu_operations == GpuOperations::kNccl) {
    out->backends.Add(std::make_unique<NcclBackend>(world.get(), out->device_ops.get(), config));
  }
#endif
  MpiWorld* w = world.get();
  out->backends.Add(std::make_unique<HostStagingBackend>(host, out->device_ops.get(), [w](int ps) {
    MPI_Comm comm = w->data(ps);
    int r = -1;
    if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &r);
    return r;
  }));
#else
  (void)host;
#endif
  MpiWorld* survivors_of = world.get();
  if (UlfmBuilt()) {
    out->peer_failed = [] { return MpiPeerFailureSeen(); };
    out->recover = [survivors_of](std::string* what) { return survivors_of->Recover(what); };
  }
  out->owner = std::shared_ptr<MpiWorld>(std::move(world));
  return Status::Ok();
#else
  return Status::Internal("horovodlite was built without MPI; no control plane is available");
#endif
}

Status StartContext(const LaunchOptions& launch, const InitOptions& options,
                    std::unique_ptr<Context>* out) {
  Config config;
  HVDL_RETURN_IF_ERROR(ParseConfig(ProcessEnv(), &config));
  CommRuntime comm;
  HVDL_RETURN_IF_ERROR(BuildCommRuntime(launch, config, &comm));
  return Context::Create(config, std::move(comm), options, out);
}

}  // namespace hvdl
