// HostCollectives: every collective on host memory, for a launch whose transports a Fabric
// provides, with or without native collectives of that transport family.
//
// Allreduce runs the planner's choice (comm/allreduce_planner): the flat ring over the set's
// transport, the hierarchical composition over the host and cross transports, or the natives'
// allreduce. The gather-type collectives run natively where the natives have them (MPI's are
// tuned and single-copy within a host), else over the set's transport (comm/
// transport_collectives). A launch with nothing but a Transport therefore runs every collective.
// Before a collective over transports the members meet (Fabric::Meet) so that nobody spins in
// it while a late peer still works.
//
// Registered first in the BackendRegistry for CPU buffers. Background thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/allreduce_planner.h"
#include "comm/data_backend.h"
#include "comm/fabric.h"

namespace hvdl {

class HostCollectives : public DataBackend {
 public:
  // `natives` may be null. None is owned; all must outlive this object. The planner is the
  // runtime's (it needs the registry this backend goes into, so it is set after construction).
  HostCollectives(Fabric* fabric, DataBackend* natives);
  void set_planner(const AllreducePlanner* planner) { planner_ = planner; }

  const char* name() const override { return natives_ != nullptr ? natives_->name() : "ring"; }
  bool Supports(OpType op, DataType dtype, int device) const override;
  bool runs_algorithms() const override { return true; }
  Status AddProcessSet(int ps, const std::vector<int>& ranks) override;
  Status RemoveProcessSet(int ps) override;
  int SetSize(int ps) const override { return fabric_->SetSize(ps); }

  Status Allreduce(const AllreduceArgs& args) override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype, int ps) override;
  Status Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype, int ps) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op, int ps) override;
  Status ReduceScatterScratch(void* work, void* recv, const std::vector<int64_t>& counts,
                              DataType dtype, ReduceOp op, int ps) override;

  int single_copy_transports() const override { return fabric_->single_copy_transports(); }
  int single_copy_peers() const override { return fabric_->single_copy_peers(); }
  int64_t hierarchical_allreduces() const override { return hierarchical_allreduces_; }
  int64_t hierarchical_allgathers() const override {
    return natives_ != nullptr ? natives_->hierarchical_allgathers() : hierarchical_allgathers_;
  }
  // HOROVOD_HIERARCHICAL_ALLGATHER for the gathers run here (without natives): auto from
  // kHierarchicalAllgatherBytes gathered in all.
  void set_hierarchical_allgather(Toggle t) { hierarchical_allgather_ = t; }
  // HOROVOD_HIERARCHICAL_ALLREDUCE for the reduce-scatters run here (the allreduce's first
  // half): auto from the same size as allgather's.
  void set_hierarchical_reducescatter(Toggle t) { hierarchical_reducescatter_ = t; }
  int64_t hierarchical_reducescatters() const override { return hierarchical_reducescatters_; }
  static constexpr int64_t kHierarchicalAllgatherBytes = 256 * 1024;
  // From this many bytes a reduce-scatter runs over the transports even where natives exist.
  static constexpr int64_t kRingReduceScatterBytes = 256 * 1024;

 private:
  Status RunPlan(const AllreducePlan& plan, const AllreduceArgs& args);
  // Reduce-scatter of `send`; in place on `work` when not null (then work == send).
  Status Scatter(const void* send, void* work, void* recv, const std::vector<int64_t>& counts,
                 DataType dtype, ReduceOp op, int ps);
  struct HostLayout {
    Transport* local = nullptr;
    Transport* cross = nullptr;
    std::vector<std::vector<int>> columns;
  };
  Status Hierarchical(Toggle toggle, const std::vector<int64_t>& counts, DataType dtype, int ps,
                      HostLayout* out);
  // The transport of `ps` after meeting its members.
  Status Begin(int ps, Transport** t);
  size_t Segment() const;

  Fabric* fabric_;
  DataBackend* natives_;
  const AllreducePlanner* planner_ = nullptr;
  int64_t hierarchical_allreduces_ = 0;
  int64_t hierarchical_allgathers_ = 0;
  int64_t hierarchical_reducescatters_ = 0;
  Toggle hierarchical_allgather_ = Toggle::kAuto;
  Toggle hierarchical_reducescatter_ = Toggle::kAuto;
};

}  // namespace hvdl
