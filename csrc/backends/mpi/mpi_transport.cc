#include "backends/mpi/mpi_transport.h"

#include <climits>

#include "backends/mpi/mpi_util.h"

namespace hvdl {
namespace {
constexpr int kRingTag = 7;  // the data communicator carries no other point-to-point traffic
}

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

int MpiTransport::Slot(MPI_Request req) {
  if (!free_.empty()) {
    int s = free_.back();
    free_.pop_back();
    requests_[static_cast<size_t>(s)] = req;
    return s;
  }
  requests_.push_back(req);
  return static_cast<int>(requests_.size() - 1);
}

Status MpiTransport::Isend(const void* buf, size_t bytes, int peer, int* request) {
  if (bytes > INT_MAX) return Status::Internal("ring segment larger than 2 GiB");
  MPI_Request req;
  HVDL_MPI(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, kRingTag, comm_, &req));
  *request = Slot(req);
  return Status::Ok();
}

Status MpiTransport::Irecv(void* buf, size_t bytes, int peer, int* request) {
  if (bytes > INT_MAX) return Status::Internal("ring segment larger than 2 GiB");
  MPI_Request req;
  HVDL_MPI(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, kRingTag, comm_, &req));
  *request = Slot(req);
  return Status::Ok();
}

Status MpiTransport::Wait(int request) {
  MPI_Request& req = requests_[static_cast<size_t>(request)];
  int rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
  free_.push_back(request);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Wait (ring)");
  return Status::Ok();
}

}  // namespace hvdl
