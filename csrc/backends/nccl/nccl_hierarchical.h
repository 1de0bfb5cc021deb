// HierarchicalAllreduce: allreduce of process set 0 in three stages (the planner's hierarchical
// plan for device memory, HOROVOD_HIERARCHICAL_ALLREDUCE=1).
//
//   1. NCCL reduce-scatter inside the node: local rank i ends up with the node's sum of shard i;
//   2. ring allreduce of shard i across nodes, among the ranks with local rank i (the fabric's
//      cross transport), on a page-locked host copy of the shard (skipped on a single node);
//   3. NCCL allgather inside the node: every rank gets every reduced shard.
// Shards are ceil(count / local_size) elements: when count does not divide, the buffer is copied
// into a zero-padded device scratch buffer first (the padding reduces to garbage nobody reads).
// The postscale is applied on the way back. It needs the same number of ranks on every node
// (the planner plans it only then). The node's NCCL communicator is bootstrapped over the
// fabric's host transport. All device work is queued on DeviceOps::stream(); stage 2 waits for the stream,
// polling NCCL's asynchronous errors. Background thread only.
#pragma once

#include <nccl.h>

#include "backends/nccl/nccl_comms.h"
#include "comm/data_backend.h"
#include "comm/device_ops.h"
#include "comm/fabric.h"

namespace hvdl {

class HierarchicalAllreduce {
 public:
  // Nothing is owned; all must outlive this object.
  HierarchicalAllreduce(Fabric* fabric, DeviceOps* ops, NcclCommunicators* comms, int rank);
  ~HierarchicalAllreduce();
  HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
  HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

  // In place on args.buf (process set 0), postscale applied; `type` is args.dtype's NCCL type.
  Status Run(const AllreduceArgs& args, ncclDataType_t type);

 private:
  Status Grow(void** buf, size_t* capacity, size_t bytes, bool host);
  Status CrossNodes(Transport* cross, void* shard, int64_t count, const AllreduceArgs& args);

  Fabric* fabric_;
  DeviceOps* ops_;
  NcclCommunicators* comms_;
  int rank_;
  void* scratch_ = nullptr;  // device, padded copy of the buffer
  size_t scratch_bytes_ = 0;
  int scratch_device_ = -1;
  void* host_ = nullptr;  // page-locked copy of this rank's shard
  size_t host_bytes_ = 0;
};

}  // namespace hvdl
