// AllreducePlanner: the one place that decides how an allreduce runs, for host and device
// memory alike - which backend, which algorithm (flat ring, hierarchical, or the backend's
// native collective: MPI_Allreduce, NCCL), the ring segments, and where Average and the scale
// factors are applied. The executor asks it once per batch and runs the plan; a transport only
// moves bytes.
//
// Algorithms on host memory (the host collectives, comm/host_collectives):
//   HOROVOD_ALLREDUCE_ALGO=mpi|ring forces the native collective or the ring. auto (measured on
//   the development machine, see README) uses
//   - the ring for fused batches from kFusedRingBytes: it reduces the tensors in place, as spans
//     laid out chunk-major, while a native allreduce needs them packed into one buffer and
//     unpacked again - two extra memory passes that cost as much as the transfer on one host;
//   - the native collective for a single tensor (in place, no copies) below
//     HOROVOD_RING_THRESHOLD, the ring from it. auto: kAutoRingThresholdBytes in a job on one
//     host whose ring copies once (HOROVOD_RING_CMA), where it beat MPI_Allreduce from there on
//     (Open MPI 5, 2 ranks, 2-core VM, 2026-11-28: 16 MiB 0.73-0.96x, 64 MiB 0.62-0.63x MPI's
//     time, Average included; 4 MiB 1.06-1.42x against native's 1.06-1.14x of MPI, in cache);
//     never across hosts (not measured there);
//   - the ring for every floating-point Sum/Average/Product with 3 or more ranks, so that results
//     never depend on fusion (MPI_Allreduce's association changes with message size; the
//     ring's does not, see ring.h).
//   Hierarchical (comm/hierarchical: inside each host, then across hosts by all local ranks in
//   parallel, then inside the host again, on the same chunk layout as the ring) is possible for
//   process set 0 in a job over several hosts with the same number of ranks on each, more than
//   one. HOROVOD_HIERARCHICAL_ALLREDUCE=1 sends every such allreduce through it; auto (the
//   default) sends those that auto would run as a flat ring: across hosts each host link then
//   carries the data once instead of 2(n-1)/n times one rank's share per ring edge - measured
//   1.4-1.5x the flat ring's bandwidth on 2 hosts x 2 ranks, as fast as MPI_Allreduce there -
//   with the ring's determinism (the choice depends on the job's layout only).
//   Ring segments: 256 KiB inside a host, 64 KiB on rings that cross hosts (over TCP, Open MPI
//   sends up to 64 KiB eagerly; measured on the test hosts, 2 hosts x 1 rank at 1 Gbit/s, MLP
//   train step: 64 KiB 306 ms, 128 KiB 331 ms, 256 KiB 326 ms, DDP 304 ms); both are
//   HOROVOD_RING_SEGMENT_BYTES when it is set. Every member uses the same size: their messages
//   must match, so the choice depends on the job, not on the member.
// Device memory: the first device backend that supports the op and dtype (NCCL, else host
// staging, which plans its host part here again), natively; with
// HOROVOD_HIERARCHICAL_ALLREDUCE=1, NCCL's hierarchical form for process set 0 when every host
// runs the same number of ranks.
// Scaling: Average is a Sum whose postscale is multiplied by 1/size; the prescale is applied by
// the executor (while packing, or in place), the postscale by the backend as it completes the
// result (the ring folds it into its last reduction step, NCCL divides on the way, MPI scales
// after the call).
//
// Background thread only (autotune changes the algorithm between cycles).
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/backend_registry.h"
#include "comm/fabric.h"
#include "common/config.h"
#include "common/types.h"

namespace hvdl {

struct AllreduceQuery {
  int64_t bytes = 0;  // payload of the whole batch
  int tensors = 1;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // the user's op (Average allowed)
  double prescale = 1.0;
  double postscale = 1.0;
  int ps = 0;
  int device = kCpuDevice;
  int set_size = 1;
};

struct AllreducePlan {
  enum class Algorithm { kNative, kRing, kHierarchical };
  Algorithm algorithm = Algorithm::kNative;
  DataBackend* backend = nullptr;  // runs it
  // Host tensors of a fused batch are reduced where they are, as chunk-major ring spans,
  // without the fusion buffer.
  bool spans = false;
  ReduceOp op = ReduceOp::kSum;  // what the collective reduces (Average: Sum)
  double prescale = 1.0;         // the executor applies it to the inputs
  double postscale = 1.0;        // the backend applies it to the result (Average folded in)
  size_t segment_bytes = 0;      // ring / hierarchical: inside a host, or the flat ring's
  size_t cross_segment_bytes = 0;  // hierarchical: across hosts
  const char* activity = "MPI_ALLREDUCE";  // timeline name of the collective (static string)
};

// What a reduction applies, from the user's op: Average -> Sum with postscale * 1/n.
struct ReductionScaling {
  ReduceOp op;
  double prescale;
  double postscale;
};
ReductionScaling ScalingFor(ReduceOp op, int set_size, double prescale, double postscale);

class AllreducePlanner {
 public:
  static constexpr int64_t kFusedRingBytes = 256 * 1024;
  static constexpr int64_t kAutoRingThresholdBytes = 8 << 20;
  static constexpr size_t kHostSegmentBytes = 256 * 1024;
  static constexpr size_t kNetworkSegmentBytes = 64 * 1024;

  // `fabric` may be null (backends without transports: only native plans). Neither is owned.
  AllreducePlanner(const Config& config, const Fabric* fabric, const BackendRegistry* registry);

  Status Plan(const AllreduceQuery& query, AllreducePlan* out) const;
  // The host algorithm for `query` (host collectives plan contiguous buffers with it).
  void PlanHost(const AllreduceQuery& query, AllreducePlan* out) const;
  // Autotune, in the agreed order: the algorithm in force from the next cycle.
  void set_algorithm(AllreduceAlgorithm algorithm) { algorithm_ = algorithm; }

 private:
  bool Ring(const AllreduceQuery& q) const;
  bool Hierarchical(int ps, bool ring) const;

  const Fabric* fabric_;
  const BackendRegistry* registry_;
  AllreduceAlgorithm algorithm_;
  int64_t ring_threshold_;
  size_t segment_bytes_;
  size_t network_segment_bytes_;
  Toggle hierarchical_;
  bool device_hierarchical_;  // HOROVOD_HIERARCHICAL_ALLREDUCE=1 and every host alike
};

}  // namespace hvdl
