#include "backends/mpi/mpi_fabric.h"

#include <algorithm>
#include <string>

#include "backends/mpi/mpi_transport.h"
#include "backends/mpi/mpi_util.h"
#include "comm/single_copy_transport.h"

namespace hvdl {

MpiFabric::MpiFabric(MpiWorld* world, bool single_copy) : world_(world), single_copy_(single_copy) {
  std::vector<int> all(static_cast<size_t>(world->size()));
  for (int r = 0; r < world->size(); ++r) all[static_cast<size_t>(r)] = r;
  members_[0] = std::move(all);
}

MpiFabric::~MpiFabric() {
  transports_.clear();
  local_.reset();
  cross_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
    if (cross_comm_ != MPI_COMM_NULL) MPI_Comm_free(&cross_comm_);
  }
}

Status MpiFabric::AddProcessSet(int ps, const std::vector<int>& ranks) {
  HVDL_RETURN_IF_ERROR(world_->AddProcessSet(ps, ranks));
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  members_[ps] = std::move(sorted);
  return Status::Ok();
}

Status MpiFabric::RemoveProcessSet(int ps) {
  transports_.erase(ps);
  if (ps != 0) members_.erase(ps);
  return world_->RemoveProcessSet(ps);
}

int MpiFabric::SetSize(int ps) const {
  MPI_Comm comm = world_->data(ps);
  int n = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &n);
  return n;
}

int MpiFabric::SetRank(int ps) const {
  MPI_Comm comm = world_->data(ps);
  int r = -1;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &r);
  return r;
}

bool MpiFabric::hierarchical() const {
  return world_->cross_size() > 1 && world_->local_size() > 1 && world_->homogeneous();
}

std::unique_ptr<Transport> MpiFabric::Make(MPI_Comm comm, const std::vector<int>& members) const {
  auto base = std::make_unique<MpiTransport>(comm);
  if (!single_copy_) return base;
  std::vector<std::string> hosts;
  hosts.reserve(members.size());
  for (int r : members) hosts.push_back(world_->host(r));
  return std::make_unique<SingleCopyTransport>(std::move(base), hosts);  // collective
}

Status MpiFabric::SetTransport(int ps, Transport** out) {
  auto it = transports_.find(ps);
  if (it == transports_.end()) {
    MPI_Comm comm = world_->data(ps);
    auto members = members_.find(ps);
    if (comm == MPI_COMM_NULL || members == members_.end()) {
      return Status::Internal("process set " + std::to_string(ps) +
                              " has no MPI communicator on this rank");
    }
    it = transports_.emplace(ps, Make(comm, members->second)).first;
  }
  *out = it->second.get();
  return Status::Ok();
}

// Collective over the job (every rank reaches its first hierarchical collective in the same
// agreed order).
Status MpiFabric::HostTransports(Transport** local, Transport** cross) {
  if (!local_) {
    if (local_comm_ == MPI_COMM_NULL) HVDL_RETURN_IF_ERROR(MpiDup(world_->local(), &local_comm_));
    if (cross_comm_ == MPI_COMM_NULL) HVDL_RETURN_IF_ERROR(MpiDup(world_->cross(), &cross_comm_));
    MPI_Comm_set_errhandler(local_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(cross_comm_, MPI_ERRORS_RETURN);
    world_->AddRevocable(local_comm_);
    world_->AddRevocable(cross_comm_);
    // Every member of the local communicator runs on this host; the cross one's on one each.
    const std::vector<int> here(static_cast<size_t>(world_->local_size()), world_->rank());
    local_ = Make(local_comm_, here);
    cross_ = std::make_unique<MpiTransport>(cross_comm_);
  }
  *local = local_.get();
  *cross = cross_.get();
  return Status::Ok();
}

Status MpiFabric::Meet(int ps) {
  MPI_Comm comm = world_->data(ps);
  if (comm == MPI_COMM_NULL) {
    return Status::Internal("process set " + std::to_string(ps) +
                            " has no MPI communicator on this rank");
  }
  return MpiMeet(comm);
}

int MpiFabric::single_copy_transports() const {
  int n = 0;
  for (const auto& kv : transports_) n += kv.second->single_copy_peers() > 0 ? 1 : 0;
  return n;
}

int MpiFabric::single_copy_peers() const {
  int n = 0;
  for (const auto& kv : transports_) n += kv.second->single_copy_peers();
  return n;
}

}  // namespace hvdl
