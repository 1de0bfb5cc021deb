// MpiControlPlane: the negotiation's ControlPlane over MPI (the control communicator).
// The bitwise OR is MPI_Iallreduce + MPI_Test so the background loop can sleep between tests
// instead of spinning inside a blocking collective; the gather and broadcast of a negotiation
// are non-blocking too, waited for with MpiWait: a rank that waits long for a late peer sleeps
// instead of spinning.
#pragma once

#include <mpi.h>

#include "comm/control_plane.h"

namespace hvdl {

class MpiControlPlane : public ControlPlane {
 public:
  explicit MpiControlPlane(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status StartBitwiseOr(uint64_t* words, size_t n) override;
  Status TestBitwiseOr(bool* done) override;
  Status Gather(const std::string& send, std::vector<std::string>* recv) override;
  Status Broadcast(std::string* data) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Request pending_ = MPI_REQUEST_NULL;
};

}  // namespace hvdl
