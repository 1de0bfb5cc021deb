#include "backends/mpi/mpi_util.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "comm/reduce_kernels.h"

namespace hvdl {
namespace {

struct HalfTypes {
  MPI_Datatype float16 = MPI_DATATYPE_NULL;
  MPI_Datatype bfloat16 = MPI_DATATYPE_NULL;
  MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum, min, max, prod
  // float and double Min/Max: MPI_MIN/MPI_MAX leave NaN and the sign of zero to the
  // implementation (and to which rank's value comes first); ours are reduce_kernels'.
  MPI_Op float_min = MPI_OP_NULL, float_max = MPI_OP_NULL;
};

// Process-wide, like MPI itself: user-defined ops are plain function pointers and cannot capture.
HalfTypes& Halves() {
  static HalfTypes h;
  return h;
}

template <ReduceOp kOp>
void HalfReduce(void* in, void* inout, int* len, MPI_Datatype* type) {
  DataType dtype = *type == Halves().bfloat16 ? DataType::kBFloat16 : DataType::kFloat16;
  ReduceInto(inout, in, *len, dtype, kOp);
}

template <ReduceOp kOp>
void FloatReduce(void* in, void* inout, int* len, MPI_Datatype* type) {
  DataType dtype = *type == MPI_DOUBLE ? DataType::kFloat64 : DataType::kFloat32;
  ReduceInto(inout, in, *len, dtype, kOp);
}

int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return 1;
    case ReduceOp::kMax: return 2;
    case ReduceOp::kProduct: return 3;
    default: return 0;
  }
}

std::atomic<bool> g_peer_failure{false};
std::atomic<MPI_Comm> g_failure_probe{MPI_COMM_NULL};

// Whether MPI knows of failed processes in the job (ULFM; a local query).
bool FailedPeersKnown() {
#if HVDL_HAVE_ULFM && defined(OMPI_HAVE_MPIX_COMM_GET_FAILED)
  MPI_Comm comm = g_failure_probe.load();
  if (comm == MPI_COMM_NULL) return false;
  MPI_Group failed = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return false;
  int n = 0;
  MPI_Group_size(failed, &n);
  MPI_Group_free(&failed);
  return n > 0;
#else
  return false;
#endif
}

}  // namespace

void MpiSetFailureProbe(MPI_Comm comm) { g_failure_probe = comm; }

bool MpiIsPeerFailure(int rc) {
#if HVDL_HAVE_ULFM
  int cls = rc;
  MPI_Error_class(rc, &cls);
  return cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_REVOKED
#if defined(MPIX_ERR_PROC_FAILED_PENDING)
         || cls == MPIX_ERR_PROC_FAILED_PENDING
#endif
      ;
#else
  (void)rc;
  return false;
#endif
}

bool MpiPeerFailureSeen() { return g_peer_failure.load(); }
void MpiClearPeerFailure() { g_peer_failure = false; }

Status MpiStatus(int rc, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string message = std::string(call) + " failed on rank " + std::to_string(rank) + ": " +
                        std::string(text, static_cast<size_t>(len));
  // A non-blocking collective whose schedule a failed peer broke reports MPI_ERR_OTHER ("Error in
  // NBC_Start_round"), not MPI_ERR_PROC_FAILED: seen on rank 0's negotiation in 2 of 7 elastic
  // jobs, whose background loop then stopped instead of recovering, and its re-initialisation
  // aborted in MPI_Comm_dup. So any error while MPI knows of failed processes is a peer failure.
  if (MpiIsPeerFailure(rc) || FailedPeersKnown()) {
    g_peer_failure = true;
    return Status::PeerFailed(std::move(message));
  }
  return Status::Internal(std::move(message));
}

void InitMpiTypes() {
  static std::once_flag once;
  std::call_once(once, [] {
    HalfTypes& h = Halves();
    MPI_Type_contiguous(2, MPI_BYTE, &h.float16);
    MPI_Type_commit(&h.float16);
    MPI_Type_contiguous(2, MPI_BYTE, &h.bfloat16);
    MPI_Type_commit(&h.bfloat16);
    MPI_Op_create(&HalfReduce<ReduceOp::kSum>, 1, &h.ops[0]);
    MPI_Op_create(&HalfReduce<ReduceOp::kMin>, 1, &h.ops[1]);
    MPI_Op_create(&HalfReduce<ReduceOp::kMax>, 1, &h.ops[2]);
    MPI_Op_create(&HalfReduce<ReduceOp::kProduct>, 1, &h.ops[3]);
    MPI_Op_create(&FloatReduce<ReduceOp::kMin>, 1, &h.float_min);
    MPI_Op_create(&FloatReduce<ReduceOp::kMax>, 1, &h.float_max);
  });
}

MPI_Datatype MpiType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return Halves().float16;
    case DataType::kBFloat16: return Halves().bfloat16;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kBool: return MPI_C_BOOL;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiOp(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) return Halves().ops[OpIndex(op)];
  if ((dtype == DataType::kFloat32 || dtype == DataType::kFloat64) &&
      (op == ReduceOp::kMin || op == ReduceOp::kMax)) {
    return op == ReduceOp::kMin ? Halves().float_min : Halves().float_max;
  }
  if (dtype == DataType::kBool) {
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? MPI_LAND : MPI_LOR;
  }
  switch (op) {
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: return MPI_SUM;
  }
}

Status MpiWait(MPI_Request* req, std::chrono::microseconds spin) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kMaxSleep = std::chrono::microseconds(200);
  const auto start = Clock::now();
  auto sleep = std::chrono::microseconds(8);
  while (true) {
    int done = 0;
    HVDL_MPI(MPI_Test(req, &done, MPI_STATUS_IGNORE));
    if (done) return Status::Ok();
    if (Clock::now() - start < spin) continue;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

// A rank whose background thread enters a blocking collective before its peers' threads do
// (they notice the agreed response at their next poll, or wait for a core that training threads
// hold) would spin on a core the training needs - measured: 20 ms of CPU per training step on
// a 2-core machine. So the ranks first meet in a non-blocking barrier and start the data
// transfer together.
Status MpiMeet(MPI_Comm comm) {
  MPI_Request req;
  HVDL_MPI(MPI_Ibarrier(comm, &req));
  return MpiWait(&req);
}

Status MpiDup(MPI_Comm comm, MPI_Comm* out) {
  MPI_Request req;
  HVDL_MPI(MPI_Comm_idup(comm, out, &req));
  return MpiWait(&req);
}

}  // namespace hvdl
