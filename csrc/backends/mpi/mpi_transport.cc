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

Status MpiTransport::SpanType(const std::vector<Span>& spans, size_t esize,
                              MPI_Datatype* type) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> addresses;
  for (const Span& s : spans) {
    const size_t bytes = static_cast<size_t>(s.count) * esize;
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

// One span is a plain transfer; several become one message described by an hindexed datatype.
// The datatype is freed right after posting: MPI keeps it alive until the transfer completes.
Status MpiTransport::PostSpans(bool send, const std::vector<Span>& spans, size_t esize, int peer,
                               int* request) {
  if (spans.size() == 1) {
    const size_t bytes = static_cast<size_t>(spans[0].count) * esize;
    return send ? Isend(spans[0].data, bytes, peer, request)
                : Irecv(spans[0].data, bytes, peer, request);
  }
  MPI_Datatype type;
  HVDL_RETURN_IF_ERROR(SpanType(spans, esize, &type));
  MPI_Request req;
  int rc = send ? MPI_Isend(MPI_BOTTOM, 1, type, peer, kRingTag, comm_, &req)
                : MPI_Irecv(MPI_BOTTOM, 1, type, peer, kRingTag, comm_, &req);
  MPI_Type_free(&type);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, send ? "MPI_Isend (ring)" : "MPI_Irecv (ring)");
  *request = Slot(req);
  return Status::Ok();
}

Status MpiTransport::IsendSpans(const std::vector<Span>& spans, size_t esize, int peer,
                                int* request) {
  return PostSpans(true, spans, esize, peer, request);
}

Status MpiTransport::IrecvSpans(const std::vector<Span>& spans, size_t esize, int peer,
                                int* request) {
  return PostSpans(false, spans, esize, peer, request);
}

Status MpiTransport::Wait(int request) {
  MPI_Request& req = requests_[static_cast<size_t>(request)];
  int rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
  free_.push_back(request);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Wait (ring)");
  return Status::Ok();
}

}  // namespace hvdl
