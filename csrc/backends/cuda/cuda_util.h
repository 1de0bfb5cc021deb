// CUDA runtime error codes as Status (kInternal), naming the call, the rank and the device.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/status.h"

namespace hvdl {

// "<call> failed on rank R (cuda:D): <cudaGetErrorString>"; rank < 0 omits the rank.
Status CudaStatus(cudaError_t rc, const char* call, int rank, int device);

}  // namespace hvdl

// Propagates a failed CUDA call as a Status; needs `rank_` and `device_` in scope (the members of
// the CUDA classes that use it).
#define HVDL_CUDA(call)                                                          \
  do {                                                                           \
    cudaError_t _hvdl_rc = (call);                                               \
    if (_hvdl_rc != cudaSuccess) return ::hvdl::CudaStatus(_hvdl_rc, #call, rank_, device_); \
  } while (0)
