#include "backends/mpi/mpi_control_plane.h"

#include <cstdint>

#include "backends/mpi/mpi_util.h"

namespace hvdl {

namespace {
// A negotiation's gather and broadcast usually finish within tens of microseconds (rank 0
// builds the responses meanwhile): waited for as MPI would, by testing. Longer means a rank is
// late - not yet done with its cycle, or without a core - and sleeping gives the core back.
// (Sleeping from 30 us on, as MpiMeet does, cost 10-40 us per negotiation at np 3 on 2 cores.)
constexpr std::chrono::microseconds kSpin{1000};
}  // namespace

MpiControlPlane::MpiControlPlane(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Status MpiControlPlane::StartBitwiseOr(uint64_t* words, size_t n) {
  HVDL_MPI(MPI_Iallreduce(MPI_IN_PLACE, words, static_cast<int>(n), MPI_UINT64_T, MPI_BOR, comm_,
                          &pending_));
  return Status::Ok();
}

Status MpiControlPlane::TestBitwiseOr(bool* done) {
  int flag = 0;
  HVDL_MPI(MPI_Test(&pending_, &flag, MPI_STATUS_IGNORE));
  *done = flag != 0;
  return Status::Ok();
}

Status MpiControlPlane::Gather(const std::string& send, std::vector<std::string>* recv) {
  int len = static_cast<int>(send.size());
  std::vector<int> lens(rank_ == 0 ? static_cast<size_t>(size_) : 0);
  MPI_Request req;
  HVDL_MPI(MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_, &req));
  HVDL_RETURN_IF_ERROR(MpiWait(&req, kSpin));
  std::vector<int> displs(lens.size());
  int total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    displs[i] = total;
    total += lens[i];
  }
  std::string all(static_cast<size_t>(total), '\0');
  HVDL_MPI(MPI_Igatherv(send.data(), len, MPI_BYTE, all.data(), lens.data(), displs.data(),
                        MPI_BYTE, 0, comm_, &req));
  HVDL_RETURN_IF_ERROR(MpiWait(&req, kSpin));
  if (rank_ == 0) {
    recv->resize(lens.size());
    for (size_t i = 0; i < lens.size(); ++i) {
      (*recv)[i] = all.substr(static_cast<size_t>(displs[i]), static_cast<size_t>(lens[i]));
    }
  }
  return Status::Ok();
}

Status MpiControlPlane::Broadcast(std::string* data) {
  int64_t len = static_cast<int64_t>(data->size());
  MPI_Request req;
  HVDL_MPI(MPI_Ibcast(&len, 1, MPI_INT64_T, 0, comm_, &req));
  HVDL_RETURN_IF_ERROR(MpiWait(&req, kSpin));
  data->resize(static_cast<size_t>(len));
  HVDL_MPI(MPI_Ibcast(data->data(), static_cast<int>(len), MPI_BYTE, 0, comm_, &req));
  HVDL_RETURN_IF_ERROR(MpiWait(&req, kSpin));
  return Status::Ok();
}

}  // namespace hvdl
