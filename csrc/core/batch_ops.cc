#include "core/batch_ops.h"

#include <algorithm>

#include "comm/ring.h"
#include "core/collective_layout.h"

namespace hvdl {
namespace {

// Timeline name of a collective other than allreduce (static strings: the timeline keeps the
// pointer).
const char* Activity(const DataBackend* be, OpType op) {
  const bool nccl = be->native_device();
  switch (op) {
    case OpType::kAllgather: return nccl ? "NCCL_ALLGATHER" : "MPI_ALLGATHER";
    case OpType::kBroadcast: return nccl ? "NCCL_BROADCAST" : "MPI_BROADCAST";
    case OpType::kAlltoall: return nccl ? "NCCL_ALLTOALL" : "MPI_ALLTOALL";
    case OpType::kReducescatter: return nccl ? "NCCL_REDUCESCATTER" : "MPI_REDUCESCATTER";
    default: return "COLLECTIVE";
  }
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

// Where an item's result goes, in order: its output, or the runs of a tensor in pieces
// (TensorEntry::pieces, reduced in place).
std::vector<Span> Runs(const BatchItem& it, int64_t count) {
  if (!it.entry.pieces.empty()) return it.entry.pieces;
  return {Span{it.entry.output.data, count}};
}

bool HasPieces(const BatchItems& items) {
  for (const BatchItem& it : items) {
    if (it.has_entry && !it.entry.pieces.empty()) return true;
  }
  return false;
}

// The first tensor's memory when every item is reduced in place and each run starts where the
// one before it ends (one region, in the batch's order); null otherwise.
void* Adjacent(const BatchItems& items, const std::vector<int64_t>& counts, size_t esize) {
  const char* next = nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].has_entry) return nullptr;
    const TensorEntry& e = items[i].entry;
    if (e.input.data != e.output.data) return nullptr;
    for (const Span& run : Runs(items[i], counts[i])) {
      if (next != nullptr && run.data != next) return nullptr;
      next = static_cast<const char*>(run.data) + run.count * static_cast<int64_t>(esize);
    }
  }
  return items.empty() ? nullptr : items.front().entry.output.data;
}

// Two members: chunk the tensors' concatenation evenly, as one tensor of their total size. With
// two ranks every element is a + b whichever rank adds it, so the layout cannot change a result,
// and tensors that lie side by side (a bucket's views) then make one span per chunk.
std::vector<std::vector<Piece>> ConcatenatedPieces(const std::vector<int64_t>& counts,
                                                   int nchunks) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<std::vector<Piece>> chunks(static_cast<size_t>(nchunks));
  const std::vector<int64_t> even = EvenChunks(total, nchunks);
  size_t item = 0;
  int64_t offset = 0;  // in counts[item]
  for (int k = 0; k < nchunks; ++k) {
    int64_t left = even[static_cast<size_t>(k)];
    while (left > 0) {
      while (offset == counts[item]) {
        ++item;
        offset = 0;
      }
      const int64_t n = std::min(left, counts[item] - offset);
      chunks[static_cast<size_t>(k)].push_back(Piece{item, offset, n});
      offset += n;
      left -= n;
    }
  }
  return chunks;
}

std::vector<const Response*> Responses(const BatchItems& items) {
  std::vector<const Response*> rs;
  rs.reserve(items.size());
  for (const BatchItem& it : items) rs.push_back(it.response);
  return rs;
}

}  // namespace

Status BatchOps::Run(BatchItems& items, BatchMemory* memory, const Phase& phase,
                     DataBackend** be, std::vector<int64_t>* extra) {
  const Response& r = *items.front().response;
  *be = nullptr;
  if (r.op == OpType::kAllreduce) return Allreduce(items, memory, phase, be);
  HVDL_RETURN_IF_ERROR(registry_->Select(r.op, r.dtype, r.device, be));
  switch (r.op) {
    case OpType::kAllgather: return Allgather(items, memory, *be, phase);
    case OpType::kReducescatter: return Reducescatter(items, memory, *be, phase);
    case OpType::kBroadcast: return Broadcast(items, memory, *be, phase);
    case OpType::kAlltoall: return Alltoall(items, memory, *be, phase, extra);
    default:
      return Status::Internal(std::string("the executor cannot run ") + OpTypeName(r.op) +
                              " as a data collective");
  }
}

Status BatchOps::Allreduce(BatchItems& items, BatchMemory* m, const Phase& phase,
                           DataBackend** be) {
  const Response& r = *items.front().response;
  const int n = sets_->Size(r.process_set);
  const size_t esize = DataTypeSize(r.dtype);
  std::vector<int64_t> counts;
  counts.reserve(items.size());
  AllreduceArgs a;
  for (const BatchItem& it : items) counts.push_back(NumElements(it.response->shape));
  for (int64_t c : counts) a.count += c;
  AllreduceQuery q;
  q.bytes = a.count * static_cast<int64_t>(esize);
  q.tensors = static_cast<int>(items.size());
  q.dtype = r.dtype;
  q.op = r.reduce_op;
  q.prescale = r.prescale;
  q.postscale = r.postscale;
  q.ps = r.process_set;
  q.device = r.device;
  q.set_size = n;
  AllreducePlan plan;
  HVDL_RETURN_IF_ERROR(planner_->Plan(q, &plan));
  *be = plan.backend;
  a.dtype = r.dtype;
  a.ps = r.process_set;
  a.op = plan.op;
  a.postscale = plan.postscale;
  a.plan = &plan;
  HVDL_RETURN_IF_ERROR(m->WaitReady(items));

  if (items.size() == 1 && items.front().has_entry &&
      items.front().entry.pieces.empty()) {  // alone: in place on the output
    TensorEntry& e = items.front().entry;
    if (e.output.data != e.input.data || plan.prescale != 1.0) {
      HVDL_RETURN_IF_ERROR(m->CopyOne(e.output.data, e.input.data, a.count, r.dtype,
                                      plan.prescale));
    }
    a.buf = e.output.data;
    a.phase = phase;
    phase(plan.activity);
    return plan.backend->Allreduce(a);
  }
  // A tensor in pieces takes the ring as the spans of its runs (the ring chunks it as one
  // tensor); MPI_Allreduce needs it packed like a fused batch.
  if (plan.spans ||
      (plan.algorithm != AllreducePlan::Algorithm::kNative && HasPieces(items))) {
    return FusedRing(items, m, plan, &a, counts, n, phase);
  }
  if (n == 1 && m->host()) {  // nothing to exchange: scale each tensor where it is
    phase("SCALE_INPUTS");
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].has_entry) continue;
      TensorEntry& e = items[i].entry;
      if (e.pieces.empty()) {
        HVDL_RETURN_IF_ERROR(m->CopyOne(e.output.data, e.input.data, counts[i], r.dtype,
                                        plan.prescale));
      }
      for (const Span& run : Runs(items[i], counts[i])) {
        if (!e.pieces.empty() && plan.prescale != 1.0) {
          HVDL_RETURN_IF_ERROR(m->CopyOne(run.data, run.data, run.count, r.dtype, plan.prescale));
        }
        if (plan.postscale != 1.0) {
          HVDL_RETURN_IF_ERROR(m->CopyOne(run.data, run.data, run.count, r.dtype, plan.postscale));
        }
      }
    }
    return Status::Ok();
  }
  if (void* region = Adjacent(items, counts, esize)) {
    // The tensors lie side by side, in place (a gradient bucket's views): the collective runs
    // on them where they are. Only this rank's memory differs from the packed case - the
    // collective and what goes on the wire are the same - so other ranks may pack theirs.
    if (plan.prescale != 1.0) {
      phase("SCALE_INPUTS");
      HVDL_RETURN_IF_ERROR(m->CopyOne(region, region, a.count, r.dtype, plan.prescale));
    }
    a.buf = region;
    a.phase = phase;
    phase(plan.activity);
    return plan.backend->Allreduce(a);
  }
  // One contiguous buffer for the collective: pack, reduce, unpack.
  void* buf = nullptr;
  HVDL_RETURN_IF_ERROR(m->Buffer(static_cast<size_t>(a.count) * esize, &buf));
  phase("MEMCPY_IN_FUSION_BUFFER");
  std::vector<CopyRegion> pack, unpack;
  pack.reserve(items.size());
  unpack.reserve(items.size());
  int64_t offset = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].has_entry && !items[i].entry.pieces.empty()) {
      int64_t at = offset;
      for (const Span& run : items[i].entry.pieces) {
        pack.push_back({At(buf, at, esize), run.data, run.count});
        unpack.push_back({run.data, At(buf, at, esize), run.count});
        at += run.count;
      }
    } else if (items[i].has_entry) {
      TensorEntry& e = items[i].entry;
      pack.push_back({At(buf, offset, esize), e.input.data, counts[i]});
      unpack.push_back({e.output.data, At(buf, offset, esize), counts[i]});
    } else {  // joined: zeros
      HVDL_RETURN_IF_ERROR(m->Zero(At(buf, offset, esize), static_cast<size_t>(counts[i]) * esize));
    }
    offset += counts[i];
  }
  HVDL_RETURN_IF_ERROR(m->Copy(pack, r.dtype, plan.prescale));
  a.buf = buf;
  a.phase = phase;
  phase(plan.activity);
  HVDL_RETURN_IF_ERROR(plan.backend->Allreduce(a));
  phase("MEMCPY_OUT_FUSION_BUFFER");
  return m->Copy(unpack, r.dtype, 1.0);
}

// The ring reduces the tensors where they are: each ring chunk is a list of spans inside the
// outputs (a tensor in pieces: inside its runs), laid out chunk-major - with two members, over
// the concatenation, so that tensors side by side make one span per chunk. Only prescaling (and
// out-of-place inputs) need a pass first.
Status BatchOps::FusedRing(BatchItems& items, BatchMemory* m, const AllreducePlan& plan,
                           AllreduceArgs* a, const std::vector<int64_t>& counts, int n,
                           const Phase& phase) {
  const Response& r = *items.front().response;
  const size_t esize = DataTypeSize(r.dtype);
  int64_t zeros = 0;  // joined ranks contribute zeros for tensors they do not have
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].has_entry) zeros += counts[i];
  }
  void* zero_buf = nullptr;
  if (zeros > 0) {
    HVDL_RETURN_IF_ERROR(m->Buffer(static_cast<size_t>(zeros) * esize, &zero_buf));
    HVDL_RETURN_IF_ERROR(m->Zero(zero_buf, static_cast<size_t>(zeros) * esize));
  }
  // Each item's runs of memory, and where each run starts in the item.
  std::vector<std::vector<Span>> runs(items.size());
  std::vector<std::vector<int64_t>> starts(items.size());
  int64_t zero_offset = 0;
  bool copies = plan.prescale != 1.0;
  for (const BatchItem& it : items) {
    copies = copies || (it.has_entry && it.entry.input.data != it.entry.output.data);
  }
  if (copies) phase("SCALE_INPUTS");
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].has_entry) {
      TensorEntry& e = items[i].entry;
      runs[i] = Runs(items[i], counts[i]);
      if (copies && e.pieces.empty()) {
        HVDL_RETURN_IF_ERROR(m->CopyOne(e.output.data, e.input.data, counts[i], r.dtype,
                                        plan.prescale));
      } else if (copies && plan.prescale != 1.0) {  // pieces are reduced in place
        for (const Span& run : runs[i]) {
          HVDL_RETURN_IF_ERROR(m->CopyOne(run.data, run.data, run.count, r.dtype,
                                          plan.prescale));
        }
      }
    } else {
      runs[i] = {Span{At(zero_buf, zero_offset, esize), counts[i]}};
      zero_offset += counts[i];
    }
    int64_t at = 0;
    for (const Span& run : runs[i]) {
      starts[i].push_back(at);
      at += run.count;
    }
  }
  // The chunk count the plan's algorithm splits the data into: the set's members (hierarchical:
  // local x cross, the same number on process set 0). A piece of an item may cross its runs.
  for (const auto& pieces : n == 2 ? ConcatenatedPieces(counts, n) : ChunkPieces(counts, n)) {
    std::vector<Span>& chunk = a->chunks.emplace_back();
    chunk.reserve(pieces.size());
    for (const Piece& p : pieces) {
      const std::vector<int64_t>& st = starts[p.item];
      size_t k = static_cast<size_t>(std::upper_bound(st.begin(), st.end(), p.offset) -
                                     st.begin()) - 1;
      int64_t offset = p.offset - st[k];
      int64_t left = p.count;
      while (left > 0) {
        const Span& run = runs[p.item][k];
        const int64_t take = std::min(left, run.count - offset);
        char* data = static_cast<char*>(run.data) + offset * static_cast<int64_t>(esize);
        if (take == 0) {  // an empty run
        } else if (!chunk.empty() && static_cast<char*>(chunk.back().data) +
                                      chunk.back().count * static_cast<int64_t>(esize) ==
                                  data) {
          chunk.back().count += take;  // this run starts where the last one ends
        } else {
          chunk.push_back(Span{data, take});
        }
        left -= take;
        ++k;
        offset = 0;
      }
    }
  }
  a->phase = phase;
  phase(plan.activity);
  return plan.backend->Allreduce(*a);
}

Status BatchOps::Allgather(BatchItems& items, BatchMemory* m, DataBackend* be,
                           const Phase& phase) {
  const Response& r0 = *items.front().response;
  const int n = sets_->Size(r0.process_set);
  const int me = sets_->RankIn(r0.process_set, rank_);
  const size_t esize = DataTypeSize(r0.dtype);
  const std::vector<const Response*> rs = Responses(items);
  const FusedLayout layout = AllgatherLayout(rs, n);
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (size_t i = 0; i < items.size(); ++i) {
    TensorEntry& e = items[i].entry;
    HVDL_RETURN_IF_ERROR(e.allocate(layout.out_shapes[i], &e.output));
    inputs.push_back(e.input.data);
    outputs.push_back(e.output.data);
  }
  HVDL_RETURN_IF_ERROR(m->WaitReady(items));  // after allocation: it re-records the ready events
  if (items.size() == 1) {
    phase(Activity(be, OpType::kAllgather));
    return be->Allgatherv(inputs[0], outputs[0], layout.counts, r0.dtype, r0.process_set);
  }
  void* buf = nullptr;
  HVDL_RETURN_IF_ERROR(m->Buffer(static_cast<size_t>(layout.total) * esize, &buf));
  phase("MEMCPY_IN_FUSION_BUFFER");
  HVDL_RETURN_IF_ERROR(m->Copy(AllgatherPack(rs, inputs, layout, me, buf, esize), r0.dtype, 1.0));
  phase(Activity(be, OpType::kAllgather));
  HVDL_RETURN_IF_ERROR(be->Allgatherv(nullptr, buf, layout.counts, r0.dtype, r0.process_set));
  phase("MEMCPY_OUT_FUSION_BUFFER");
  return m->Copy(AllgatherUnpack(rs, outputs, layout, buf, esize), r0.dtype, 1.0);
}

Status BatchOps::Reducescatter(BatchItems& items, BatchMemory* m, DataBackend* be,
                               const Phase& phase) {
  const Response& r0 = *items.front().response;
  const int n = sets_->Size(r0.process_set);
  const int me = sets_->RankIn(r0.process_set, rank_);
  const size_t esize = DataTypeSize(r0.dtype);
  const ReductionScaling scaling = ScalingFor(r0.reduce_op, n, r0.prescale, r0.postscale);
  const std::vector<const Response*> rs = Responses(items);
  const FusedLayout layout = ReducescatterLayout(rs, n, me);
  std::vector<const void*> inputs;
  for (size_t i = 0; i < items.size(); ++i) {
    TensorEntry& e = items[i].entry;
    HVDL_RETURN_IF_ERROR(e.allocate(layout.out_shapes[i], &e.output));
    inputs.push_back(e.input.data);
  }
  HVDL_RETURN_IF_ERROR(m->WaitReady(items));
  const int64_t mine = layout.counts[static_cast<size_t>(me)];
  void* buf = nullptr;
  HVDL_RETURN_IF_ERROR(m->Buffer(static_cast<size_t>(layout.total + mine) * esize, &buf));
  phase("MEMCPY_IN_FUSION_BUFFER");
  HVDL_RETURN_IF_ERROR(
      m->Copy(ReducescatterPack(rs, inputs, n, buf, esize), r0.dtype, scaling.prescale));
  void* recv = At(buf, layout.total, esize);
  phase(Activity(be, OpType::kReducescatter));
  HVDL_RETURN_IF_ERROR(
      be->ReduceScatterScratch(buf, recv, layout.counts, r0.dtype, scaling.op, r0.process_set));
  phase("MEMCPY_OUT_FUSION_BUFFER");
  std::vector<CopyRegion> unpack;
  int64_t src = 0;
  for (BatchItem& it : items) {
    const int64_t c = NumElements(it.entry.output.shape);
    unpack.push_back({it.entry.output.data, At(recv, src, esize), c});
    src += c;
  }
  return m->Copy(unpack, r0.dtype, scaling.postscale);
}

// Broadcast and alltoall batches hold one response (core/fusion fuses neither).
Status BatchOps::Broadcast(BatchItems& items, BatchMemory* m, DataBackend* be,
                           const Phase& phase) {
  BatchItem& item = items.front();
  const Response& r = *item.response;
  const int root = sets_->RankIn(r.process_set, r.root);
  TensorEntry& e = item.entry;
  const int64_t count = NumElements(r.shape);
  HVDL_RETURN_IF_ERROR(m->WaitReady(items));
  if (rank_ == r.root && e.output.data != e.input.data) {
    HVDL_RETURN_IF_ERROR(m->CopyOne(e.output.data, e.input.data, count, r.dtype, 1.0));
  }
  phase(Activity(be, OpType::kBroadcast));
  return be->Broadcast(e.output.data, count, r.dtype, root, r.process_set);
}

Status BatchOps::Alltoall(BatchItems& items, BatchMemory* m, DataBackend* be,
                          const Phase& phase, std::vector<int64_t>* received) {
  BatchItem& item = items.front();
  const Response& r = *item.response;
  AlltoallLayout l =
      PlanAlltoall(r, sets_->Size(r.process_set), sets_->RankIn(r.process_set, rank_));
  *received = std::move(l.received);
  HVDL_RETURN_IF_ERROR(item.entry.allocate(l.out_shape, &item.entry.output));
  HVDL_RETURN_IF_ERROR(m->WaitReady(items));
  phase(Activity(be, OpType::kAlltoall));
  return be->Alltoallv(item.entry.input.data, l.send, item.entry.output.data, l.recv, r.dtype,
                       r.process_set);
}

}  // namespace hvdl
