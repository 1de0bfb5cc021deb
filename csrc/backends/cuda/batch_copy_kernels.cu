// Batched pack/unpack/scale: one thread block per tile of kTileElements elements (see
// comm/batch_copy.h for the work split); the block finds its region by binary search over the
// tile starts and its threads stride over the tile. float16/bfloat16 are computed in float32.
#include "backends/cuda/batch_copy_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "comm/batch_copy.h"
#include "comm/device_ops.h"

namespace hvdl {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;  // the grid strides over the tiles beyond this

template <typename T>
struct Copy {
  __device__ T operator()(T v) const { return v; }
};

template <typename T>
struct FloatScale {  // float32 in float32, float64 in float64 (as the CPU kernels)
  T factor;
  __device__ T operator()(T v) const { return v * factor; }
};

template <typename T>
struct IntScale {  // in float64, truncated toward zero
  double factor;
  __device__ T operator()(T v) const { return static_cast<T>(trunc(static_cast<double>(v) * factor)); }
};

struct HalfScale {
  float factor;
  __device__ uint16_t operator()(uint16_t v) const {
    return __half_as_ushort(__float2half_rn(__half2float(__ushort_as_half(v)) * factor));
  }
};

struct BFloat16Scale {
  float factor;
  __device__ uint16_t operator()(uint16_t v) const {
    return __bfloat16_as_ushort(
        __float2bfloat16_rn(__bfloat162float(__ushort_as_bfloat16(v)) * factor));
  }
};

template <typename T, typename Op>
__global__ void BatchScaleCopyKernel(const CopyRegion* regions, const int64_t* tile_start, int n,
                                     int64_t tiles, Op op) {
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int r = batch::FindRegion(tile_start, n, tile);
    int64_t first = 0, last = 0;
    batch::TileRange(tile_start, r, tile, regions[r].count, &first, &last);
    const T* src = static_cast<const T*>(regions[r].src);
    T* dst = static_cast<T*>(regions[r].dst);
    for (int64_t i = first + threadIdx.x; i < last; i += blockDim.x) dst[i] = op(src[i]);
  }
}

template <typename T, typename Op>
cudaError_t Launch(const void* table, int n, int64_t tiles, Op op, cudaStream_t stream) {
  const auto* regions = static_cast<const CopyRegion*>(table);
  const auto* starts = reinterpret_cast<const int64_t*>(regions + n);
  const int64_t blocks = tiles < kMaxBlocks ? tiles : kMaxBlocks;
  BatchScaleCopyKernel<T, Op><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      regions, starts, n, tiles, op);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchInt(const void* table, int n, int64_t tiles, double factor, cudaStream_t s) {
  if (factor == 1.0) return Launch<T>(table, n, tiles, Copy<T>{}, s);
  return Launch<T>(table, n, tiles, IntScale<T>{factor}, s);
}

}  // namespace

cudaError_t LaunchBatchScaleCopy(const void* table, int n, int64_t tiles, DataType dtype,
                                 double factor, cudaStream_t stream) {
  if (tiles == 0) return cudaSuccess;
  const bool copy = factor == 1.0;
  switch (dtype) {
    case DataType::kUInt8: return LaunchInt<uint8_t>(table, n, tiles, factor, stream);
    case DataType::kInt8: return LaunchInt<int8_t>(table, n, tiles, factor, stream);
    case DataType::kInt16: return LaunchInt<int16_t>(table, n, tiles, factor, stream);
    case DataType::kInt32: return LaunchInt<int32_t>(table, n, tiles, factor, stream);
    case DataType::kInt64: return LaunchInt<int64_t>(table, n, tiles, factor, stream);
    case DataType::kBool: return Launch<uint8_t>(table, n, tiles, Copy<uint8_t>{}, stream);
    case DataType::kFloat32:
      if (copy) return Launch<float>(table, n, tiles, Copy<float>{}, stream);
      return Launch<float>(table, n, tiles, FloatScale<float>{static_cast<float>(factor)}, stream);
    case DataType::kFloat64:
      if (copy) return Launch<double>(table, n, tiles, Copy<double>{}, stream);
      return Launch<double>(table, n, tiles, FloatScale<double>{factor}, stream);
    case DataType::kFloat16:
      if (copy) return Launch<uint16_t>(table, n, tiles, Copy<uint16_t>{}, stream);
      return Launch<uint16_t>(table, n, tiles, HalfScale{static_cast<float>(factor)}, stream);
    case DataType::kBFloat16:
      if (copy) return Launch<uint16_t>(table, n, tiles, Copy<uint16_t>{}, stream);
      return Launch<uint16_t>(table, n, tiles, BFloat16Scale{static_cast<float>(factor)}, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace hvdl
