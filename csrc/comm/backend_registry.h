// BackendRegistry: the data backends of a runtime, chosen per operation by capability.
//
// Backends are tried in the order the composition root (csrc/runtime) adds them: the host
// backend (CPU buffers), then in CUDA builds NCCL (device buffers, when built and
// HOROVOD_GPU_OPERATIONS=nccl) and host staging (device buffers of any op/dtype the host backend
// supports, e.g. int16 and bool that NCCL lacks).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/data_backend.h"

namespace hvdl {

class BackendRegistry {
 public:
  void Add(std::unique_ptr<DataBackend> backend);
  // The first backend whose Supports() is true; otherwise an error naming the op, dtype, device
  // and the backends that were built.
  Status Select(OpType op, DataType dtype, int device, DataBackend** out) const;
  // Collective over every rank, in the agreed order: forwards to every backend.
  Status AddProcessSet(int ps, const std::vector<int>& ranks);
  Status RemoveProcessSet(int ps);
  std::vector<DataBackend*> all() const;
  std::string Names() const;

 private:
  std::vector<std::unique_ptr<DataBackend>> backends_;
};

}  // namespace hvdl
