#include "core/device_executor.h"

#include <cstring>

namespace hvdl {
namespace {

int64_t Trailing(const Shape& shape) {
  int64_t e = 1;
  for (size_t i = 1; i < shape.size(); ++i) e *= shape[i];
  return e;
}

// Rows of a dim-0 split of `rows` across `n` members: the first rows % n get one extra.
int64_t RowsOf(int64_t rows, int n, int m) { return rows / n + (m < rows % n ? 1 : 0); }

char* At(void* base, int64_t elems, size_t esize) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(esize);
}

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
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  for (DeviceItem& it : items) {
    const Response& r = *it.response;
    Shape out_shape = r.shape.empty() ? Shape{0} : r.shape;
    out_shape[0] = 0;
    for (int m = 0; m < n; ++m) {
      out_shape[0] += r.sizes[static_cast<size_t>(m)];
      counts[static_cast<size_t>(m)] += r.sizes[static_cast<size_t>(m)] * Trailing(r.shape);
    }
    HVDL_RETURN_IF_ERROR(it.entry->allocate(out_shape, &it.entry->output));
  }
  HVDL_RETURN_IF_ERROR(WaitReady(items));  // after allocation: it re-records the ready events
  if (items.size() == 1) {
    phase(CollectiveActivity(be, OpType::kAllgather));
    return be->Allgatherv(items[0].entry->input.data, items[0].entry->output.data, counts,
                          r0.dtype, r0.process_set);
  }
  std::vector<int64_t> displ(static_cast<size_t>(n), 0);
  for (size_t m = 1; m < displ.size(); ++m) displ[m] = displ[m - 1] + counts[m - 1];
  const int64_t total = displ.back() + counts.back();
  void* buf = nullptr;
  HVDL_RETURN_IF_ERROR(Buffer(static_cast<size_t>(total) * esize, &buf));
  // Member-major buffer: member m's block holds its rows of every tensor, tensor by tensor.
  phase("MEMCPY_IN_FUSION_BUFFER");
  std::vector<CopyRegion> pack;
  int64_t off = displ[static_cast<size_t>(me)];
  for (DeviceItem& it : items) {
    int64_t c = it.response->sizes[static_cast<size_t>(me)] * Trailing(it.response->shape);
    pack.push_back({At(buf, off, esize), it.entry->input.data, c});
    off += c;
  }
  HVDL_RETURN_IF_ERROR(ops_->ScaleCopy(pack, r0.dtype, 1.0));
  phase(CollectiveActivity(be, OpType::kAllgather));
  HVDL_RETURN_IF_ERROR(be->Allgatherv(nullptr, buf, counts, r0.dtype, r0.process_set));
  phase("MEMCPY_OUT_FUSION_BUFFER");
  std::vector<CopyRegion> unpack;
  std::vector<int64_t> written(items.size(), 0);
  for (int m = 0; m < n; ++m) {
    int64_t src = displ[static_cast<size_t>(m)];
    for (size_t i = 0; i < items.size(); ++i) {
      const Response& r = *items[i].response;
      int64_t c = r.sizes[static_cast<size_t>(m)] * Trailing(r.shape);
      unpack.push_back({At(items[i].entry->output.data, written[i], esize), At(buf, src, esize), c});
      written[i] += c;
      src += c;
    }
  }
  return ops_->ScaleCopy(unpack, r0.dtype, 1.0);
}

Status DeviceExecutor::Reducescatter(std::vector<DeviceItem>& items, DataBackend* be,
                                     const Phase& phase) {
  const Response& r0 = *items.front().response;
  const int n = sets_->Size(r0.process_set);
  const int me = sets_->RankIn(r0.process_set, rank_);
  const size_t esize = DataTypeSize(r0.dtype);
  const ReduceOp op = r0.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r0.reduce_op;
  const double post = r0.postscale * (r0.reduce_op == ReduceOp::kAverage ? 1.0 / n : 1.0);
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  for (DeviceItem& it : items) {
    const Response& r = *it.response;
    Shape out_shape = r.shape;
    out_shape[0] = RowsOf(r.shape[0], n, me);
    for (int m = 0; m < n; ++m) counts[static_cast<size_t>(m)] += RowsOf(r.shape[0], n, m) * Trailing(r.shape);
    HVDL_RETURN_IF_ERROR(it.entry->allocate(out_shape, &it.entry->output));
  }
  HVDL_RETURN_IF_ERROR(WaitReady(items));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const int64_t mine = counts[static_cast<size_t>(me)];
  void* buf = nullptr;
  HVDL_RETURN_IF_ERROR(Buffer(static_cast<size_t>(total + mine) * esize, &buf));
  // Member-major send buffer: block m holds member m's rows of every tensor, prescaled.
  phase("MEMCPY_IN_FUSION_BUFFER");
  std::vector<CopyRegion> pack;
  int64_t dst = 0;
  for (int m = 0; m < n; ++m) {
    for (DeviceItem& it : items) {
      const Response& r = *it.response;
      int64_t row0 = 0;
      for (int k = 0; k < m; ++k) row0 += RowsOf(r.shape[0], n, k);
      int64_t c = RowsOf(r.shape[0], n, m) * Trailing(r.shape);
      pack.push_back({At(buf, dst, esize), At(it.entry->input.data, row0 * Trailing(r.shape), esize), c});
      dst += c;
    }
  }
  HVDL_RETURN_IF_ERROR(ops_->ScaleCopy(pack, r0.dtype, r0.prescale));
  void* recv = At(buf, total, esize);
  phase(CollectiveActivity(be, OpType::kReducescatter));
  HVDL_RETURN_IF_ERROR(be->ReduceScatter(buf, recv, counts, r0.dtype, op, r0.process_set));
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
  const int n = sets_->Size(r.process_set);
  const int me = sets_->RankIn(r.process_set, rank_);
  const int64_t e = Trailing(r.shape);
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  received->assign(static_cast<size_t>(n), 0);
  Shape out_shape = r.shape.empty() ? Shape{0} : r.shape;
  out_shape[0] = 0;
  for (int m = 0; m < n; ++m) {
    int64_t to_m = r.sizes[static_cast<size_t>(me * n + m)];
    int64_t from_m = r.sizes[static_cast<size_t>(m * n + me)];
    send[static_cast<size_t>(m)] = to_m * e;
    recv[static_cast<size_t>(m)] = from_m * e;
    (*received)[static_cast<size_t>(m)] = from_m;
    out_shape[0] += from_m;
  }
  HVDL_RETURN_IF_ERROR(item.entry->allocate(out_shape, &item.entry->output));
  HVDL_RETURN_IF_ERROR(WaitReady({item}));
  phase(CollectiveActivity(be, OpType::kAlltoall));
  return be->Alltoallv(item.entry->input.data, send, item.entry->output.data, recv, r.dtype,
                       r.process_set);
}

}  // namespace hvdl
