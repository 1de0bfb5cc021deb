// torch/stream_sync.h for CUDA builds: raw CUDA events on torch's current streams.
#include "torch/stream_sync.h"

#include <ATen/ops/empty.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <string>

namespace hvdl {
namespace {

Status CudaError(cudaError_t rc, const char* call) {
  return Status::Internal(std::string(call) + " failed: " + cudaGetErrorString(rc));
}

// The caller's stream at enqueue: the event and the stream it is (re-)recorded on.
class CallerStreamEvent : public DeviceEvent {
 public:
  CallerStreamEvent(int device, c10::cuda::CUDAStream stream, cudaEvent_t event)
      : device_(device), stream_(stream), event_(event) {}
  ~CallerStreamEvent() override { cudaEventDestroy(event_); }
  int device() const override { return device_; }
  const c10::cuda::CUDAStream& stream() const { return stream_; }

  Status Record() {
    cudaError_t rc = cudaEventRecord(event_, stream_.stream());
    return rc == cudaSuccess ? Status::Ok() : CudaError(rc, "cudaEventRecord (caller's stream)");
  }
  Status StreamWait(void* stream) override {
    cudaError_t rc = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0);
    return rc == cudaSuccess ? Status::Ok() : CudaError(rc, "cudaStreamWaitEvent (ready event)");
  }
  Status Query(bool* done) override {
    cudaError_t rc = cudaEventQuery(event_);
    *done = rc == cudaSuccess;
    if (rc == cudaSuccess || rc == cudaErrorNotReady) return Status::Ok();
    return CudaError(rc, "cudaEventQuery (ready event)");
  }
  Status Synchronize() override {
    cudaError_t rc = cudaEventSynchronize(event_);
    return rc == cudaSuccess ? Status::Ok() : CudaError(rc, "cudaEventSynchronize (ready event)");
  }

 private:
  int device_;
  c10::cuda::CUDAStream stream_;
  cudaEvent_t event_;
};

}  // namespace

Status MarkCallerStream(int device, std::shared_ptr<DeviceEvent>* ready) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDAGuard guard(index);  // the event is created on the stream's device
  c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(index);
  cudaEvent_t event = nullptr;
  cudaError_t rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (rc != cudaSuccess) return CudaError(rc, "cudaEventCreateWithFlags");
  auto mark = std::make_shared<CallerStreamEvent>(device, stream, event);
  HVDL_RETURN_IF_ERROR(mark->Record());
  *ready = std::move(mark);
  return Status::Ok();
}

Status AllocateAfter(const std::shared_ptr<DeviceEvent>& ready, const Shape& shape,
                     const at::TensorOptions& options, at::Tensor* out) {
  auto* mark = static_cast<CallerStreamEvent*>(ready.get());
  c10::cuda::CUDAStreamGuard guard(mark->stream());  // also makes its device current
  *out = at::empty(shape, options);
  return mark->Record();
}

Status WaitOnCallerStream(const std::shared_ptr<DeviceEvent>& finished) {
  const auto index = static_cast<c10::DeviceIndex>(finished->device());
  cudaStream_t caller = c10::cuda::getCurrentCUDAStream(index).stream();
  return finished->StreamWait(caller);
}

}  // namespace hvdl
