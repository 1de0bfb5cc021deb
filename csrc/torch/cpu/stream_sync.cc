// torch/stream_sync.h for CPU-only builds: CheckTensor (torch/adapter.cc) rejects CUDA tensors
// with a ValueError naming the build, so no call reaches these; they say why if one ever does.
#include "torch/stream_sync.h"

namespace hvdl {
namespace {

Status NotBuilt(const char* what) {
  return Status::InvalidArgument(std::string(what) + ": this horovodlite was built without CUDA");
}

}  // namespace

Status MarkCallerStream(int device, std::shared_ptr<DeviceEvent>* ready) {
  return NotBuilt("MarkCallerStream");
}

Status AllocateAfter(const std::shared_ptr<DeviceEvent>& ready, const Shape& shape,
                     const at::TensorOptions& options, at::Tensor* out) {
  return NotBuilt("AllocateAfter");
}

Status WaitOnCallerStream(const std::shared_ptr<DeviceEvent>& finished) {
  return NotBuilt("WaitOnCallerStream");
}

}  // namespace hvdl
