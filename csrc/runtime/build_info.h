// What this build has: transports, device support and their versions (hvd.mpi_built(),
// hvd.nccl_built(), horovodliterun --check-build). Callable before init, any thread.
#pragma once

#include <memory>
#include <string>

#include "comm/device_ops.h"

namespace hvdl {

bool MpiBuilt();
// True if the Gloo controller (torch's c10d) is built in.
bool GlooBuilt();
// MPI_Get_library_version of the MPI library loaded into this process, whole; callable before
// init (horovodlite/_mpi_check.py compares it with the MPI the extension was built against).
std::string MpiLibraryVersion();
// "MPI 3.1 (Open MPI v5.0.11, ...)" or "" if not built.
std::string TransportVersion();
// True if the MPI has ULFM, so that an elastic job survives lost ranks (CommRuntime::recover).
bool FaultToleranceBuilt();
// True in builds with CUDA kernels and device support (HVDL_WITH_CUDA).
bool CudaBuilt();
// NCCL_VERSION_CODE of the NCCL headers this build was compiled against (e.g. 23203), else 0.
int NcclVersion();
// A fresh DeviceOps of the build's accelerator (CUDA), nullptr in a CPU-only build.
std::unique_ptr<DeviceOps> MakeDeviceOps(int rank);

}  // namespace hvdl
