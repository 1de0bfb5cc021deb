// CudaEvent: DeviceEvent over a cudaEvent_t recorded on a horovodlite stream (the "finished"
// event of a device batch). Created by CudaDeviceOps::Record; destroyed when the last holder (the
// executor, the adapter's handle payload) lets go, which CUDA allows before completion.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "common/device_event.h"

namespace hvdl {

class CudaEvent : public DeviceEvent {
 public:
  // Creates an event (timing disabled) and records it on `stream` of `device`.
  static Status Create(int device, cudaStream_t stream, int rank, std::shared_ptr<CudaEvent>* out);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  int device() const override { return device_; }
  Status StreamWait(void* stream) override;
  Status Query(bool* done) override;
  Status Synchronize() override;

 private:
  CudaEvent(int device, int rank) : device_(device), rank_(rank) {}
  int device_;
  int rank_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace hvdl
