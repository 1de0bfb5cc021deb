#include "runtime/build_info.h"

#if HVDL_WITH_MPI
#include <mpi.h>

#include "backends/mpi/mpi_world.h"
#endif
#if HVDL_WITH_CUDA
#include "backends/cuda/cuda_device_ops.h"
#endif
#if HVDL_WITH_NCCL
#include "backends/nccl/nccl_backend.h"
#endif

namespace hvdl {

bool MpiBuilt() { return HVDL_WITH_MPI != 0; }

bool GlooBuilt() { return HVDL_WITH_GLOO != 0; }

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

bool FaultToleranceBuilt() {
#if HVDL_WITH_MPI
  return UlfmBuilt();
#else
  return false;
#endif
}

bool CudaBuilt() { return HVDL_WITH_CUDA != 0; }

int NcclVersion() {
#if HVDL_WITH_NCCL
  return NcclBackend::CompiledVersion();
#else
  return 0;
#endif
}

std::unique_ptr<DeviceOps> MakeDeviceOps(int rank) {
#if HVDL_WITH_CUDA
  return std::make_unique<CudaDeviceOps>(rank);
#else
  (void)rank;
  return nullptr;
#endif
}

}  // namespace hvdl
