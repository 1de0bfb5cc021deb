// NcclCommunicators: the NCCL communicators of this process, one per process set (plus the
// node-local one of hierarchical allreduce), created lazily by the background thread.
//
// Bootstrap (collective over the members, which is safe because every member executes the
// agreed responses in the same order, so all of them reach the first NCCL op of a set together):
// member 0 calls ncclGetUniqueId and broadcasts the id with its result code through the
// NcclBootstrap's broadcast - the host collectives of the set, or a host transport: no MPI here -
// so a failure there fails every member instead of hanging them; then every member calls
// ncclCommInitRank on its device. A communicator lives on one device; an op on
// another device of the same process is refused (horovodlite runs one GPU per process).
//
// Failure: CheckAsyncErrors polls ncclCommGetAsyncError; a communicator that failed is aborted
// (ncclCommAbort ends its pending kernels) and forgotten, so the next op on its set bootstraps a
// new one. Background thread only.
#pragma once

#include <nccl.h>

#include <functional>
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

// How the members of a future communicator find each other: this member's index and their
// number, and a blocking broadcast of bytes from member 0 to all of them (collective over them).
struct NcclBootstrap {
  int rank = 0;
  int size = 1;
  std::function<Status(void* data, size_t bytes)> broadcast;
};

class NcclCommunicators {
 public:
  // Key of the node-local communicator of hierarchical allreduce (process sets are >= 0).
  static constexpr int kLocalKey = -1;

  explicit NcclCommunicators(int world_rank) : rank_(world_rank) {}
  ~NcclCommunicators();  // destroys every communicator (aborts any that failed)
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;

  // The communicator under `key`; the first call bootstraps it through `bootstrap()` on
  // `device` (blocking, collective over the members). `bootstrap` is called only then.
  Status Get(int key, const std::function<NcclBootstrap()>& bootstrap, int device,
             NcclComm** out);
  // Destroys the communicator under `key`, if any (process set removal).
  void Destroy(int key);
  // Non-blocking: the first asynchronous failure of any communicator, which is then aborted.
  Status CheckAsyncErrors();
  // Aborts every communicator (their kernels exit); the next Get bootstraps a new one.
  void AbortAll();
  // Blocks until `event` has completed, checking for asynchronous failures meanwhile (an abort
  // ends the communicator's kernels, so the event then completes too).
  Status Wait(DeviceEvent* event);

 private:
  Status Bootstrap(const NcclBootstrap& b, int device, NcclComm* out);

  int rank_;
  std::map<int, NcclComm> comms_;
};

}  // namespace hvdl
