// MpiFabric: the Fabric of an mpirun launch - one MPI transport per process set over the set's
// data communicator (MpiWorld), with single copy between the members that share a host layered
// on top (comm/single_copy_transport; HOROVOD_RING_CMA=0 turns it off, every rank must agree),
// and the host / cross transports of hierarchical algorithms over private copies of MpiWorld's
// node and cross communicators (so no message of another user of the world can match ours).
// Process sets: adds and removes the world's communicators (the MPI natives read them).
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <vector>

#include "backends/mpi/mpi_world.h"
#include "comm/fabric.h"

namespace hvdl {

class MpiFabric : public Fabric {
 public:
  // `world` is not owned and must outlive the fabric.
  MpiFabric(MpiWorld* world, bool single_copy);
  ~MpiFabric() override;
  MpiFabric(const MpiFabric&) = delete;
  MpiFabric& operator=(const MpiFabric&) = delete;

  Status AddProcessSet(int ps, const std::vector<int>& ranks) override;
  Status RemoveProcessSet(int ps) override;
  int SetSize(int ps) const override;
  int SetRank(int ps) const override;
  Status SetTransport(int ps, Transport** out) override;
  bool hierarchical() const override;
  bool spans_hosts() const override { return world_->local_size() < world_->size(); }
  bool homogeneous() const override { return world_->homogeneous(); }
  Status HostTransports(Transport** local, Transport** cross) override;
  Status Meet(int ps) override;
  int single_copy_transports() const override;
  int single_copy_peers() const override;

 private:
  // The transport over `comm` whose members are the global ranks `members`.
  std::unique_ptr<Transport> Make(MPI_Comm comm, const std::vector<int>& members) const;

  MpiWorld* world_;
  bool single_copy_;
  std::map<int, std::vector<int>> members_;  // process set -> its global ranks, ascending
  std::map<int, std::unique_ptr<Transport>> transports_;
  MPI_Comm local_comm_ = MPI_COMM_NULL, cross_comm_ = MPI_COMM_NULL;  // ours (dups)
  std::unique_ptr<Transport> local_, cross_;
};

}  // namespace hvdl
