// MPI helpers: error codes to Status, DataType/ReduceOp to MPI handles.
//
// MPI has no float16/bfloat16: they travel as 2-byte contiguous types of our own with user-defined
// reduction ops that compute in float32 (comm/reduce_kernels). These handles are created once per
// process after MPI_Init and live until MPI_Finalize.
#pragma once

#include <mpi.h>

#include <chrono>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: ULFM (MPIX_Comm_revoke/shrink) when built with it
#endif

// ULFM (User-Level Failure Mitigation): the MPI reports failed processes as errors instead of
// aborting, and can revoke a communicator and shrink it to the survivors. Open MPI 5 (its
// ftmpi extension) and MPICH have it; Open MPI 4.1 does not.
#if defined(MPIX_ERR_PROC_FAILED) && defined(MPIX_ERR_REVOKED)
#define HVDL_HAVE_ULFM 1
#else
#define HVDL_HAVE_ULFM 0
#endif

#include <string>

#include "common/status.h"
#include "common/types.h"

namespace hvdl {

// kInternal "<call> failed on rank R: <MPI error string>" for rc != MPI_SUCCESS; kPeerFailed
// when the error says processes failed or the communicator was revoked (ULFM), which also
// raises the process-wide flag below.
Status MpiStatus(int rc, const char* call);
// True when rc reports failed processes or a revoked communicator (always false without ULFM).
bool MpiIsPeerFailure(int rc);
// Set by MpiStatus on a peer failure, cleared by MpiWorld::Recover: the background loop checks
// it after every cycle, since data-plane errors reach only the handles of their operation.
bool MpiPeerFailureSeen();
void MpiClearPeerFailure();
// The job's communicator, which MpiStatus asks (ULFM: MPIX_Comm_get_failed) whether processes
// failed when an error does not say so itself; MPI_COMM_NULL: none (no world).
void MpiSetFailureProbe(MPI_Comm comm);

#define HVDL_MPI(call)                                             \
  do {                                                             \
    int _hvdl_rc = (call);                                         \
    if (_hvdl_rc != MPI_SUCCESS) return ::hvdl::MpiStatus(_hvdl_rc, #call); \
  } while (0)

// Creates the float16/bfloat16 types and ops (idempotent). Call after MPI is initialised.
void InitMpiTypes();
MPI_Datatype MpiType(DataType dtype);
// The MPI op reducing `dtype` with `op` (Average maps to the sum op).
MPI_Op MpiOp(DataType dtype, ReduceOp op);

// Blocking: waits for `req`, testing it in a loop for `spin`, then sleeping between tests with
// backoff (at most 200 us). MPI's own blocking calls spin until done (with sched_yield under
// mpi_yield_when_idle): where ranks share cores, a rank spinning for a peer that is late takes
// the core from that very peer.
Status MpiWait(MPI_Request* req,
               std::chrono::microseconds spin = std::chrono::microseconds(30));
// Blocking: every member of `comm` has arrived, waited for with MpiWait (a non-blocking
// barrier). Called before blocking collectives, so that they start together.
Status MpiMeet(MPI_Comm comm);
// MPI_Comm_dup waited for with MpiWait (MPI_Comm_idup): the ranks of a job reach a duplication
// at different times (startup, the first collective of a kind), and MPI_Comm_dup spins.
Status MpiDup(MPI_Comm comm, MPI_Comm* out);

}  // namespace hvdl
