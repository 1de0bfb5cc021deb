#include "backends/mpi/mpi_transport.h"

#include <climits>

#include "backends/mpi/mpi_util.h"

namespace hvdl {

MpiTransport::MpiTransport(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Status MpiTransport::SpanType(const std::vector<Span>& spans, size_t esize, MPI_Datatype* type) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> addresses;
  lengths.reserve(spans.size());
  addresses.reserve(spans.size());
  for (const Span& s : spans) {
    const int64_t bytes = s.count * static_cast<int64_t>(esize);
    if (bytes > INT_MAX) return Status::Internal("ring span larger than 2 GiB");
    MPI_Aint addr;
    HVDL_MPI(MPI_Get_address(s.data, &addr));
    lengths.push_back(static_cast<int>(bytes));
    addresses.push_back(addr);
  }
  HVDL_MPI(MPI_Type_create_hindexed(static_cast<int>(spans.size()), lengths.data(),
                                    addresses.data(), MPI_BYTE, type));
  HVDL_MPI(MPI_Type_commit(type));
  return Status::Ok();
}

// The datatype is freed right after posting: MPI keeps it alive until the transfer completes.
Status MpiTransport::Post(bool send, const std::vector<Span>& spans, size_t esize, int peer,
                          int tag, int* request) {
  if (tag < 0 || tag >= kTags) return Status::Internal("MPI transport: tag out of range");
  MPI_Request req = MPI_REQUEST_NULL;
  const int mpi_tag = kFirstTag + tag;
  if (spans.size() == 1 || spans.empty()) {
    const int64_t bytes = spans.empty() ? 0 : spans[0].count * static_cast<int64_t>(esize);
    if (bytes > INT_MAX) return Status::Internal("ring segment larger than 2 GiB");
    void* data = spans.empty() ? nullptr : spans[0].data;
    if (send) {
      HVDL_MPI(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, mpi_tag, comm_, &req));
    } else {
      HVDL_MPI(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, mpi_tag, comm_, &req));
    }
  } else {
    MPI_Datatype type;
    HVDL_RETURN_IF_ERROR(SpanType(spans, esize, &type));
    int rc = send ? MPI_Isend(MPI_BOTTOM, 1, type, peer, mpi_tag, comm_, &req)
                  : MPI_Irecv(MPI_BOTTOM, 1, type, peer, mpi_tag, comm_, &req);
    MPI_Type_free(&type);
    if (rc != MPI_SUCCESS) return MpiStatus(rc, send ? "MPI_Isend (ring)" : "MPI_Irecv (ring)");
  }
  if (!free_.empty()) {
    *request = free_.back();
    free_.pop_back();
    requests_[static_cast<size_t>(*request)] = req;
  } else {
    *request = static_cast<int>(requests_.size());
    requests_.push_back(req);
  }
  return Status::Ok();
}

Status MpiTransport::PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                              int* request) {
  return Post(true, spans, esize, peer, tag, request);
}

Status MpiTransport::PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                              int* request) {
  return Post(false, spans, esize, peer, tag, request);
}

Status MpiTransport::Wait(int request) {
  MPI_Request& r = requests_[static_cast<size_t>(request)];
  const int rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
  r = MPI_REQUEST_NULL;
  free_.push_back(request);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Wait (ring)");
  return Status::Ok();
}

}  // namespace hvdl
