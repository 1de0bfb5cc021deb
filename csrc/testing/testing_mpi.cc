// horovodlite._testing, MPI part: the cleanup after an error is bounded on the MPI transport
// (backends/mpi/mpi_transport.h). Run by every rank of a real MPI job, after hvd.init():
// rank 0 posts a message to or from rank 1 that rank 1 never matches and leaves it to a
// PostedRequests' drain (as an algorithm's early return does); the drain must give up at its
// bound. tests/unit/test_mpi_cleanup.py drives it through tests/scripts/mpi_cleanup.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/posted_requests.h"

#if HVDL_WITH_MPI
#include <mpi.h>

#include "backends/mpi/mpi_transport.h"
#endif

namespace py = pybind11;

namespace hvdl {
namespace {

#if HVDL_WITH_MPI
// `kind`: "recv" (a receive from rank 1: MPI cancels it) or "send" (a send to rank 1 larger
// than any eager limit: MPI may be unable to cancel it, and the transport then refuses every
// later post; rank 1 matches it afterwards so that MPI can finish). Returns, on rank 0, the
// drain's seconds, the direct WaitUntil's status and a later post's status; on the others,
// empty values.
py::dict MpiCleanup(const std::string& kind, double bound_seconds, int64_t bytes) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw std::runtime_error("MPI is not initialised: call hvd.init() first");
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  py::dict out;
  const bool send = kind == "send";
  std::vector<char> buffer(static_cast<size_t>(bytes), 1);
  const Span span{buffer.data(), bytes};
  {
    py::gil_scoped_release nogil;
    MpiTransport t(comm);
    const auto bound = std::chrono::milliseconds(static_cast<int64_t>(bound_seconds * 1000));
    const auto saved = PostedRequests::drain_bound();
    PostedRequests::set_drain_bound(bound);
    double drained = -1;
    std::string waited, later;
    if (rank == 0) {
      const auto start = std::chrono::steady_clock::now();
      {
        PostedRequests posted(&t);
        Status s = send ? posted.Send({span}, 1, 1, 0) : posted.Recv({span}, 1, 1, 0);
        if (!s.ok()) waited = "post failed: " + s.message();
      }  // the drain, as after an early return
      drained = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // The same once more, its status read (the drain drops it).
      int request = -1;
      Status s = send ? t.PostSend({span}, 1, 1, 1, &request) : t.PostRecv({span}, 1, 1, 1, &request);
      if (s.ok()) {
        s = t.WaitUntil(request, std::chrono::steady_clock::now() + bound);
        waited = s.ok() ? "ok" : s.message();
      } else {
        waited = "post refused: " + s.message();
      }
      int next = -1;
      s = t.PostRecv({}, 1, 1, 2, &next);
      if (s.ok()) {
        s = t.WaitUntil(next, std::chrono::steady_clock::now() + std::chrono::milliseconds(10));
        later = "posted";
      } else {
        later = s.message();
      }
    }
    // The send MPI could not cancel (tag 0 if the drain broke the transport, else tag 1 if the
    // direct wait did; -1: none): rank 1 matches it, so that MPI can finish.
    const auto broke = [](const std::string& m) {
      return m.find("cannot be used any more") != std::string::npos;
    };
    int stuck = !send || rank != 0 ? -1 : broke(waited) && waited.rfind("post refused", 0) == 0 ? 0
                                        : broke(waited)                                       ? 1
                                                                                              : -1;
    MPI_Bcast(&stuck, 1, MPI_INT, 0, comm);
    if (stuck >= 0 && rank == 1) {
      MPI_Recv(buffer.data(), static_cast<int>(bytes), MPI_BYTE, 0, MpiTransport::kFirstTag + stuck,
               comm, MPI_STATUS_IGNORE);
    }
    MPI_Barrier(comm);
    PostedRequests::set_drain_bound(saved);
    py::gil_scoped_acquire gil;
    out["drained_seconds"] = drained;
    out["waited"] = waited;
    out["later"] = later;
  }
  MPI_Comm_free(&comm);
  return out;
}
#endif

}  // namespace

void RegisterMpiTesting(py::module_& m) {
  m.def("mpi_built", [] { return static_cast<bool>(HVDL_WITH_MPI); });
#if HVDL_WITH_MPI
  m.def("mpi_cleanup", &MpiCleanup, py::arg("kind"), py::arg("bound_seconds"),
        py::arg("bytes"));
#endif
}

}  // namespace hvdl
