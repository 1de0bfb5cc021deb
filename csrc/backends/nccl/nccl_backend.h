// NcclBackend: collectives on CUDA buffers with NCCL, on horovodlite's device stream.
//
// Supports allreduce, allgather, broadcast, alltoall and reducescatter of every dtype NCCL has
// (all of horovodlite's but int16; bool travels as uint8), for device >= 0; everything else falls
// through to the next backend (host staging). Communicators: one per process set, bootstrapped on
// first use through the host collectives of the set (nccl_comms.h). Per the DataBackend
// contract, every call returns once its work is queued on DeviceOps::stream() of the current
// device; WaitForDevice then blocks until the batch has run, polling ncclCommGetAsyncError, so a
// failure surfaces as a Status naming this rank (HorovodInternalError in Python) and the failed
// communicator is aborted.
//
//   allreduce       ncclAllReduce in place; Average (a Sum whose postscale is exactly 1/size) of
//                   floating types uses ncclAvg where NCCL has it (>= 2.10), any other postscale
//                   is one scale kernel. The planner's hierarchical plan (process set 0, every
//                   host alike, HOROVOD_HIERARCHICAL_ALLREDUCE=1): see nccl_hierarchical.h.
//   allgather(v)    ncclAllGather when every member sends the same count, else one grouped
//                   ncclBroadcast per member.
//   reducescatter   ncclReduceScatter for equal blocks, else one grouped ncclReduce per member.
//   alltoall(v)     grouped ncclSend/ncclRecv; this rank's own block is a device copy.
#pragma once

#include <memory>

#include "backends/nccl/nccl_comms.h"
#include "backends/nccl/nccl_hierarchical.h"
#include "comm/data_backend.h"
#include "comm/device_ops.h"
#include "comm/fabric.h"

namespace hvdl {

class NcclBackend : public DataBackend {
 public:
  // None is owned; all must outlive the backend. `host` runs collectives on host memory for the
  // same process sets (the bootstrap's broadcast); `fabric` knows the sets and the hosts.
  NcclBackend(Fabric* fabric, DataBackend* host, DeviceOps* ops, int rank);
  ~NcclBackend() override;

  // NCCL_VERSION_CODE of the headers (e.g. 23203 for 2.32.3) / of the loaded library.
  static int CompiledVersion();
  static int RuntimeVersion();

  const char* name() const override { return "nccl"; }
  bool native_device() const override { return true; }
  bool Supports(OpType op, DataType dtype, int device) const override;
  Status AddProcessSet(int ps, const std::vector<int>& ranks) override { return Status::Ok(); }
  Status RemoveProcessSet(int ps) override;
  int SetSize(int ps) const override;
  Status Allreduce(const AllreduceArgs& args) override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype, int ps) override;
  Status Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype, int ps) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op, int ps) override;
  Status WaitForDevice(DeviceEvent* event) override;
  Status CheckAsync() override;
  void AbortDevice() override;

 private:
  Status Comm(int ps, NcclComm** out);
  Status Type(DataType dtype, ncclDataType_t* out) const;
  cudaStream_t stream() const { return static_cast<cudaStream_t>(ops_->stream()); }

  Fabric* fabric_;
  DataBackend* host_;
  DeviceOps* ops_;
  int rank_;
  NcclCommunicators comms_;
  std::unique_ptr<HierarchicalAllreduce> hierarchical_;  // made at the first hierarchical plan
};

}  // namespace hvdl
