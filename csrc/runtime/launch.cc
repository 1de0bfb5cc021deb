#include "runtime/launch.h"

#include "comm/host_collectives.h"
#if HVDL_WITH_GLOO
#include "runtime/shm_parts.h"
#endif
#if HVDL_WITH_MPI
#include "backends/mpi/mpi_backend.h"
#include "backends/mpi/mpi_control_plane.h"
#include "backends/mpi/mpi_fabric.h"
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

namespace {

#if HVDL_WITH_MPI
// An mpirun launch: MPI's control plane, MPI point-to-point transports (single copy inside a
// host) and MPI's native collectives; with ULFM, recovery from lost ranks.
Status BuildMpi(const LaunchOptions& launch, const Config& config, CommRuntime* out) {
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
  out->fabric = std::make_unique<MpiFabric>(world.get(), config.ring_single_copy);
  out->natives = std::make_unique<MpiBackend>(world.get(), config);
  MpiWorld* survivors_of = world.get();
  if (UlfmBuilt()) {
    out->peer_failed = [] { return MpiPeerFailureSeen(); };
    out->recover = [survivors_of](std::string* what) { return survivors_of->Recover(what); };
  }
  out->owner = std::shared_ptr<MpiWorld>(std::move(world));
  return Status::Ok();
}
#endif

// What every launch gets on top of its transports: the host collectives (every algorithm over
// the fabric, the natives where they exist), device support and the allreduce planner.
void AddCollectives(const Config& config, CommRuntime* out) {
  auto host = std::make_unique<HostCollectives>(out->fabric.get(), out->natives.get());
  HostCollectives* h = host.get();
  h->set_hierarchical_allgather(config.hierarchical_allgather);
  h->set_hierarchical_reducescatter(config.hierarchical_allreduce);
  out->backends->Add(std::move(host));
#if HVDL_WITH_CUDA
  out->device_ops = std::make_unique<CudaDeviceOps>(out->topology.rank);
#if HVDL_WITH_NCCL
  if (config.gpu_operations == GpuOperations::kNccl) {
    out->backends->Add(std::make_unique<NcclBackend>(out->fabric.get(), h, out->device_ops.get(),
                                                    out->topology.rank));
  }
#endif
  Fabric* fabric = out->fabric.get();
  out->backends->Add(std::make_unique<HostStagingBackend>(
      h, out->device_ops.get(), [fabric](int ps) { return fabric->SetRank(ps); },
      static_cast<size_t>(config.staging_chunk_bytes)));
#endif
  out->planner = std::make_unique<AllreducePlanner>(config, out->fabric.get(), out->backends.get());
  h->set_planner(out->planner.get());
}

}  // namespace

Status BuildCommRuntime(const LaunchOptions& launch, const Config& config, CommRuntime* out) {
  if (launch.controller == LaunchOptions::Controller::kGloo) {
#if HVDL_WITH_GLOO
    // Inside a host: shared memory. It outlives the runtime's pieces (declared first in owner).
    auto shm = std::make_shared<ShmParts>(launch.gloo.shm_prefix, launch.gloo.rank,
                                          launch.gloo.timeout_seconds, config.ring_single_copy);
    HVDL_RETURN_IF_ERROR(BuildGloo(launch.gloo, config, shm->Parts(), out));
    std::shared_ptr<void> world = std::move(out->owner);
    out->owner = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<ShmParts>>>(
        std::move(world), shm);
    auto cancel_gloo = std::move(out->cancel);
    out->cancel = [shm, cancel_gloo](const std::string& why) {
      shm->Cancel(why);
      if (cancel_gloo) cancel_gloo(why);
    };
#else
    return Status::Internal("this horovodlite was built without the Gloo controller (its torch "
                            "had no torch.distributed headers); launch it with mpirun");
#endif
  } else {
#if HVDL_WITH_MPI
    HVDL_RETURN_IF_ERROR(BuildMpi(launch, config, out));
#else
    return Status::Internal("this horovodlite was built without MPI; launch it with torchrun or "
                            "horovodliterun --gloo (the Gloo controller), or rebuild with an MPI");
#endif
  }
  AddCollectives(config, out);
  return Status::Ok();
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
