// CudaDeviceOps: DeviceOps on CUDA devices (see comm/device_ops.h for the contract).
//
// One non-blocking, high-priority stream per device, created on first use; every queued
// operation of the executor and of the device backends runs on it. ScaleCopy is the batched
// kernel (one launch per call, batch_copy_kernels.cu). Synchronize waits for that stream only,
// never for the whole device. Memory comes from cudaMalloc / cudaHostAlloc (the fusion buffers
// and staging buffers grow rarely; cudaFree may wait for the device, so they are freed only when
// they grow and at shutdown). Errors name the call, this rank and the device.
// Background thread only; the destructor waits for every stream, then releases everything.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>

#include "backends/cuda/batch_copy_launcher.h"
#include "comm/device_ops.h"

namespace hvdl {

class CudaDeviceOps : public DeviceOps {
 public:
  explicit CudaDeviceOps(int rank) : rank_(rank) {}
  ~CudaDeviceOps() override;
  CudaDeviceOps(const CudaDeviceOps&) = delete;
  CudaDeviceOps& operator=(const CudaDeviceOps&) = delete;

  const char* name() const override { return "cuda"; }
  Status SetDevice(int device) override;
  int device() const override { return device_; }
  void* stream() override;
  Status Alloc(size_t bytes, void** out) override;
  void Free(int device, void* ptr) override;
  Status AllocHost(size_t bytes, void** out) override;
  void FreeHost(void* ptr) override;
  Status ScaleCopy(const std::vector<CopyRegion>& regions, DataType dtype, double factor) override;
  Status Zero(void* dst, size_t bytes) override;
  Status CopyToHost(void* host, const void* device_src, size_t bytes) override;
  Status CopyToDevice(void* device_dst, const void* host, size_t bytes) override;
  Status Record(std::shared_ptr<DeviceEvent>* out) override;
  Status Synchronize() override;

 private:
  struct PerDevice {
    cudaStream_t stream = nullptr;
    std::unique_ptr<BatchCopyLauncher> launcher;
  };
  Status Current(PerDevice** out);

  int rank_;
  int device_ = kCpuDevice;
  std::map<int, PerDevice> devices_;
};

}  // namespace hvdl
