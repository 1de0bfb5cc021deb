#include "backends/cuda/cuda_device_ops.h"

#include "backends/cuda/cuda_event.h"
#include "backends/cuda/cuda_util.h"

namespace hvdl {

CudaDeviceOps::~CudaDeviceOps() {
  for (auto& [device, d] : devices_) {
    cudaSetDevice(device);
    if (d.stream != nullptr) cudaStreamSynchronize(d.stream);
    d.launcher.reset();
    if (d.stream != nullptr) cudaStreamDestroy(d.stream);
  }
}

Status CudaDeviceOps::SetDevice(int device) {
  const int previous = device_;
  device_ = device;  // for error messages
  HVDL_CUDA(cudaSetDevice(device));
  auto it = devices_.find(device);
  if (it == devices_.end()) {
    PerDevice d;
    int least = 0, greatest = 0;
    HVDL_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    Status s = [&]() -> Status {
      HVDL_CUDA(cudaStreamCreateWithPriority(&d.stream, cudaStreamNonBlocking, greatest));
      return Status::Ok();
    }();
    if (!s.ok()) {
      device_ = previous;
      return s;
    }
    d.launcher = std::make_unique<BatchCopyLauncher>(device, rank_);
    devices_.emplace(device, std::move(d));
  }
  return Status::Ok();
}

Status CudaDeviceOps::Current(PerDevice** out) {
  auto it = devices_.find(device_);
  if (it == devices_.end()) {
    return Status::Internal("CudaDeviceOps: no current device on rank " + std::to_string(rank_) +
                            " (SetDevice was not called)");
  }
  *out = &it->second;
  return Status::Ok();
}

void* CudaDeviceOps::stream() {
  auto it = devices_.find(device_);
  return it == devices_.end() ? nullptr : static_cast<void*>(it->second.stream);
}

Status CudaDeviceOps::Alloc(size_t bytes, void** out) {
  HVDL_CUDA(cudaMalloc(out, bytes));
  return Status::Ok();
}

void CudaDeviceOps::Free(int device, void* ptr) {
  cudaSetDevice(device);
  cudaFree(ptr);  // waits for work using it
  if (device_ >= 0) cudaSetDevice(device_);
}

Status CudaDeviceOps::AllocHost(size_t bytes, void** out) {
  HVDL_CUDA(cudaHostAlloc(out, bytes, cudaHostAllocDefault));
  return Status::Ok();
}

void CudaDeviceOps::FreeHost(void* ptr) { cudaFreeHost(ptr); }

Status CudaDeviceOps::ScaleCopy(const std::vector<CopyRegion>& regions, DataType dtype,
                                double factor) {
  PerDevice* d = nullptr;
  HVDL_RETURN_IF_ERROR(Current(&d));
  return d->launcher->Launch(regions, dtype, factor, d->stream);
}

Status CudaDeviceOps::Zero(void* dst, size_t bytes) {
  PerDevice* d = nullptr;
  HVDL_RETURN_IF_ERROR(Current(&d));
  HVDL_CUDA(cudaMemsetAsync(dst, 0, bytes, d->stream));
  return Status::Ok();
}

Status CudaDeviceOps::CopyToHost(void* host, const void* device_src, size_t bytes) {
  PerDevice* d = nullptr;
  HVDL_RETURN_IF_ERROR(Current(&d));
  HVDL_CUDA(cudaMemcpyAsync(host, device_src, bytes, cudaMemcpyDeviceToHost, d->stream));
  return Status::Ok();
}

Status CudaDeviceOps::CopyToDevice(void* device_dst, const void* host, size_t bytes) {
  PerDevice* d = nullptr;
  HVDL_RETURN_IF_ERROR(Current(&d));
  HVDL_CUDA(cudaMemcpyAsync(device_dst, host, bytes, cudaMemcpyHostToDevice, d->stream));
  return Status::Ok();
}

Status CudaDeviceOps::Record(std::shared_ptr<DeviceEvent>* out) {
  PerDevice* d = nullptr;
  HVDL_RETURN_IF_ERROR(Current(&d));
  std::shared_ptr<CudaEvent> ev;
  HVDL_RETURN_IF_ERROR(CudaEvent::Create(device_, d->stream, rank_, &ev));
  *out = std::move(ev);
  return Status::Ok();
}

Status CudaDeviceOps::Synchronize() {
  auto it = devices_.find(device_);
  if (it == devices_.end()) return Status::Ok();  // nothing was ever queued
  HVDL_CUDA(cudaStreamSynchronize(it->second.stream));
  return Status::Ok();
}

}  // namespace hvdl
