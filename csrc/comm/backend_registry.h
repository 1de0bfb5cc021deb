// BackendRegistry: the data backends this build has, chosen per operation by capability, and the
// factory that builds the communication runtime (control plane + backends, and in CUDA builds the
// device operations). backend_registry.cc is the only core file with #if HVDL_WITH_*.
//
// Backends are tried in the order they are added: MPI (CPU buffers), then in CUDA builds NCCL
// (device buffers, when built and HOROVOD_GPU_OPERATIONS=nccl) and host staging through MPI
// (device buffers of any op/dtype MPI supports, e.g. int16 and bool that NCCL lacks).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/control_plane.h"
#include "comm/data_backend.h"
#include "comm/device_ops.h"
#include "common/config.h"

namespace hvdl {

class BackendRegistry {
 public:
  void Add(std::unique_ptr<DataBackend> backend);
  // The first backend whose Supports() is true; otherwise an error naming the op, dtype, device
  // and the backends that were built.
  Status Select(OpType op, DataType dtype, int device, DataBackend** out) const;
  // Collective over every rank, in the agreed order: forwards to every backend.
  Status AddProcessSet(int ps, const std::vector<int>& ranks);
  Status RemoveProcessSet(int ps);
  std::vector<DataBackend*> all() const;
  std::string Names() const;

 private:
  std::vector<std::unique_ptr<DataBackend>> backends_;
};

struct Topology {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  bool thread_multiple = false;
  bool homogeneous = true;  // every node runs local_size ranks
};

struct CommOptions {
  bool has_comm = false;  // an mpi4py communicator, as its Fortran handle
  int comm_f2c = 0;
  std::vector<int> ranks;  // or a list of MPI_COMM_WORLD ranks
};

struct CommRuntime {
  Topology topology;
  std::unique_ptr<ControlPlane> control;
  std::unique_ptr<DeviceOps> device_ops;  // CUDA builds; declared first: outlives the backends
  BackendRegistry backends;
  std::shared_ptr<void> owner;  // keeps the transport's world (communicators) alive
  // Fault tolerance (MPI with ULFM; both empty otherwise). Background thread. `peer_failed`:
  // a communication call reported failed ranks. `recover`: agree with the survivors on who is
  // left and keep them for the next init; *what says who was lost, in one line.
  std::function<bool()> peer_failed;
  std::function<Status(std::string*)> recover;
};

// Builds the runtime on the calling (main) thread; collective over the job.
Status BuildCommRuntime(const CommOptions& options, const Config& config, CommRuntime* out);
// Finalises the transport at process exit if horovodlite initialised it.
void FinalizeCommTransport();
// MPI_Get_library_version of the MPI library loaded into this process, whole; callable before
// init (horovodlite/_mpi_check.py compares it with the MPI the extension was built against).
std::string MpiLibraryVersion();
// "MPI 3.1 (Open MPI v5.0.11, ...)" or "" if not built.
std::string TransportVersion();
bool MpiBuilt();
// True if the MPI has ULFM, so that an elastic job survives lost ranks (CommRuntime::recover).
bool FaultToleranceBuilt();
// After a recovery: old rank -> rank among the survivors (-1: lost). Empty before any.
std::vector<int> LastRecoveryMap();
int Recoveries();
// The host of every rank this process saw lost (recoveries), in the order lost; elastic jobs
// blacklist hosts from it.
std::vector<std::string> LostHosts();
// Elastic growth (MpiWorld's): spawn `count` ranks at the next init; how many so far; whether
// this process is one of them.
void RequestGrowth(int count, const std::string& command, const std::vector<std::string>& argv,
                   const std::string& host);
int Grown();
bool Spawned();
// Elastic retirement (MpiWorld's Retire): see there.
Status Retire(bool leaving, std::vector<int>* map);
bool Retired();
// True in builds with CUDA kernels and device support (HVDL_WITH_CUDA).
bool CudaBuilt();
// A fresh CudaDeviceOps in CUDA builds (tests of the kernels), nullptr otherwise.
std::unique_ptr<DeviceOps> MakeDeviceOps(int rank);
// NCCL_VERSION_CODE of the NCCL headers this build was compiled against (e.g. 23203), else 0.
int NcclVersion();

}  // namespace hvdl
