// hvdl_cuda_check: built by -DHVDL_CUDA_COMPILE_CHECK=ON (tests/unit/test_cuda_build.py).
//
// Linking it proves that the whole runtime - Context, executor, device executor, NCCL backend,
// CUDA device ops and kernels - resolves against libcudart and libnccl. Run without a GPU it
// prints the NCCL versions and exits 0 ("link check only"). Run on a machine with a GPU it also
// checks the batched ScaleCopy kernel against its CPU reference (HostDeviceOps) for every dtype
// and factor, bit for bit, and exits 1 on a mismatch:
//     build/cuda-check/hvdl_cuda_check
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/cuda_device_ops.h"
#include "runtime/build_info.h"
#include "comm/host_device_ops.h"
#include "comm/reduce_kernels.h"
#include "core/context.h"
#if HVDL_WITH_NCCL
#include "backends/nccl/nccl_backend.h"
#endif

namespace {

using hvdl::CopyRegion;
using hvdl::DataType;

// Regions of every awkward size around the kernel's tile (4096 elements), one empty.
const std::vector<int64_t> kCounts = {1, 0, 4095, 4096, 4097, 3, 100000, 12289};

// Values whose scaled results stay representable (out-of-range conversions are undefined).
std::vector<unsigned char> Fill(DataType dtype, int64_t total, unsigned seed) {
  const size_t esize = hvdl::DataTypeSize(dtype);
  std::vector<unsigned char> out(static_cast<size_t>(total) * esize);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-8.0, 8.0);
  std::uniform_int_distribution<int> small(0, 32);
  for (int64_t i = 0; i < total; ++i) {
    unsigned char* p = out.data() + static_cast<size_t>(i) * esize;
    const double x = real(rng);
    const int k = small(rng) - (dtype == DataType::kUInt8 ? 0 : 16);
    switch (dtype) {
      case DataType::kFloat32: { float f = static_cast<float>(x); std::memcpy(p, &f, 4); break; }
      case DataType::kFloat64: std::memcpy(p, &x, 8); break;
      case DataType::kFloat16: {
        uint16_t h = hvdl::FloatToHalf(static_cast<float>(x));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        uint16_t b = hvdl::FloatToBFloat16(static_cast<float>(x));
        std::memcpy(p, &b, 2);
        break;
      }
      case DataType::kBool: *p = static_cast<unsigned char>(k & 1); break;
      case DataType::kInt64: { int64_t v = k; std::memcpy(p, &v, 8); break; }
      case DataType::kInt32: { int32_t v = k; std::memcpy(p, &v, 4); break; }
      case DataType::kInt16: { int16_t v = static_cast<int16_t>(k); std::memcpy(p, &v, 2); break; }
      default: *p = static_cast<unsigned char>(static_cast<signed char>(k)); break;
    }
  }
  return out;
}

bool CheckDtype(hvdl::CudaDeviceOps& gpu, DataType dtype, double factor) {
  const size_t esize = hvdl::DataTypeSize(dtype);
  int64_t total = 0;
  for (int64_t c : kCounts) total += c;
  const size_t bytes = static_cast<size_t>(total) * esize;
  std::vector<unsigned char> src = Fill(dtype, total, static_cast<unsigned>(dtype) + 17u);
  std::vector<unsigned char> want(bytes, 0), got(bytes, 0);
  void *d_src = nullptr, *d_dst = nullptr;
  if (!gpu.Alloc(bytes, &d_src).ok() || !gpu.Alloc(bytes, &d_dst).ok()) return false;
  cudaMemcpy(d_src, src.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemset(d_dst, 0, bytes);
  hvdl::HostDeviceOps cpu;
  cpu.SetDevice(0);
  std::vector<CopyRegion> on_gpu, on_cpu;
  int64_t off = 0;
  for (int64_t c : kCounts) {
    const int64_t at = off * static_cast<int64_t>(esize);
    on_gpu.push_back({static_cast<char*>(d_dst) + at, static_cast<char*>(d_src) + at, c});
    on_cpu.push_back({want.data() + at, src.data() + at, c});
    off += c;
  }
  bool ok = gpu.ScaleCopy(on_gpu, dtype, factor).ok() && gpu.Synchronize().ok() &&
            cpu.ScaleCopy(on_cpu, dtype, factor).ok();
  cudaMemcpy(got.data(), d_dst, bytes, cudaMemcpyDeviceToHost);
  ok = ok && std::memcmp(got.data(), want.data(), bytes) == 0;
  gpu.Free(0, d_src);
  gpu.Free(0, d_dst);
  std::printf("  %-9s factor %-5g %s\n", hvdl::DataTypeName(dtype), factor, ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  // Referencing Context::Create makes the linker resolve the whole runtime.
  auto volatile create = &hvdl::Context::Create;
  (void)create;
  int runtime = 0;
#if HVDL_WITH_NCCL
  runtime = hvdl::NcclBackend::RuntimeVersion();
#endif
  std::printf("horovodlite CUDA check: CUDA built %d, NCCL headers %d, NCCL library %d\n",
              hvdl::CudaBuilt() ? 1 : 0, hvdl::NcclVersion(), runtime);
  int devices = 0;
  cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    std::printf("no CUDA device (%s): link check only\n",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return 0;
  }
  hvdl::CudaDeviceOps gpu(0);
  if (!gpu.SetDevice(0).ok()) return 1;
  bool ok = true;
  for (int t = 0; t < hvdl::kNumDataTypes; ++t) {
    const auto dtype = static_cast<DataType>(t);
    for (double factor : {1.0, 0.5, 3.0, -0.25}) {
      if (factor < 0 && dtype == DataType::kUInt8) continue;  // no negative uint8 results
      ok = CheckDtype(gpu, dtype, factor) && ok;
    }
  }
  std::printf("batched ScaleCopy kernel vs CPU reference: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
