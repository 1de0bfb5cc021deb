// The torch adapter: at::Tensor <-> TensorRef, argument validation at call time, output
// allocation once sizes are negotiated, and the per-handle payload that keeps tensors alive.
// The only code (with bindings.cc) that includes torch headers.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/device_event.h"
#include "common/status.h"
#include "common/tensor_ref.h"

namespace hvdl {

// What a handle keeps alive until it is synchronized, and what synchronize returns.
struct TorchPayload {
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;  // allocated in the background thread for allgather & co.
  // The memory the op reads and writes, held by itself: a tensor object kept alive does not
  // keep its memory when Python swaps the storage under it while the op is in flight
  // (`t.data = ...`, `t.set_(...)`, `module.double()`): the ring would write freed memory.
  std::vector<c10::Storage> storages;
  std::vector<int64_t> extra;       // alltoall received splits, join's last rank, process set id
  // CUDA ops: the events after which the outputs are valid (one per device batch), added on the
  // background thread; wait() makes the caller's stream wait on them. Usually added before the
  // handle completes, but a handle an abort completed can be waited for while a batch still
  // runs and adds its event: so both sides go through the lock.
  void AddFinished(const std::shared_ptr<DeviceEvent>& event) {
    std::lock_guard<std::mutex> lock(finished_mu);
    if (finished.empty() || finished.back() != event) finished.push_back(event);
  }
  std::vector<std::shared_ptr<DeviceEvent>> Finished() {
    std::lock_guard<std::mutex> lock(finished_mu);
    return finished;
  }

 private:
  std::mutex finished_mu;
  std::vector<std::shared_ptr<DeviceEvent>> finished;
};

Status ToDataType(const at::Tensor& t, DataType* out);
TensorRef ToRef(const at::Tensor& t, DataType dtype);
// ValueError-class checks shared by every op: defined, contiguous, supported dtype, dense, on
// the CPU or (CUDA builds) a CUDA device.
Status CheckTensor(const at::Tensor& t, const std::string& op, const std::string& name);
// ValueError unless every tensor of a grouped op is on the same device.
Status CheckSameDevice(const std::vector<at::Tensor>& tensors, const std::string& op,
                       const std::vector<std::string>& names);

}  // namespace hvdl
