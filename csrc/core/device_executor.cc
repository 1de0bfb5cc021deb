#include "core/device_executor.h"

#include <cstring>

#include "core/collective_layout.h"

namespace hvdl {
namespace {

// Timeline activity of the collective itself (static strings: the timeline keeps the pointer).
const char* CollectiveActivity(const DataBackend* be, OpType op) {
  const bool nccl = std::strcmp(be->name(), "nccl") == 0;
  switch (op) {
    case OpType::kAllreduce: return nccl ? "NCCL_ALLREDUCE" : "MPI_ALLREDUCE";
    case OpType::kAllgather: return nccl ? "NCCL_ALLGATHER" : "MPI_ALLGATHER";
    case OpType::kBroadcast: return nccl ? "NCCL_BROADCAST" : "MPI_BROADCAST";
    case OpType::kAlltoall: return nccl ? "NCCL_ALLTOALL" : "MPI_ALLTOALL";
    case OpType::kReducescatter: return nccl ? "NCCL_REDUCESCATTER" : "MPI_REDUCESCATTER";
    default: return "COLLECTIVE";
  }
}

}  // namespace

DeviceExecutor::DeviceExecutor(DeviceOps* ops, ProcessSetTable* sets, int rank)
    : ops_(ops), sets_(sets), rank_(rank) {}

DeviceExecutor::~DeviceExecutor() {
  for (auto& kv : buffers_) {
    if (kv.second.data != nullptr) ops_->Free(kv.first, kv.second.data);
  }
}

Status DeviceExecutor::PickDevice(const std::vector<DeviceItem>& items, int* device) const {
  *device = kCpuDevice;
  for (const DeviceItem& it : items) {
    if (it.entry == nullptr) continue;
    const int d = it.entry->input.device;
    if (*device != kCpuDevice && d != *device) {
      return Status::InvalidArgument("tensors of one batch are on " + DeviceName(*device) +
                                     " and " + DeviceName(d) + " on rank " +
                                     std::to_string(rank_) +
                                     "; horovodlite runs collectives on one GPU per process.");
    }
    *device = d;
  }
  if (*device == kCpuDevice) *device = last_device_;  // joined: zeros on the last device used
  return Status::Ok();
}

Status DeviceExecutor::WaitReady(const std::vector<DeviceItem>& items) {
  for (const DeviceItem& it : items) {
    if (it.entry != nullptr && it.entry->ready) {
      HVDL_RETURN_IF_ERROR(it.entry->ready->StreamWait(ops_->stream()));
    }
  }
  return Status::Ok();
}

Status DeviceExecutor::Buffer(size_t bytes, void** out) {
  DeviceBuffer& b = buffers_[ops_->device()];
  if (b.data == nullptr || bytes > b.capacity) {
    if (b.data != nullptr) ops_->Free(ops_->device(), b.data);  // waits for queued work
    b = DeviceBuffer();
    const size_t rounded = (bytes + 255) / 256 * 256;
    Status s = ops_->Alloc(rounded == 0 ? 256 : rounded, &b.data);
    if (!s.ok()) {
      return Status::Internal("out of device memory allocating a " + std::to_string(bytes) +
                              "-byte fusion buffer on " + DeviceName(ops_->device()) +
                              "; lower HOROVOD_FUSION_THRESHOLD (" + s.message() + ")");
    }
    b.capacity = rounded == 0 ? 256 : rounded;
  }
  *out = b.data;
  return Status::Ok();
}

Status DeviceExecutor::Run(std::vector<DeviceItem>& items, DataBackend* be, const Phase& phase,
                           std::vector<int64_t>* extra) {
  int device = kCpuDevice;
  HVDL_RETURN_IF_ERROR(PickDevice(items, &device));
  HVDL_RETURN_IF_ERROR(ops_->SetDevice(device));
  last_device_ = device;
  Status s = RunOp(items, be, phase, extra);
  std::shared_ptr<DeviceEvent> finished;
  if (s.ok()) s = ops_->Record(&finished);
  if (s.ok()) s = be->WaitForDevice(finished.get());
  if (!s.ok()) {
    ops_->Synchronize();  // best effort: nothing may still use the tensors; the first error wins
    return s;
  }
  for (DeviceItem& it : items) {
    if (it.entry != nullptr && it.entry->device_done) it.entry->device_done(finished);
  }
  return Status::Ok();
}

Status DeviceExecutor::RunOp(std::vector<DeviceItem>& items, DataBackend* be, const Phase& phase,
                             std::vector<int64_t>* extra) {
  switch (items.front().response->op) {
    case OpType::kAllreduce: return Allreduce(items, be, phase);
    case OpType::kAllgather: return Allgather(items, be, phase);
    case OpType::kReducescatter: return Reducescatter(items, be, phase);
    case OpType::kBroadcast: return Broadcast(items.front(), be, phase);
    case OpType::kAlltoall: return Alltoall(items.front(), be, phase, extra);
    default:
      return Status::Internal(std::string("the device executor cannot run ") +
                              OpTypeName(items.front().response->op));
  }
}

Status DeviceExecutor::Allreduce(std::vector<DeviceItem>& items, DataBackend* be,
                                 const Phase& phase) {
  const Response& r = *items.front().response;
  const int n = sets_->Size(r.process_set);
  const bool average = r.reduce_op == ReduceOp::kAverage;
  AllreduceArgs a;
  a.dtype = r.dtype;
  a.ps = r.process_set;
  a.op = average ? ReduceOp::kSum : r.reduce_op;
  a.postscale = r.postscale * (average ? 1.0 / n : 1.0);
  const size_t esize = DataTypeSize(r.dtype);
  std::vector<int64_t> counts;
  for (const DeviceItem& it : items) counts.push_back(NumElements(it.response->shape));
  for (int64_t c : counts) a.count += c;
  HVDL_RETURN_IF_ERROR(WaitReady(items));

  if (items.size() == 1 && items.front().entry != nullptr) {  // alone: in place on the output
    TensorEntry& e = *items.front().entry;
    if (e.output.data != e.input.data || r.prescale != 1.0) {
      HVDL_RETURN_IF_ERROR(ops_->ScaleCopy({{e.output.data, e.input.data, a.count}}, r.dtype,
                                           r.prescale));
    }
    a.buf = e.output.data;
    phase(CollectiveActivity(be, OpType::kAllreduce));
    return be->Allreduce(a);
  }
  void* buf = nullptr;
  HVDL_RETURN_IF_ERROR(Buffer(static_cast<size_t>(a.count) * esize, &buf));
  phase("MEMCPY_IN_FUSION_BUFFER");
  std::vector<CopyRegion> pack, unpack;
  int64_t offset = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    TensorEntry* e = items[i].entry;
    if (e != nullptr) {
      pack.push_back({At(buf, offset, esize), e->input.data, counts[i]});
      unpack.push_back({e->output.data, At(buf, offset, esize), counts[i]});
    } else {  // joined: zeros
      HVDL_RETURN_IF_ERROR(ops_->Zero(At(buf, offset, esize), static_cast<size_t>(counts[i]) * esize));
    }
    offset += counts[i];
  }
  HVDL_RETURN_IF_ERROR(ops_->ScaleCopy(pack, r.dtype, r.prescale));
  a.buf = buf;
  phase(CollectiveActivity(be, OpType::kAllreduce));
  HVDL_RETURN_IF_ERROR(be->Allreduce(a));
  phase("MEMCPY_OUT_FUSION_BUFFER");
  return ops_->ScaleCopy(unpack, r.dtype, 1.0);
}

Status DeviceExecutor::Allgather(std::vector<DeviceItem>& items, DataBackend* be,
                                 const Phase& phase) {
  const Response& r0 = *items.front().response;
  const int n = sets_->Size(r0.process_set);
  const int me = sets_->RankIn(r0.process_set, rank_);
  const size_t esize = DataTypeSize(r0.dtype);
  std::vector<const Response*> rs;
  for (const DeviceItem& it : items) rs.push_back(it.response);
  const FusedLayout layout = AllgatherLayout(rs, n);
  for (size_t i = 0; i < items.size(); ++i) {
    TensorEntry& e = *items[i].entry;
    HVDL_RETURN_IF_ERROR(e.allocate(layout.out_shapes[i], &e.output));
  }
  HVDL_RETURN_IF_ERROR(WaitReady(items));  // after allocation: it re-records the ready events
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (const DeviceItem& it : items) {
    inputs.push_back(it.entry->input.data);
    outputs.push_back(it.entry->output.data);
  }
  if (items.size() == 1) {
    phase(CollectiveActivity(be, OpType::kAllgather));
    return be->Allgatherv(inputs[0], outputs[0], layout.counts, r0.dtype, r0.process_set);
  }
  void* buf = nullptr;
  HVDL_RETURN_IF_ERROR(Buffer(static_cast<size_t>(layout.total) * esize, &buf));
  phase("MEMCPY_IN_FUSION_BUFFER");
  HVDL_RETURN_IF_ERROR(
      ops_->ScaleCopy(AllgatherPack(rs, inputs, layout, me, buf, esize), r0.dtype, 1.0));
  phase(CollectiveActivity(be, OpType::kAllgather));
  HVDL_RETURN_IF_ERROR(be->Allgatherv(nullptr, buf, layout.counts, r0.dtype, r0.process_set));
  phase("MEMCPY_OUT_FUSION_BUFFER");
  return ops_->ScaleCopy(AllgatherUnpack(rs, outputs, layout, buf, esize), r0.dtype, 1.0);
}

Status DeviceExecutor::Reducescatter(std::vector<DeviceItem>& items, DataBackend* be,
                                     const Phase& phase) {
  const Response& r0 = *items.front().response;
  const int n = sets_->Size(r0.process_set);
  const int me = sets_->RankIn(r0.process_set, rank_);
  const size_t esize = DataTypeSize(r0.dtype);
  const ReduceOp op = r0.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r0.reduce_op;
  const double post = r0.postscale * (r0.reduce_op == ReduceOp::kAverage ? 1.0 / n : 1.0);
  std::vector<const Response*> rs;
  for (const DeviceItem& it : items) rs.push_back(it.response);
  const FusedLayout layout = ReducescatterLayout(rs, n, me);
  for (size_t i = 0; i < items.size(); ++i) {
    TensorEntry& e = *items[i].entry;
    HVDL_RETURN_IF_ERROR(e.allocate(layout.out_shapes[i], &e.output));
  }
  HVDL_RETURN_IF_ERROR(WaitReady(items));
  std::vector<const void*> inputs;
  for (const DeviceItem& it : items) inputs.push_back(it.entry->input.data);
  const int64_t mine = layout.counts[static_cast<size_t>(me)];
  void* buf = nullptr;
  HVDL_RETURN_IF_ERROR(Buffer(static_cast<size_t>(layout.total + mine) * esize, &buf));
  phase("MEMCPY_IN_FUSION_BUFFER");
  HVDL_RETURN_IF_ERROR(
      ops_->ScaleCopy(ReducescatterPack(rs, inputs, n, buf, esize), r0.dtype, r0.prescale));
  void* recv = At(buf, layout.total, esize);
  phase(CollectiveActivity(be, OpType::kReducescatter));
  HVDL_RETURN_IF_ERROR(be->ReduceScatter(buf, recv, layout.counts, r0.dtype, op, r0.process_set));
  phase("MEMCPY_OUT_FUSION_BUFFER");
  std::vector<CopyRegion> unpack;
  int64_t src = 0;
  for (DeviceItem& it : items) {
    int64_t c = NumElements(it.entry->output.shape);
    unpack.push_back({it.entry->output.data, At(recv, src, esize), c});
    src += c;
  }
  return ops_->ScaleCopy(unpack, r0.dtype, post);
}

Status DeviceExecutor::Broadcast(DeviceItem& item, DataBackend* be, const Phase& phase) {
  const Response& r = *item.response;
  const int root = sets_->RankIn(r.process_set, r.root);
  TensorEntry& e = *item.entry;
  const int64_t count = NumElements(r.shape);
  HVDL_RETURN_IF_ERROR(WaitReady({item}));
  if (rank_ == r.root && e.output.data != e.input.data) {
    HVDL_RETURN_IF_ERROR(ops_->ScaleCopy({{e.output.data, e.input.data, count}}, r.dtype, 1.0));
  }
  phase(CollectiveActivity(be, OpType::kBroadcast));
  return be->Broadcast(e.output.data, count, r.dtype, root, r.process_set);
}

Status DeviceExecutor::Alltoall(DeviceItem& item, DataBackend* be, const Phase& phase,
                                std::vector<int64_t>* received) {
  const Response& r = *item.response;
  AlltoallLayout l =
      PlanAlltoall(r, sets_->Size(r.process_set), sets_->RankIn(r.process_set, rank_));
  *received = std::move(l.received);
  HVDL_RETURN_IF_ERROR(item.entry->allocate(l.out_shape, &item.entry->output));
  HVDL_RETURN_IF_ERROR(WaitReady({item}));
  phase(CollectiveActivity(be, OpType::kAlltoall));
  return be->Alltoallv(item.entry->input.data, l.send, item.entry->output.data, l.recv, r.dtype,
                       r.process_set);
}

}  // namespace hvdl
