#include "backends/mpi/mpi_transport.h"

#include <climits>
#include <string>
#include <thread>

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
  if (!broken_.ok()) return broken_;
  MPI_Request req = MPI_REQUEST_NULL;
  int64_t total = 0;
  for (const Span& s : spans) total += s.count * static_cast<int64_t>(esize);
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
    posted_.emplace_back();
  }
  posted_[static_cast<size_t>(*request)] = Posted{peer, send, total};
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

void MpiTransport::Release(int request) {
  requests_[static_cast<size_t>(request)] = MPI_REQUEST_NULL;
  free_.push_back(request);
}

std::string MpiTransport::Describe(int request) const {
  const Posted& p = posted_[static_cast<size_t>(request)];
  return std::string(p.send ? "a send of " : "a receive of ") + std::to_string(p.bytes) +
         " bytes " + (p.send ? "to" : "from") + " rank " + std::to_string(p.peer);
}

Status MpiTransport::Wait(int request) {
  const int rc = MPI_Wait(&requests_[static_cast<size_t>(request)], MPI_STATUS_IGNORE);
  Release(request);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Wait (ring)");
  return Status::Ok();
}

// Tests (with short sleeps: this is the cleanup, not the ring) until the deadline, then cancels
// and gives the cancel a second to take effect: a receive nobody matched cancels at once, a
// send MPI may be unable to cancel (the standard deprecates it; Open MPI cannot once the
// message is under way).
Status MpiTransport::WaitUntil(int request, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  MPI_Request& r = requests_[static_cast<size_t>(request)];
  const std::string what = Describe(request);
  Status s;
  int cancelled = 0;
  // True once the request is over (then released, its status in s).
  const auto over = [&](const char* call) {
    int done = 0;
    MPI_Status status;
    const int rc = MPI_Test(&r, &done, &status);
    if (rc != MPI_SUCCESS) s = MpiStatus(rc, call);
    if (rc == MPI_SUCCESS && done) MPI_Test_cancelled(&status, &cancelled);
    if (rc != MPI_SUCCESS || done) Release(request);
    return rc != MPI_SUCCESS || done != 0;
  };
  bool finished;
  while (!(finished = over("MPI_Test (ring cleanup)")) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (finished) return s;
  const int rc = MPI_Cancel(&r);
  // Once broken, each further request of the drain gets one test after its cancel, not a second.
  const auto cancel_deadline =
      Clock::now() + (broken_.ok() ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(0));
  for (bool first = true; rc == MPI_SUCCESS && (first || Clock::now() < cancel_deadline);
       first = false) {
    if (over("MPI_Test (ring cleanup, cancelled)")) {
      if (!s.ok() || !cancelled) return s;
      return Status::Aborted(what + ", left behind by an earlier error, was not matched in time "
                                    "and was cancelled");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Neither completed nor cancelled: MPI keeps the request and its buffer; so does this
  // transport (the slot is never reused), which refuses every later post.
  if (!broken_.ok()) return broken_;
  broken_ = Status::Aborted("the MPI transport cannot be used any more: " + what +
                            " (in its communicator), left behind by an earlier error, was never "
                            "matched and could not be cancelled; the job must be restarted");
  return broken_;
}

}  // namespace hvdl
