#include "comm/host_collectives.h"

#include "comm/hierarchical.h"
#include "comm/ring.h"
#include "comm/transport_collectives.h"

namespace hvdl {

HostCollectives::HostCollectives(Fabric* fabric, DataBackend* natives)
    : fabric_(fabric), natives_(natives) {}

bool HostCollectives::Supports(OpType op, DataType dtype, int device) const {
  return device == kCpuDevice;
}

Status HostCollectives::AddProcessSet(int ps, const std::vector<int>& ranks) {
  HVDL_RETURN_IF_ERROR(fabric_->AddProcessSet(ps, ranks));
  return natives_ != nullptr ? natives_->AddProcessSet(ps, ranks) : Status::Ok();
}

Status HostCollectives::RemoveProcessSet(int ps) {
  if (natives_ != nullptr) HVDL_RETURN_IF_ERROR(natives_->RemoveProcessSet(ps));
  return fabric_->RemoveProcessSet(ps);
}

size_t HostCollectives::Segment() const {
  return fabric_->spans_hosts() ? fabric_->network_segment_bytes()
                                : AllreducePlanner::kHostSegmentBytes;
}

Status HostCollectives::Begin(int ps, Transport** t) {
  HVDL_RETURN_IF_ERROR(fabric_->SetTransport(ps, t));
  return (*t)->size() > 1 ? fabric_->Meet(ps) : Status::Ok();
}

Status HostCollectives::Allreduce(const AllreduceArgs& a) {
  if (a.plan != nullptr) return RunPlan(*a.plan, a);
  // A buffer handed over without a plan (host staging): planned here as one tensor.
  AllreducePlan plan;
  plan.backend = this;
  AllreduceQuery q;
  q.bytes = a.count * static_cast<int64_t>(DataTypeSize(a.dtype));
  q.dtype = a.dtype;
  q.op = a.op;
  q.ps = a.ps;
  q.set_size = SetSize(a.ps);
  if (planner_ != nullptr) planner_->PlanHost(q, &plan);
  return RunPlan(plan, a);
}

Status HostCollectives::RunPlan(const AllreducePlan& plan, const AllreduceArgs& a) {
  using Algorithm = AllreducePlan::Algorithm;
  if (plan.algorithm == Algorithm::kNative) {
    if (!a.chunks.empty()) return Status::Internal("a native allreduce takes one buffer");
    if (natives_ != nullptr) return natives_->Allreduce(a);
  }
  const auto chunks = [&](int n) {
    return a.chunks.empty() ? ContiguousChunks(a.buf, EvenChunks(a.count, n), a.dtype) : a.chunks;
  };
  if (plan.algorithm == Algorithm::kHierarchical) {
    Transport *local, *cross;
    HVDL_RETURN_IF_ERROR(fabric_->HostTransports(&local, &cross));
    HVDL_RETURN_IF_ERROR(fabric_->Meet(a.ps));
    ++hierarchical_allreduces_;
    return HierarchicalAllreduce(local, cross, chunks(local->size() * cross->size()), a.dtype,
                                 a.op, a.postscale, plan.segment_bytes, plan.cross_segment_bytes,
                                 nullptr, a.phase);
  }
  Transport* t;
  HVDL_RETURN_IF_ERROR(Begin(a.ps, &t));
  const size_t segment = plan.segment_bytes > 0 ? plan.segment_bytes : Segment();
  return RingAllreduce(t, chunks(t->size()), a.dtype, a.op, a.postscale, segment, nullptr);
}

// Whether a gather-type collective of `counts` runs hierarchically under `toggle` (auto: from
// kHierarchicalAllgatherBytes in all): then `out` holds the host and cross transports, after
// the members met, and the columns; else out->local stays null.
Status HostCollectives::Hierarchical(Toggle toggle, const std::vector<int64_t>& counts,
                                     DataType dtype, int ps, HostLayout* out) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const int64_t bytes = total * static_cast<int64_t>(DataTypeSize(dtype));
  if (ps != 0 || !fabric_->hierarchical() || toggle == Toggle::kOff ||
      (toggle == Toggle::kAuto && bytes < kHierarchicalAllgatherBytes)) {
    return Status::Ok();
  }
  out->columns = fabric_->LocalRankColumns();
  if (out->columns.empty()) return Status::Ok();
  HVDL_RETURN_IF_ERROR(fabric_->HostTransports(&out->local, &out->cross));
  return fabric_->Meet(ps);
}

Status HostCollectives::Allgatherv(const void* send, void* recv,
                                   const std::vector<int64_t>& counts, DataType dtype, int ps) {
  if (natives_ != nullptr) return natives_->Allgatherv(send, recv, counts, dtype, ps);
  HostLayout h;
  HVDL_RETURN_IF_ERROR(Hierarchical(hierarchical_allgather_, counts, dtype, ps, &h));
  if (h.local != nullptr) {
    ++hierarchical_allgathers_;
    return HierarchicalAllgatherv(h.local, h.cross, send, recv, counts, dtype, h.columns,
                                  AllreducePlanner::kHostSegmentBytes, Segment());
  }
  Transport* t;
  HVDL_RETURN_IF_ERROR(Begin(ps, &t));
  return TransportAllgatherv(t, send, recv, counts, dtype, Segment());
}

Status HostCollectives::Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) {
  if (natives_ != nullptr) return natives_->Broadcast(buf, count, dtype, root, ps);
  Transport* t;
  HVDL_RETURN_IF_ERROR(Begin(ps, &t));
  return TransportBroadcast(t, buf, count, dtype, root);
}

Status HostCollectives::Alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                                  void* recv, const std::vector<int64_t>& recv_counts,
                                  DataType dtype, int ps) {
  if (natives_ != nullptr) {
    return natives_->Alltoallv(send, send_counts, recv, recv_counts, dtype, ps);
  }
  Transport* t;
  HVDL_RETURN_IF_ERROR(Begin(ps, &t));
  return TransportAlltoallv(t, send, send_counts, recv, recv_counts, dtype);
}

Status HostCollectives::ReduceScatter(const void* send, void* recv,
                                      const std::vector<int64_t>& counts, DataType dtype,
                                      ReduceOp op, int ps) {
  return Scatter(send, nullptr, recv, counts, dtype, op, ps);
}

Status HostCollectives::ReduceScatterScratch(void* work, void* recv,
                                             const std::vector<int64_t>& counts, DataType dtype,
                                             ReduceOp op, int ps) {
  return Scatter(work, work, recv, counts, dtype, op, ps);
}

Status HostCollectives::Scatter(const void* send, void* work, void* recv,
                                const std::vector<int64_t>& counts, DataType dtype, ReduceOp op,
                                int ps) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  // MPI's reduce-scatter (Open MPI 5, 2 ranks on one host, 64 MiB) took 2.5x its own allreduce
  // of the same bytes; the ring here takes about half of the ring allreduce. Small ones stay
  // native (one call, no meeting).
  if (natives_ != nullptr &&
      total * static_cast<int64_t>(DataTypeSize(dtype)) < kRingReduceScatterBytes) {
    return natives_->ReduceScatter(send, recv, counts, dtype, op, ps);
  }
  HostLayout h;
  HVDL_RETURN_IF_ERROR(Hierarchical(hierarchical_reducescatter_, counts, dtype, ps, &h));
  if (h.local != nullptr) {
    ++hierarchical_reducescatters_;
    return HierarchicalReduceScatter(h.local, h.cross, send, recv, counts, dtype, op, h.columns,
                                     AllreducePlanner::kHostSegmentBytes, Segment());
  }
  Transport* t;
  HVDL_RETURN_IF_ERROR(Begin(ps, &t));
  if (work != nullptr) {
    return TransportReduceScatterInPlace(t, work, recv, counts, dtype, op, Segment());
  }
  return TransportReduceScatter(t, send, recv, counts, dtype, op, Segment());
}

}  // namespace hvdl
