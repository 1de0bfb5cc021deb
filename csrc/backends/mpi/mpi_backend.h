// MpiBackend: MPI's native collectives on CPU buffers (MPI_Allreduce, MPI_Allgatherv,
// MPI_Bcast, MPI_Alltoallv, MPI_Reduce_scatter) for the host collectives
// (comm/host_collectives), which run horovodlite's own algorithms over MpiFabric's transports
// and call these where the planner or the op picks MPI's. Before each call the members meet in a
// non-blocking barrier waited on politely (see Meet in the .cc).
// Hierarchical allgather (HierarchicalAllgatherv below): across hosts between the ranks of equal
// local rank, then inside each host, for process set 0 of a job over several hosts with the same
// number of ranks on each, more than one; HOROVOD_HIERARCHICAL_ALLGATHER=0 turns it off, auto
// uses it from kHierarchicalAllgatherBytes.
// The world's process sets belong to MpiFabric (it adds and removes them); this backend reads
// their communicators. CUDA tensors reach MPI through host staging.
#pragma once

#include <map>
#include <memory>

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
  // MPI_Allreduce of args.buf in place, then args.postscale (args.chunks must be empty).
  Status Allreduce(const AllreduceArgs& args) override;
  int SetSize(int ps) const override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype, int ps) override;
  Status Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype, int ps) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op, int ps) override;

  int64_t hierarchical_allgathers() const override { return hierarchical_allgathers_; }

  // From this many bytes gathered in all, auto gathers hierarchically.
  static constexpr int64_t kHierarchicalAllgatherBytes = 256 * 1024;

 private:
  Status Comm(int ps, MPI_Comm* comm) const;
  // Comm, then a CPU-friendly meeting of every member (see Meet in the .cc): call first in
  // every collective.
  Status Begin(int ps, MPI_Comm* comm) const;
  // Our copies of the node and cross communicators and the layout table (first use; collective
  // over process set 0, reached in the same order on every rank).
  Status HierarchicalComms();
  // Allgatherv over process set 0 in two steps: across hosts between the ranks of equal local
  // rank (each block crosses the network once per host), then inside each host once per host
  // index. `recv` holds this rank's block at its place already.
  Status HierarchicalAllgatherv(void* recv, const std::vector<int>& counts,
                                const std::vector<int>& displs, MPI_Datatype type);

  MpiWorld* world_;
  bool hierarchy_;  // several hosts, the same number of ranks on each, more than one
  Toggle hierarchical_allgather_;  // kOff where the job's layout does not allow it
  MPI_Comm local_comm_ = MPI_COMM_NULL, cross_comm_ = MPI_COMM_NULL;  // ours (dups)
  // rank_at_[h * local_size + l]: the rank with cross rank h and local rank l
  std::vector<int> rank_at_;
  int64_t hierarchical_allgathers_ = 0;
};

}  // namespace hvdl
