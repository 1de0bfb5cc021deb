#include "comm/backend_registry.h"

#if HVDL_WITH_MPI
#include <mpi.h>

#include "backends/mpi/mpi_backend.h"
#include "backends/mpi/mpi_control_plane.h"
#include "backends/mpi/mpi_world.h"
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
  out->control = std::make_unique<MpiControlPlane>(world->control());
  out->backends.Add(std::make_unique<MpiBackend>(world.get(), config));
  out->owner = std::shared_ptr<MpiWorld>(std::move(world));
  return Status::Ok();
#else
  return Status::Internal("horovodlite was built without MPI; no control plane is available");
#endif
}

void FinalizeCommTransport() {
#if HVDL_WITH_MPI
  FinalizeMpiIfOwned();
#endif
}

std::string TransportVersion() {
#if HVDL_WITH_MPI
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::string s(lib, static_cast<size_t>(len));
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

}  // namespace hvdl
