#include "backends/nccl/nccl_comms.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "backends/nccl/nccl_util.h"
#include "common/logging.h"
#include "common/types.h"

namespace hvdl {

NcclCommunicators::~NcclCommunicators() {
  for (auto& kv : comms_) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(kv.second.comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      ncclCommAbort(kv.second.comm);
    } else {
      ncclCommDestroy(kv.second.comm);
    }
  }
}

Status NcclCommunicators::Bootstrap(const NcclBootstrap& b, int device, NcclComm* out) {
  out->rank = b.rank;
  out->size = b.size;
  struct {
    int32_t result;  // ncclResult_t of ncclGetUniqueId on member 0
    ncclUniqueId id;
  } root = {};
  if (out->rank == 0) root.result = static_cast<int32_t>(ncclGetUniqueId(&root.id));
  HVDL_RETURN_IF_ERROR(b.broadcast(&root, sizeof(root)));
  if (root.result != ncclSuccess) {
    return Status::Internal("ncclGetUniqueId failed on the first member of the communicator "
                            "(seen on rank " + std::to_string(rank_) + "): " +
                            ncclGetErrorString(static_cast<ncclResult_t>(root.result)));
  }
  cudaError_t rc = cudaSetDevice(device);
  if (rc != cudaSuccess) {
    return Status::Internal("cudaSetDevice(" + std::to_string(device) + ") failed on rank " +
                            std::to_string(rank_) + ": " + cudaGetErrorString(rc));
  }
  out->device = device;
  ncclResult_t nrc = ncclCommInitRank(&out->comm, out->size, root.id, out->rank);
  if (nrc != ncclSuccess) {
    out->comm = nullptr;
    return Status::Internal(NcclStatus(nrc, "ncclCommInitRank", rank_).message() +
                            " (NCCL cannot run two ranks on one GPU: pin one GPU per process "
                            "with torch.cuda.set_device(hvd.local_rank()), or set "
                            "HOROVOD_GPU_OPERATIONS=mpi.)");
  }
  HVDL_LOG(Debug) << "NCCL communicator of " << out->size << " ranks on "
                  << DeviceName(device) << " ready";
  return Status::Ok();
}

Status NcclCommunicators::Get(int key, const std::function<NcclBootstrap()>& bootstrap,
                              int device, NcclComm** out) {
  auto it = comms_.find(key);
  if (it != comms_.end()) {
    if (it->second.device != device) {
      return Status::InvalidArgument(
          "the NCCL communicator of this process set lives on " + DeviceName(it->second.device) +
          " but this op's tensors are on " + DeviceName(device) + " (rank " +
          std::to_string(rank_) + "); horovodlite runs collectives on one GPU per process.");
    }
    *out = &it->second;
    return Status::Ok();
  }
  const NcclBootstrap b = bootstrap();
  if (b.size <= 0 || b.rank < 0 || !b.broadcast) {
    return Status::Internal("rank " + std::to_string(rank_) +
                            " is not a member of the group it bootstraps NCCL for");
  }
  NcclComm c;
  HVDL_RETURN_IF_ERROR(Bootstrap(b, device, &c));
  *out = &comms_.emplace(key, c).first->second;
  return Status::Ok();
}

void NcclCommunicators::Destroy(int key) {
  auto it = comms_.find(key);
  if (it == comms_.end()) return;
  ncclCommDestroy(it->second.comm);
  comms_.erase(it);
}

Status NcclCommunicators::CheckAsyncErrors() {
  for (auto it = comms_.begin(); it != comms_.end(); ++it) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(it->second.comm, &async);
    if (rc == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) continue;
    const ncclResult_t failure = rc != ncclSuccess ? rc : async;
    Status s = NcclStatus(failure, "NCCL (asynchronous error)", rank_, it->second.comm);
    ncclCommAbort(it->second.comm);
    comms_.erase(it);
    return Status::Internal(s.message() + " The communicator was aborted; the next collective "
                                          "on its process set builds a new one.");
  }
  return Status::Ok();
}

void NcclCommunicators::AbortAll() {
  for (auto& [key, c] : comms_) ncclCommAbort(c.comm);
  comms_.clear();
}

Status NcclCommunicators::Wait(DeviceEvent* event) {
  int polls = 0;
  for (;;) {
    bool done = false;
    HVDL_RETURN_IF_ERROR(event->Query(&done));
    if (done) return Status::Ok();
    HVDL_RETURN_IF_ERROR(CheckAsyncErrors());
    // Spin briefly (short collectives finish within microseconds), then poll gently.
    if (polls < 200) {
      ++polls;
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace hvdl
