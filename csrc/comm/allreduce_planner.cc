#include "comm/allreduce_planner.h"

#include "common/logging.h"

namespace hvdl {

ReductionScaling ScalingFor(ReduceOp op, int set_size, double prescale, double postscale) {
  if (op == ReduceOp::kAverage) {
    return {ReduceOp::kSum, prescale, postscale * (1.0 / set_size)};
  }
  return {op, prescale, postscale};
}

AllreducePlanner::AllreducePlanner(const Config& config, const Fabric* fabric,
                                   const BackendRegistry* registry)
    : fabric_(fabric),
      registry_(registry),
      algorithm_(config.allreduce_algorithm),
      ring_threshold_(config.ring_threshold_bytes != Config::kRingThresholdAuto
                          ? config.ring_threshold_bytes
                      : fabric != nullptr && !fabric->spans_hosts() && config.ring_single_copy
                          ? kAutoRingThresholdBytes
                          : -1),
      segment_bytes_(config.ring_segment_bytes > 0
                         ? static_cast<size_t>(config.ring_segment_bytes)
                         : kHostSegmentBytes),
      network_segment_bytes_(config.ring_segment_bytes > 0
                                 ? static_cast<size_t>(config.ring_segment_bytes)
                             : fabric != nullptr ? fabric->network_segment_bytes()
                                                 : kNetworkSegmentBytes),
      hierarchical_(config.hierarchical_allreduce),
      device_hierarchical_(config.hierarchical_allreduce == Toggle::kOn && fabric != nullptr &&
                           fabric->homogeneous()) {
  const bool rank0 = fabric != nullptr && fabric->SetRank(0) == 0;
  if (hierarchical_ == Toggle::kOn && rank0 && !fabric->hierarchical()) {
    HVDL_LOG(Warning) << "HOROVOD_HIERARCHICAL_ALLREDUCE=1 ignored for host tensors: it needs "
                      << "several hosts with the same number of ranks on each, and more than "
                      << "one on some (this job: "
                      << (fabric->spans_hosts() ? "several hosts" : "one host") << ", "
                      << (fabric->homogeneous() ? "the same number" : "different numbers")
                      << " of ranks per host); the flat ring is used";
  }
  if (hierarchical_ == Toggle::kOn && rank0 && !fabric->homogeneous()) {
    HVDL_LOG(Warning) << "HOROVOD_HIERARCHICAL_ALLREDUCE needs the same number of ranks on "
                      << "every host; device tensors use the flat NCCL allreduce instead";
  }
}

bool AllreducePlanner::Hierarchical(int ps, bool ring) const {
  if (fabric_ == nullptr || !fabric_->hierarchical() || ps != 0) return false;
  return hierarchical_ == Toggle::kOn ||
         (hierarchical_ == Toggle::kAuto && algorithm_ == AllreduceAlgorithm::kAuto && ring);
}

bool AllreducePlanner::Ring(const AllreduceQuery& q) const {
  if (algorithm_ == AllreduceAlgorithm::kRing || Hierarchical(q.ps, false)) return true;
  if (algorithm_ == AllreduceAlgorithm::kMpi || q.set_size <= 1) return false;
  const bool non_associative =
      IsFloatingPoint(q.dtype) &&
      (q.op == ReduceOp::kSum || q.op == ReduceOp::kAverage || q.op == ReduceOp::kProduct);
  if (q.set_size >= 3 && non_associative) return true;
  if (q.tensors > 1 && q.bytes >= kFusedRingBytes) return true;
  return ring_threshold_ >= 0 && q.bytes >= ring_threshold_;
}

void AllreducePlanner::PlanHost(const AllreduceQuery& q, AllreducePlan* out) const {
  const bool transports = fabric_ != nullptr && out->backend != nullptr &&
                          out->backend->runs_algorithms();
  const bool ring = transports && Ring(q);
  if (ring && Hierarchical(q.ps, true)) {
    out->algorithm = AllreducePlan::Algorithm::kHierarchical;
    out->segment_bytes = segment_bytes_;
    out->cross_segment_bytes = network_segment_bytes_;
  } else if (ring) {
    out->algorithm = AllreducePlan::Algorithm::kRing;
    // A ring in a job over several hosts has network links (a process set's may not). Every
    // member must use the same size - their messages must match: the job spans hosts on every
    // rank alike (a member's own host count would not do).
    out->segment_bytes = fabric_->spans_hosts() ? network_segment_bytes_ : segment_bytes_;
  } else {
    out->algorithm = AllreducePlan::Algorithm::kNative;
  }
  out->spans = ring && q.tensors > 1;
  out->activity = out->algorithm == AllreducePlan::Algorithm::kHierarchical
                      ? "HIERARCHICAL_ALLREDUCE"
                  : ring ? "RING_ALLREDUCE"
                         : "MPI_ALLREDUCE";
}

Status AllreducePlanner::Plan(const AllreduceQuery& q, AllreducePlan* out) const {
  *out = AllreducePlan();
  HVDL_RETURN_IF_ERROR(registry_->Select(OpType::kAllreduce, q.dtype, q.device, &out->backend));
  const ReductionScaling s = ScalingFor(q.op, q.set_size, q.prescale, q.postscale);
  out->op = s.op;
  out->prescale = s.prescale;
  out->postscale = s.postscale;
  if (q.device == kCpuDevice) {
    PlanHost(q, out);
    return Status::Ok();
  }
  const bool nccl = out->backend->native_device();
  out->algorithm = nccl && device_hierarchical_ && q.ps == 0
                       ? AllreducePlan::Algorithm::kHierarchical
                       : AllreducePlan::Algorithm::kNative;
  out->activity = nccl ? "NCCL_ALLREDUCE" : "MPI_ALLREDUCE";
  return Status::Ok();
}

}  // namespace hvdl
