#include "backends/nccl/nccl_hierarchical.h"

#include <algorithm>
#include <climits>

#include "backends/nccl/nccl_util.h"
#include "comm/ring.h"
#include "comm/transport_collectives.h"
#include "common/logging.h"

namespace hvdl {

HierarchicalAllreduce::HierarchicalAllreduce(Fabric* fabric, DeviceOps* ops,
                                             NcclCommunicators* comms, int rank)
    : fabric_(fabric), ops_(ops), comms_(comms), rank_(rank) {}

HierarchicalAllreduce::~HierarchicalAllreduce() {
  if (scratch_ != nullptr || host_ != nullptr) ops_->Synchronize();
  if (scratch_ != nullptr) ops_->Free(scratch_device_, scratch_);
  if (host_ != nullptr) ops_->FreeHost(host_);
}

// Buffers grow only; growing waits for the stream before the old one goes.
Status HierarchicalAllreduce::Grow(void** buf, size_t* capacity, size_t bytes, bool host) {
  if (*buf != nullptr && bytes <= *capacity && (host || scratch_device_ == ops_->device())) {
    return Status::Ok();
  }
  if (*buf != nullptr) {
    HVDL_RETURN_IF_ERROR(ops_->Synchronize());
    if (host) {
      ops_->FreeHost(*buf);
    } else {
      ops_->Free(scratch_device_, *buf);
    }
    *buf = nullptr;
    *capacity = 0;
  }
  const size_t grown = std::max<size_t>(bytes, 4096);
  HVDL_RETURN_IF_ERROR(host ? ops_->AllocHost(grown, buf) : ops_->Alloc(grown, buf));
  *capacity = grown;
  if (!host) scratch_device_ = ops_->device();
  return Status::Ok();
}

// Stage 2: this rank's shard, reduced across nodes through host memory by the ring over the
// cross transport.
Status HierarchicalAllreduce::CrossNodes(Transport* cross, void* shard, int64_t count,
                                         const AllreduceArgs& a) {
  const size_t esize = DataTypeSize(a.dtype);
  const size_t bytes = static_cast<size_t>(count) * esize;
  HVDL_RETURN_IF_ERROR(Grow(&host_, &host_bytes_, bytes, true));
  HVDL_RETURN_IF_ERROR(ops_->CopyToHost(host_, shard, bytes));
  std::shared_ptr<DeviceEvent> copied;
  HVDL_RETURN_IF_ERROR(ops_->Record(&copied));
  HVDL_RETURN_IF_ERROR(comms_->Wait(copied.get()));  // stage 1 and the copy have run
  HVDL_RETURN_IF_ERROR(RingAllreduce(cross,
                                     ContiguousChunks(host_, EvenChunks(count, cross->size()),
                                                      a.dtype),
                                     a.dtype, a.op, 1.0, 64 * 1024, nullptr));
  return ops_->CopyToDevice(shard, host_, bytes);
}

Status HierarchicalAllreduce::Run(const AllreduceArgs& a, ncclDataType_t type) {
  if (a.count == 0) return Status::Ok();
  Transport *host, *cross;
  HVDL_RETURN_IF_ERROR(fabric_->HostTransports(&host, &cross));
  NcclComm* local = nullptr;
  HVDL_RETURN_IF_ERROR(comms_->Get(
      NcclCommunicators::kLocalKey,
      [host] {
        NcclBootstrap b;
        b.rank = host->rank();
        b.size = host->size();
        b.broadcast = [host](void* data, size_t bytes) {
          return TransportBroadcast(host, data, static_cast<int64_t>(bytes), DataType::kUInt8, 0);
        };
        return b;
      },
      ops_->device(), &local));
  const size_t esize = DataTypeSize(a.dtype);
  const int64_t shard = (a.count + local->size - 1) / local->size;
  const int64_t padded = shard * local->size;
  const cudaStream_t stream = static_cast<cudaStream_t>(ops_->stream());
  // Pad into the scratch buffer when the count does not divide.
  char* work = static_cast<char*>(a.buf);
  if (padded != a.count) {
    HVDL_RETURN_IF_ERROR(Grow(&scratch_, &scratch_bytes_, static_cast<size_t>(padded) * esize,
                              false));
    work = static_cast<char*>(scratch_);
    HVDL_RETURN_IF_ERROR(ops_->ScaleCopy({{work, a.buf, a.count}}, a.dtype, 1.0));
    HVDL_RETURN_IF_ERROR(ops_->Zero(work + a.count * static_cast<int64_t>(esize),
                                    static_cast<size_t>(padded - a.count) * esize));
  }
  char* mine = work + static_cast<int64_t>(local->rank) * shard * static_cast<int64_t>(esize);
  // 1. Reduce-scatter inside the node (in place: recvbuff = sendbuff + rank * recvcount).
  HVDL_NCCL(ncclReduceScatter(work, mine, static_cast<size_t>(shard), type,
                              NcclOp(a.dtype, a.op), local->comm, stream));
  // 2. Across nodes, among the ranks holding the same shard.
  if (cross->size() > 1) HVDL_RETURN_IF_ERROR(CrossNodes(cross, mine, shard, a));
  // 3. Allgather inside the node (in place: sendbuff = recvbuff + rank * sendcount).
  HVDL_NCCL(ncclAllGather(mine, work, static_cast<size_t>(shard), type, local->comm, stream));
  if (work != a.buf) return ops_->ScaleCopy({{a.buf, work, a.count}}, a.dtype, a.postscale);
  if (a.postscale == 1.0) return Status::Ok();
  return ops_->ScaleCopy({{a.buf, a.buf, a.count}}, a.dtype, a.postscale);
}

}  // namespace hvdl
