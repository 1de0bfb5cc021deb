// NcclCommunicators: the NCCL communicators of this process, one per process set (plus the
// node-local one of hierarchical allreduce), created lazily by the background thread.
//
// Bootstrap (collective over the members of the set's MPI communicator, which is safe because
// every member executes the agreed responses in the same order, so all of them reach the first
// NCCL op of a set together): member 0 calls ncclGetUniqueId and broadcasts the id with its
// result code over MPI, so a failure there fails every member instead of hanging them; then every
// member calls ncclCommInitRank on its device. A communicator lives on one device; an op on
// another device of the same process is refused (horovodlite runs one GPU per process).
//
// Failure: CheckAsyncErrors polls ncclCommGetAsyncError; a communicator that failed is aborted
// (ncclCommAbort ends its pending kernels) and forgotten, so the next op on its set bootstraps a
// new one. Background thread only.
#pragma once

#include <mpi.h>
#include <nccl.h>

#include <map>

#include "common/device_event.h"
#include "common/status.h"

namespace hvdl {

struct NcclComm {
  ncclComm_t comm = nullptr;
  int device = -1;
  int rank = 0;  // within the communicator
  int size = 1;
};

class NcclCommunicators {
 public:
  // Key of the node-local communicator of hierarchical allreduce (process sets are >= 0).
  static constexpr int kLocalKey = -1;

  explicit NcclCommunicators(int world_rank) : rank_(world_rank) {}
  ~NcclCommunicators();  // destroys every communicator (aborts any that failed)
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;

  // The communicator under `key`; the first call bootstraps it over `mpi` on `device` (blocking,
  // collective over the members of `mpi`).
  Status Get(int key, MPI_Comm mpi, int device, NcclComm** out);
  // Destroys the communicator under `key`, if any (process set removal).
  void Destroy(int key);
  // Non-blocking: the first asynchronous failure of any communicator, which is then aborted.
  Status CheckAsyncErrors();
  // Blocks until `event` has completed, checking for asynchronous failures meanwhile (an abort
  // ends the communicator's kernels, so the event then completes too).
  Status Wait(DeviceEvent* event);

 private:
  Status Bootstrap(MPI_Comm mpi, int device, NcclComm* out);

  int rank_;
  std::map<int, NcclComm> comms_;
};

}  // namespace hvdl
