// MpiBackend: every data collective over MPI, plus horovodlite's own ring allreduce.
//
// Allreduce picks MPI_Allreduce or the ring (comm/ring over MpiTransport) per call:
//   HOROVOD_ALLREDUCE_ALGO=mpi|ring forces one. auto (measured on the development machine, see
//   README) uses
//   - the ring for fused batches from kFusedRingBytes: it reduces the tensors in place, while
//     MPI_Allreduce needs them packed into one buffer and unpacked again - two extra memory passes
//     that cost as much as the transfer on shared memory;
//   - MPI_Allreduce for a single tensor (in place, no copies; the ring is no faster there), unless
//     HOROVOD_RING_THRESHOLD is set and the tensor is at least that large;
//   - the ring for every floating-point Sum/Average/Product with 3 or more ranks, so that results
//     never depend on fusion (MPI_Allreduce's association changes with message size; the ring's
//     does not, see ring.h).
// Hierarchical allreduce (comm/hierarchical: inside each host, then across hosts by all local
// ranks in parallel, then inside the host again, on the same chunk layout as the ring) is
// possible for process set 0 in a job that spans several hosts with the same number of ranks on
// each, more than one. HOROVOD_HIERARCHICAL_ALLREDUCE=1 sends every such allreduce through it;
// auto (the default) sends those that auto would run as a flat ring (fused batches, floating
// sums on 3+ ranks): across hosts each host link then carries the data once instead of
// 2(n-1)/n times one rank's share per ring edge - measured 1.4-1.5x the flat ring's bandwidth on
// 2 hosts x 2 ranks, as fast as MPI_Allreduce there - with the ring's determinism (the choice
// depends on the job's layout only). 1 where it is impossible is ignored (said once in the log).
// Hierarchical allgather (HierarchicalAllgatherv below) under the same conditions, unless
// HOROVOD_HIERARCHICAL_ALLGATHER=0.
// CPU tensors only; CUDA tensors reach MPI through host staging in the executor.
#pragma once

#include <map>
#include <memory>

#include "backends/mpi/mpi_transport.h"
#include "backends/mpi/mpi_world.h"
#include "comm/data_backend.h"
#include "common/config.h"

namespace hvdl {

class MpiBackend : public DataBackend {
 public:
  MpiBackend(MpiWorld* world, const Config& config);
  ~MpiBackend() override;
  const char* name() const override { return "mpi"; }
  bool Supports(OpType op, DataType dtype, int device) const override;
  Status AddProcessSet(int ps, const std::vector<int>& ranks) override;
  Status RemoveProcessSet(int ps) override;
  Status Allreduce(const AllreduceArgs& args) override;
  bool UsesRing(int64_t bytes, int tensors, DataType dtype, ReduceOp op,
                int ps) const override;
  int SetSize(int ps) const override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype, int ps) override;
  Status Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype, int ps) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op, int ps) override;

  void SetAllreduceAlgorithm(AllreduceAlgorithm algo) override { algorithm_ = algo; }
  int single_copy_transports() const override;
  int single_copy_peers() const override;
  int64_t hierarchical_allreduces() const override { return hierarchical_calls_; }
  int64_t hierarchical_allgathers() const override { return hierarchical_allgathers_; }

  static constexpr int64_t kFusedRingBytes = 256 * 1024;
  // From this many bytes gathered in all, auto gathers hierarchically.
  static constexpr int64_t kHierarchicalAllgatherBytes = 256 * 1024;

 private:
  Status Comm(int ps, MPI_Comm* comm) const;
  // Comm, then a CPU-friendly meeting of every member (see Meet in the .cc): call first in
  // every collective.
  Status Begin(int ps, MPI_Comm* comm) const;
  MpiTransport* TransportFor(int ps);
  // Whether an allreduce of process set `ps` goes through comm/hierarchical; `ring`: auto
  // would run it as a flat ring (see the top of this file).
  bool Hierarchical(int ps, bool ring) const;
  // Our copies of the node and cross communicators and the layout table (first use; collective
  // over process set 0, reached in the same order on every rank).
  Status HierarchicalComms();
  Status HierarchicalTransports(MpiTransport** local, MpiTransport** cross);
  // Allgatherv over process set 0 in two steps: across hosts between the ranks of equal local
  // rank (each block crosses the network once per host), then inside each host once per host
  // index. `recv` holds this rank's block at its place already.
  Status HierarchicalAllgatherv(void* recv, const std::vector<int>& counts,
                                const std::vector<int>& displs, MPI_Datatype type);

  MpiWorld* world_;
  AllreduceAlgorithm algorithm_;
  int64_t ring_threshold_;
  // Ring segments inside one host and on rings that cross hosts (both HOROVOD_RING_SEGMENT_BYTES
  // when it is set). Over TCP, Open MPI sends up to 64 KiB eagerly and larger messages after a
  // handshake; measured on the test hosts (2 hosts x 1 rank, 1 Gbit/s, MLP train step): 64 KiB
  // 306 ms, 128 KiB 331 ms, 256 KiB 326 ms (DDP 304 ms). On one host 256 KiB was best.
  size_t segment_bytes_;
  size_t network_segment_bytes_;
  static constexpr size_t kHostSegmentBytes = 256 * 1024;
  static constexpr size_t kNetworkSegmentBytes = 64 * 1024;
  bool single_copy_;
  std::map<int, std::unique_ptr<MpiTransport>> transports_;
  bool hierarchy_;  // several hosts, the same number of ranks on each, more than one
  Toggle hierarchical_allreduce_;
  Toggle hierarchical_allgather_;  // kOff where the job's layout does not allow it
  MPI_Comm local_comm_ = MPI_COMM_NULL, cross_comm_ = MPI_COMM_NULL;  // ours (dups)
  // rank_at_[h * local_size + l]: the rank with cross rank h and local rank l
  std::vector<int> rank_at_;
  std::unique_ptr<MpiTransport> local_, cross_;
  int64_t hierarchical_calls_ = 0;
  int64_t hierarchical_allgathers_ = 0;
};

}  // namespace hvdl
