#include "comm/backend_registry.h"

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

void BackendRegistry::Add(std::unique_ptr<DataBackend> backend) {
  backends_.push_back(std::move(backend));
}

std::string BackendRegistry::Names() const {
  std::string names;
  for (const auto& b : backends_) names += (names.empty() ? "" : ", ") + std::string(b->name());
  return names.empty() ? "none" : names;
}

Status BackendRegistry::Select(OpType op, DataType dtype, int device, DataBackend** out) const {
  for (const auto& b : backends_) {
    if (b->Supports(op, dtype, device)) {
      *out = b.get();
      return Status::Ok();
    }
  }
  return Status::Internal(std::string("no backend supports ") + OpTypeName(op) + " of " +
                          DataTypeName(dtype) + " on " + DeviceName(device) +
                          " (backends built: " + Names() + ")");
}

Status BackendRegistry::AddProcessSet(int ps, const std::vector<int>& ranks) {
  for (const auto& b : backends_) HVDL_RETURN_IF_ERROR(b->AddProcessSet(ps, ranks));
  return Status::Ok();
}

Status BackendRegistry::RemoveProcessSet(int ps) {
  for (const auto& b : backends_) HVDL_RETURN_IF_ERROR(b->RemoveProcessSet(ps));
  return Status::Ok();
}

std::vector<DataBackend*> BackendRegistry::all() const {
  std::vector<DataBackend*> out;
  for (const auto& b : backends_) out.push_back(b.get());
  return out;
}

Status BuildCommRuntime(const CommOptions& options, const Config& config, CommRuntime* out) {
#if HVDL_WITH_MPI
  MpiWorldOptions mo;
  mo.has_comm = options.has_comm;
  mo.comm_f2c = options.comm_f2c;
  mo.ranks = options.ranks;
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

bool FaultToleranceBuilt() {
#if HVDL_WITH_MPI
  return UlfmBuilt();
#else
  return false;
#endif
}

std::vector<int> LastRecoveryMap() {
#if HVDL_WITH_MPI
  return MpiWorld::LastRecoveryMap();
#else
  return {};
#endif
}

int Recoveries() {
#if HVDL_WITH_MPI
  return MpiWorld::Recoveries();
#else
  return 0;
#endif
}

std::vector<std::string> LostHosts() {
#if HVDL_WITH_MPI
  return MpiWorld::LostHosts();
#else
  return {};
#endif
}

#if !HVDL_WITH_MPI
void RequestGrowth(int, const std::string&, const std::vector<std::string>&,
                   const std::string&) {}
int Grown() { return 0; }
bool Spawned() { return false; }
Status Retire(bool, std::vector<int>*) {
  return Status::Internal("horovodlite was built without MPI; ranks cannot be retired");
}
bool Retired() { return false; }
#endif

void FinalizeCommTransport() {
#if HVDL_WITH_MPI
  FinalizeMpiIfOwned();
#endif
}

std::string MpiLibraryVersion() {
#if HVDL_WITH_MPI
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(lib, &len);  // allowed before MPI_Init (MPI-3)
  return std::string(lib, static_cast<size_t>(len));
#else
  return "";
#endif
}

std::string TransportVersion() {
#if HVDL_WITH_MPI
  std::string s = MpiLibraryVersion();
  size_t cut = s.find_first_of(",\n");
  return "MPI " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION) + " (" +
         s.substr(0, cut) + ")";
#else
  return "";
#endif
}

bool MpiBuilt() {
#if HVDL_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool CudaBuilt() {
#if HVDL_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<DeviceOps> MakeDeviceOps(int rank) {
#if HVDL_WITH_CUDA
  return std::make_unique<CudaDeviceOps>(rank);
#else
  return nullptr;
#endif
}

int NcclVersion() {
#if HVDL_WITH_NCCL
  return NcclBackend::CompiledVersion();
#else
  return 0;
#endif
}

}  // namespace hvdl
