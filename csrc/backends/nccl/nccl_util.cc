#include "backends/nccl/nccl_util.h"

namespace hvdl {

Status NcclStatus(ncclResult_t rc, const char* call, int rank, ncclComm_t comm) {
  std::string msg = std::string(call) + " failed on rank " + std::to_string(rank) + ": " +
                    ncclGetErrorString(rc);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
#endif
  return Status::Internal(msg + "; set NCCL_DEBUG=WARN for NCCL's own report.");
}

bool NcclType(DataType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DataType::kUInt8: *out = ncclUint8; return true;
    case DataType::kBool: *out = ncclUint8; return true;
    case DataType::kInt8: *out = ncclInt8; return true;
    case DataType::kInt32: *out = ncclInt32; return true;
    case DataType::kInt64: *out = ncclInt64; return true;
    case DataType::kFloat16: *out = ncclFloat16; return true;
    case DataType::kFloat32: *out = ncclFloat32; return true;
    case DataType::kFloat64: *out = ncclFloat64; return true;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case DataType::kBFloat16: *out = ncclBfloat16; return true;
#endif
    default: return false;
  }
}

ncclRedOp_t NcclOp(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) {
    return op == ReduceOp::kMin || op == ReduceOp::kProduct ? ncclMin : ncclMax;
  }
  switch (op) {
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    default: return ncclSum;
  }
}

}  // namespace hvdl
