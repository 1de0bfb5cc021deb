// HierarchicalAllreduce: allreduce of process set 0 in three stages (HOROVOD_HIERARCHICAL_ALLREDUCE).
//
//   1. NCCL reduce-scatter inside the node: local rank i ends up with the node's sum of shard i;
//   2. MPI allreduce of shard i across nodes, among the ranks with local rank i (MpiWorld's cross
//      communicator), on a page-locked host copy of the shard (skipped on a single node);
//   3. NCCL allgather inside the node: every rank gets every reduced shard.
// Shards are ceil(count / local_size) elements: when count does not divide, the buffer is copied
// into a zero-padded device scratch buffer first (the padding reduces to garbage nobody reads).
// The postscale is applied on the way back. It needs the same number of ranks on every node;
// Usable() checks that once (collectively) and the backend falls back to a flat NCCL allreduce
// otherwise. All device work is queued on DeviceOps::stream(); stage 2 waits for the stream,
// polling NCCL's asynchronous errors. Background thread only.
#pragma once

#include <nccl.h>

#include "backends/mpi/mpi_world.h"
#include "backends/nccl/nccl_comms.h"
#include "comm/data_backend.h"
#include "comm/device_ops.h"

namespace hvdl {

class HierarchicalAllreduce {
 public:
  // Nothing is owned; all must outlive this object.
  HierarchicalAllreduce(MpiWorld* world, DeviceOps* ops, NcclCommunicators* comms);
  ~HierarchicalAllreduce();
  HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
  HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

  // First call: blocking and collective over the job (every rank runs it for the same response).
  Status Usable(bool* usable);
  // In place on args.buf (process set 0), postscale applied; `type` is args.dtype's NCCL type.
  Status Run(const AllreduceArgs& args, ncclDataType_t type);

 private:
  Status Grow(void** buf, size_t* capacity, size_t bytes, bool host);
  Status CrossNodes(void* shard, int64_t count, const AllreduceArgs& args);

  MpiWorld* world_;
  DeviceOps* ops_;
  NcclCommunicators* comms_;
  int rank_;
  int usable_ = -1;  // unknown, 0, 1
  void* scratch_ = nullptr;  // device, padded copy of the buffer
  size_t scratch_bytes_ = 0;
  int scratch_device_ = -1;
  void* host_ = nullptr;  // page-locked copy of this rank's shard
  size_t host_bytes_ = 0;
};

}  // namespace hvdl
