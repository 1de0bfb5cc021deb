// The batched ScaleCopy kernel (batch_copy_kernels.cu): one launch over many regions.
//
// `table` is device memory holding n CopyRegion entries followed by the n + 1 tile starts of
// comm/batch_copy.h (BatchCopyLauncher builds it). Queued on `stream`; returns the launch error,
// if any. Element rules are the CPU kernels' (comm/reduce_kernels ScaleCopy): float32 scaled in
// float32, float64 in float64, float16/bfloat16 widened to float32 and rounded back to nearest
// even, integers scaled in float64 and truncated toward zero, bool copied; factor 1 copies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/types.h"

namespace hvdl {

cudaError_t LaunchBatchScaleCopy(const void* table, int n, int64_t tiles, DataType dtype,
                                 double factor, cudaStream_t stream);

}  // namespace hvdl
