#include "backends/cuda/cuda_event.h"

#include "backends/cuda/cuda_util.h"

namespace hvdl {

Status CudaEvent::Create(int device, cudaStream_t stream, int rank,
                         std::shared_ptr<CudaEvent>* out) {
  std::shared_ptr<CudaEvent> ev(new CudaEvent(device, rank));
  const int rank_ = rank, device_ = device;  // for HVDL_CUDA's message
  HVDL_CUDA(cudaEventCreateWithFlags(&ev->event_, cudaEventDisableTiming));
  HVDL_CUDA(cudaEventRecord(ev->event_, stream));
  *out = std::move(ev);
  return Status::Ok();
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Status CudaEvent::StreamWait(void* stream) {
  HVDL_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0));
  return Status::Ok();
}

Status CudaEvent::Query(bool* done) {
  cudaError_t rc = cudaEventQuery(event_);
  *done = rc == cudaSuccess;
  if (rc == cudaSuccess || rc == cudaErrorNotReady) return Status::Ok();
  return CudaStatus(rc, "cudaEventQuery", rank_, device_);
}

Status CudaEvent::Synchronize() {
  HVDL_CUDA(cudaEventSynchronize(event_));
  return Status::Ok();
}

}  // namespace hvdl
