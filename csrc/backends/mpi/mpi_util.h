// MPI helpers: error codes to Status, DataType/ReduceOp to MPI handles.
//
// MPI has no float16/bfloat16: they travel as 2-byte contiguous types of our own with user-defined
// reduction ops that compute in float32 (comm/reduce_kernels). These handles are created once per
// process after MPI_Init and live until MPI_Finalize.
#pragma once

#include <mpi.h>

#include <string>

#include "common/status.h"
#include "common/types.h"

namespace hvdl {

// kInternal "<call> failed on rank R: <MPI error string>" for rc != MPI_SUCCESS.
Status MpiStatus(int rc, const char* call);

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

}  // namespace hvdl
