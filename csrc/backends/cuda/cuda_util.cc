#include "backends/cuda/cuda_util.h"

namespace hvdl {

Status CudaStatus(cudaError_t rc, const char* call, int rank, int device) {
  std::string where = rank >= 0 ? " on rank " + std::to_string(rank) : std::string();
  if (device >= 0) where += " (cuda:" + std::to_string(device) + ")";
  return Status::Internal(std::string(call) + " failed" + where + ": " + cudaGetErrorString(rc));
}

}  // namespace hvdl
