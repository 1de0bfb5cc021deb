#include "backends/mpi/mpi_control_plane.h"

#include <cstdint>

#include "backends/mpi/mpi_util.h"

namespace hvdl {

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
  HVDL_MPI(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_));
  std::vector<int> displs(lens.size());
  int total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    displs[i] = total;
    total += lens[i];
  }
  std::string all(static_cast<size_t>(total), '\0');
  HVDL_MPI(MPI_Gatherv(send.data(), len, MPI_BYTE, all.data(), lens.data(), displs.data(),
                       MPI_BYTE, 0, comm_));
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
  HVDL_MPI(MPI_Bcast(&len, 1, MPI_INT64_T, 0, comm_));
  data->resize(static_cast<size_t>(len));
  HVDL_MPI(MPI_Bcast(data->data(), static_cast<int>(len), MPI_BYTE, 0, comm_));
  return Status::Ok();
}

}  // namespace hvdl
