#include "core/executor.h"

#include <chrono>
#include <cstring>

#include "comm/reduce_kernels.h"
#include "comm/ring.h"
#include "common/logging.h"
#include "core/collective_layout.h"
#include "core/handle_table.h"

namespace hvdl {
namespace {

// Host memory: each region copied (and scaled) in turn.
void CopyRegions(const std::vector<CopyRegion>& regions, DataType dtype, double factor) {
  for (const CopyRegion& c : regions) ScaleCopy(c.dst, c.src, c.count, dtype, factor);
}

// The element ranges of each tensor that fall in each ring chunk. Chunk-major: chunk c holds
// every tensor's c-th even piece, so an element's chunk - and hence its reduction order - depends
// only on its own tensor's size, never on what it was fused with.
struct Piece {
  size_t item;
  int64_t offset;  // element offset in the tensor
  int64_t count;
};

std::vector<std::vector<Piece>> ChunkPieces(const std::vector<int64_t>& counts, int nchunks) {
  std::vector<std::vector<Piece>> chunks(static_cast<size_t>(nchunks));
  for (size_t i = 0; i < counts.size(); ++i) {
    std::vector<int64_t> even = EvenChunks(counts[i], nchunks);
    int64_t offset = 0;
    for (int k = 0; k < nchunks; ++k) {
      int64_t n = even[static_cast<size_t>(k)];
      if (n > 0) chunks[static_cast<size_t>(k)].push_back(Piece{i, offset, n});
      offset += n;
    }
  }
  return chunks;
}

}  // namespace

Executor::Executor(const ExecutorDeps& deps) : d_(deps) {
  if (d_.device_ops != nullptr) {
    device_ = std::make_unique<DeviceExecutor>(d_.device_ops, d_.sets, d_.rank);
  }
}

int64_t Executor::PayloadBytes(const Response& r) const {
  const int64_t esize = static_cast<int64_t>(DataTypeSize(r.dtype));
  switch (r.op) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kReducescatter:
      return NumElements(r.shape) * esize;
    case OpType::kAllgather: {
      int64_t rows = 0;
      for (int64_t s : r.sizes) rows += s;
      return rows * Trailing(r.shape) * esize;
    }
    default:
      return 0;
  }
}

int Executor::Run(const std::vector<Response>& responses, bool joined) {
  Items items;
  std::vector<const Response*> mine;
  std::vector<int64_t> bytes;
  items.reserve(responses.size());  // an Item is large: regrowing moved each up to 8 times
  mine.reserve(responses.size());
  bytes.reserve(responses.size());
  for (const Response& r : responses) {
    bool everyone = r.op == OpType::kProcessSetAdd || r.op == OpType::kProcessSetRemove ||
                    r.op == OpType::kJoin;
    if (!everyone && d_.sets->RankIn(r.process_set, d_.rank) < 0) continue;
    Item it;
    it.response = &r;
    it.has_entry = d_.queue->Take(r.Key(), &it.entry);
    bool zeros = !it.has_entry && joined && r.op == OpType::kAllreduce && !r.is_error();
    if (!it.has_entry && !zeros) continue;  // e.g. an error about a collective this rank skipped
    mine.push_back(&r);
    bytes.push_back(PayloadBytes(r));
    items.push_back(std::move(it));
  }
  const std::vector<Batch> batches = PlanBatches(mine, threshold_, bytes);
  if (batches.size() == 1 && batches[0].members.size() == items.size()) {
    last_batch_bytes_ = batches[0].bytes;  // everything fused, in order: no regrouping
    RunBatch(items);
    return static_cast<int>(mine.size());
  }
  for (const Batch& batch : batches) {
    Items group;
    group.reserve(batch.members.size());
    for (size_t i : batch.members) group.push_back(std::move(items[i]));
    last_batch_bytes_ = batch.bytes;
    RunBatch(group);
  }
  return static_cast<int>(mine.size());
}

void Executor::RunBatch(Items& items) {
  const Response& r = *items.front().response;
  if (r.is_error()) return Finish(items, Status(r.error_code, r.error), {});
  std::vector<int64_t> extra;
  Status s;
  auto start = std::chrono::steady_clock::now();
  switch (r.op) {
    case OpType::kBarrier:
      break;
    case OpType::kJoin:
      extra = r.sizes;
      break;
    case OpType::kProcessSetAdd:
    case OpType::kProcessSetRemove:
      s = RunProcessSet(items.front(), &extra);
      break;
    default: {
      DataBackend* be = nullptr;
      s = d_.backends->Select(r.op, r.dtype, r.device, &be);
      if (!s.ok()) break;
      if (r.device != kCpuDevice) s = RunOnDevice(items, be, &extra);
      else if (r.op == OpType::kAllreduce) s = RunAllreduce(items, be);
      else if (r.op == OpType::kAllgather) s = RunAllgather(items, be);
      else if (r.op == OpType::kReducescatter) s = RunReducescatter(items, be);
      else if (r.op == OpType::kBroadcast) s = RunBroadcast(items, be);
      else if (r.op == OpType::kAlltoall) s = RunAlltoall(items, be, &extra);
      if (observer_ != nullptr && s.ok()) {
        int64_t total = 0;
        for (const Item& it : items) total += PayloadBytes(*it.response);
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        observer_->CollectiveDone(r.op, static_cast<int>(items.size()), total,
                                  d_.sets->Size(r.process_set), secs);
      }
    }
  }
  Finish(items, s, extra);
}

void Executor::Finish(Items& items, const Status& status, const std::vector<int64_t>& extra) {
  if (observer_ != nullptr && observer_->Recording()) {
    Trace(items);
    observer_->Done();
  }
  traced_ = nullptr;
  CompletionBatch batch;  // the user thread wakes once for the whole batch
  for (Item& it : items) {
    if (!it.has_entry) continue;
    Status s = status;
    if (!s.ok() && !it.response->is_error()) {
      s = Status(s.code(), TensorLabel(OpTypeName(it.response->op), it.response->name) + ": " +
                               s.message());
    }
    d_.queue->Complete(&it.entry, s, extra);
  }
}

void Executor::Trace(const Items& items) {
  if (traced_ == &items) return;
  observer_->Begin();
  for (const Item& it : items) observer_->Member(it.response->name, it.response->process_set);
  traced_ = &items;
}

void Executor::Phase(const Items& items, const char* activity) {
  if (observer_ == nullptr || !observer_->Recording()) return;
  Trace(items);
  observer_->Activity(activity);
}

Status Executor::RunAllreduce(Items& items, DataBackend* be) {
  const Response& r = *items.front().response;
  const int n = d_.sets->Size(r.process_set);
  AllreduceArgs a;
  a.dtype = r.dtype;
  a.ps = r.process_set;
  a.op = r.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.reduce_op;
  a.postscale = r.postscale * (r.reduce_op == ReduceOp::kAverage ? 1.0 / n : 1.0);
  const size_t esize = DataTypeSize(r.dtype);
  std::vector<int64_t> counts;
  for (const Item& it : items) counts.push_back(NumElements(it.response->shape));
  for (int64_t c : counts) a.count += c;
  const bool ring = be->UsesRing(a.count * static_cast<int64_t>(esize),
                                 static_cast<int>(items.size()), a.dtype, a.op, a.ps);
  const char* algo = ring ? "RING_ALLREDUCE" : "MPI_ALLREDUCE";

  if (items.size() == 1 && items.front().has_entry) {  // alone: in place on the output
    TensorEntry& e = items.front().entry;
    ScaleCopy(e.output.data, e.input.data, a.count, r.dtype, r.prescale);
    a.buf = e.output.data;
    Phase(items, algo);
    return be->Allreduce(a);
  }
  if (ring) return RunFusedRing(items, be, &a, counts, n);
  if (n == 1) {  // nothing to exchange: scale each tensor where it is, no fusion buffer
    Phase(items, "SCALE_INPUTS");
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].has_entry) continue;
      TensorEntry& e = items[i].entry;
      ScaleCopy(e.output.data, e.input.data, counts[i], r.dtype, r.prescale);
      if (a.postscale != 1.0) Scale(e.output.data, counts[i], r.dtype, a.postscale);
    }
    return Status::Ok();
  }
  // MPI_Allreduce needs one contiguous buffer: pack, reduce, unpack.
  void* buf = d_.fusion->Reserve(static_cast<size_t>(a.count) * esize);
  if (buf == nullptr) return OutOfMemory(a.count * static_cast<int64_t>(esize));
  Phase(items, "MEMCPY_IN_FUSION_BUFFER");
  int64_t offset = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].has_entry) {
      ScaleCopy(At(buf, offset, esize), items[i].entry.input.data, counts[i], r.dtype, r.prescale);
    } else {
      std::memset(At(buf, offset, esize), 0, static_cast<size_t>(counts[i]) * esize);  // joined
    }
    offset += counts[i];
  }
  a.buf = buf;
  Phase(items, algo);
  HVDL_RETURN_IF_ERROR(be->Allreduce(a));
  Phase(items, "MEMCPY_OUT_FUSION_BUFFER");
  offset = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].has_entry) {
      std::memcpy(items[i].entry.output.data, At(buf, offset, esize),
                  static_cast<size_t>(counts[i]) * esize);
    }
    offset += counts[i];
  }
  return Status::Ok();
}

// The ring reduces the tensors where they are: each ring chunk is a list of spans inside the
// outputs, laid out chunk-major. Only prescaling (and out-of-place inputs) need a pass first.
Status Executor::RunFusedRing(Items& items, DataBackend* be, AllreduceArgs* a,
                              const std::vector<int64_t>& counts, int n) {
  const Response& r = *items.front().response;
  const size_t esize = DataTypeSize(r.dtype);
  int64_t zeros = 0;  // joined ranks contribute zeros for tensors they do not have
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].has_entry) zeros += counts[i];
  }
  void* zero_buf = nullptr;
  if (zeros > 0) {
    zero_buf = d_.fusion->Reserve(static_cast<size_t>(zeros) * esize);
    if (zero_buf == nullptr) return OutOfMemory(zeros * static_cast<int64_t>(esize));
    std::memset(zero_buf, 0, static_cast<size_t>(zeros) * esize);
  }
  std::vector<char*> base(items.size());
  int64_t zero_offset = 0;
  bool copies = r.prescale != 1.0;
  for (const Item& it : items) copies = copies || (it.has_entry && it.entry.input.data != it.entry.output.data);
  if (copies) Phase(items, "SCALE_INPUTS");
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].has_entry) {
      TensorEntry& e = items[i].entry;
      ScaleCopy(e.output.data, e.input.data, counts[i], r.dtype, r.prescale);
      base[i] = static_cast<char*>(e.output.data);
    } else {
      base[i] = At(zero_buf, zero_offset, esize);
      zero_offset += counts[i];
    }
  }
  for (const auto& pieces : ChunkPieces(counts, n)) {
    a->chunks.emplace_back();
    for (const Piece& p : pieces) {
      a->chunks.back().push_back(Span{base[p.item] + p.offset * static_cast<int64_t>(esize),
                                      p.count});
    }
  }
  Phase(items, "RING_ALLREDUCE");
  return be->Allreduce(*a);
}

Status Executor::OutOfMemory(int64_t bytes) const {
  return Status::Internal("out of memory allocating a " + std::to_string(bytes) +
                          "-byte fusion buffer; lower HOROVOD_FUSION_THRESHOLD");
}

Status Executor::RunAllgather(Items& items, DataBackend* be) {
  const Response& r0 = *items.front().response;
  const int n = d_.sets->Size(r0.process_set);
  const int me = d_.sets->RankIn(r0.process_set, d_.rank);
  const size_t esize = DataTypeSize(r0.dtype);
  std::vector<const Response*> rs;
  for (const Item& it : items) rs.push_back(it.response);
  const FusedLayout layout = AllgatherLayout(rs, n);
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (size_t i = 0; i < items.size(); ++i) {
    TensorEntry& e = items[i].entry;
    HVDL_RETURN_IF_ERROR(e.allocate(layout.out_shapes[i], &e.output));
    inputs.push_back(e.input.data);
    outputs.push_back(e.output.data);
  }
  if (items.size() == 1) {
    Phase(items, "MPI_ALLGATHER");
    return be->Allgatherv(inputs[0], outputs[0], layout.counts, r0.dtype, r0.process_set);
  }
  void* buf = d_.fusion->Reserve(static_cast<size_t>(layout.total) * esize);
  if (buf == nullptr) return OutOfMemory(layout.total * static_cast<int64_t>(esize));
  Phase(items, "MEMCPY_IN_FUSION_BUFFER");
  CopyRegions(AllgatherPack(rs, inputs, layout, me, buf, esize), r0.dtype, 1.0);
  Phase(items, "MPI_ALLGATHER");
  HVDL_RETURN_IF_ERROR(be->Allgatherv(nullptr, buf, layout.counts, r0.dtype, r0.process_set));
  Phase(items, "MEMCPY_OUT_FUSION_BUFFER");
  CopyRegions(AllgatherUnpack(rs, outputs, layout, buf, esize), r0.dtype, 1.0);
  return Status::Ok();
}

Status Executor::RunReducescatter(Items& items, DataBackend* be) {
  const Response& r0 = *items.front().response;
  const int n = d_.sets->Size(r0.process_set);
  const int me = d_.sets->RankIn(r0.process_set, d_.rank);
  const size_t esize = DataTypeSize(r0.dtype);
  const ReduceOp op = r0.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r0.reduce_op;
  const double post = r0.postscale * (r0.reduce_op == ReduceOp::kAverage ? 1.0 / n : 1.0);
  std::vector<const Response*> rs;
  for (const Item& it : items) rs.push_back(it.response);
  const FusedLayout layout = ReducescatterLayout(rs, n, me);
  std::vector<const void*> inputs;
  for (size_t i = 0; i < items.size(); ++i) {
    TensorEntry& e = items[i].entry;
    HVDL_RETURN_IF_ERROR(e.allocate(layout.out_shapes[i], &e.output));
    inputs.push_back(e.input.data);
  }
  const int64_t mine = layout.counts[static_cast<size_t>(me)];
  void* buf = d_.fusion->Reserve(static_cast<size_t>(layout.total + mine) * esize);
  if (buf == nullptr) return OutOfMemory((layout.total + mine) * static_cast<int64_t>(esize));
  Phase(items, "MEMCPY_IN_FUSION_BUFFER");
  CopyRegions(ReducescatterPack(rs, inputs, n, buf, esize), r0.dtype, r0.prescale);
  void* recv = At(buf, layout.total, esize);
  Phase(items, "MPI_REDUCESCATTER");
  HVDL_RETURN_IF_ERROR(be->ReduceScatter(buf, recv, layout.counts, r0.dtype, op, r0.process_set));
  Phase(items, "MEMCPY_OUT_FUSION_BUFFER");
  int64_t src = 0;
  for (Item& it : items) {
    int64_t c = NumElements(it.entry.output.shape);
    ScaleCopy(it.entry.output.data, At(recv, src, esize), c, r0.dtype, post);
    src += c;
  }
  return Status::Ok();
}

Status Executor::RunBroadcast(Items& items, DataBackend* be) {
  Item& item = items.front();
  const Response& r = *item.response;
  const int root = d_.sets->RankIn(r.process_set, r.root);
  TensorEntry& e = item.entry;
  const int64_t count = NumElements(r.shape);
  if (d_.rank == r.root && e.output.data != e.input.data) {
    std::memcpy(e.output.data, e.input.data, static_cast<size_t>(count) * DataTypeSize(r.dtype));
  }
  Phase(items, "MPI_BROADCAST");
  return be->Broadcast(e.output.data, count, r.dtype, root, r.process_set);
}

Status Executor::RunAlltoall(Items& items, DataBackend* be, std::vector<int64_t>* received) {
  Item& item = items.front();
  const Response& r = *item.response;
  AlltoallLayout l = PlanAlltoall(r, d_.sets->Size(r.process_set),
                                  d_.sets->RankIn(r.process_set, d_.rank));
  *received = std::move(l.received);
  HVDL_RETURN_IF_ERROR(item.entry.allocate(l.out_shape, &item.entry.output));
  Phase(items, "MPI_ALLTOALL");
  return be->Alltoallv(item.entry.input.data, l.send, item.entry.output.data, l.recv, r.dtype,
                       r.process_set);
}

// Device batches (see core/device_executor.h); the CPU paths above never come here.
Status Executor::RunOnDevice(Items& items, DataBackend* be, std::vector<int64_t>* extra) {
  if (!device_) {
    return Status::Internal("a collective on " + DeviceName(items.front().response->device) +
                            " reached a build without device support");
  }
  std::vector<DeviceItem> device_items;
  for (Item& it : items) {
    device_items.push_back(DeviceItem{it.response, it.has_entry ? &it.entry : nullptr});
  }
  return device_->Run(device_items, be, [&](const char* activity) { Phase(items, activity); },
                      extra);
}

Status Executor::RunProcessSet(Item& item, std::vector<int64_t>* extra) {
  const Response& r = *item.response;
  if (r.op == OpType::kProcessSetAdd) {
    std::vector<int> ranks(r.sizes.begin(), r.sizes.end());
    int id = d_.sets->NextId();
    HVDL_RETURN_IF_ERROR(d_.backends->AddProcessSet(id, ranks));
    d_.sets->Add(id, ranks);
    *extra = {id};
    return Status::Ok();
  }
  int id = r.sizes.empty() ? -1 : static_cast<int>(r.sizes[0]);
  HVDL_RETURN_IF_ERROR(d_.backends->RemoveProcessSet(id));
  d_.sets->Remove(id);
  *extra = {id};
  return Status::Ok();
}

}  // namespace hvdl
