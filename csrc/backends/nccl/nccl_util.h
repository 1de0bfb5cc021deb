// NCCL helpers: result codes as Status, and horovodlite's dtypes/ops as NCCL's.
#pragma once

#include <nccl.h>

#include <string>

#include "common/status.h"
#include "common/types.h"

namespace hvdl {

// kInternal "<call> failed on rank R: <ncclGetErrorString> (<ncclGetLastError>)".
Status NcclStatus(ncclResult_t rc, const char* call, int rank, ncclComm_t comm = nullptr);

// The NCCL type carrying `dtype`; false for types NCCL lacks (int16). bool travels as uint8.
bool NcclType(DataType dtype, ncclDataType_t* out);
// The NCCL reduction for `op` on `dtype` (kSum/kMin/kMax/kProduct). On bool (0/1 bytes) Sum is
// logical or (Max) and Product logical and (Min), as in the CPU kernels.
ncclRedOp_t NcclOp(DataType dtype, ReduceOp op);

}  // namespace hvdl

// Propagates a failed NCCL call; needs `rank_` (this process's global rank) in scope.
#define HVDL_NCCL(call)                                                          \
  do {                                                                           \
    ncclResult_t _hvdl_nrc = (call);                                             \
    if (_hvdl_nrc != ncclSuccess) return ::hvdl::NcclStatus(_hvdl_nrc, #call, rank_); \
  } while (0)
