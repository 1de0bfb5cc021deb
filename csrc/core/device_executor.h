// DeviceExecutor: runs the executor's batches of device (CUDA) tensors.
//
// The Executor hands over every batch whose response is on a device (device >= 0) and keeps the
// CPU path to itself, untouched. For a device batch, on this rank:
//   1. pick the device: every entry of the batch must be on one device (the adapter enforces one
//      device per process); a rank that joined and has no entry uses the last device it ran on;
//   2. make horovodlite's stream wait for each entry's ready event (the caller's stream at enqueue
//      and at output allocation) - a device-side wait, the host never blocks on it;
//   3. queue pack -> collective -> unpack on that stream: fused tensors are packed into this
//      device's fusion buffer with ONE batched ScaleCopy launch (prescale applied while packing)
//      and unpacked with one launch; a lone allreduce runs in place on its output;
//   4. record the finished event and block in DataBackend::WaitForDevice until the device has run
//      it (NCCL checks asynchronous errors meanwhile), then pass the event to every entry's
//      device_done, so the adapter makes the caller's stream wait on it in synchronize().
// Blocking in step 4 keeps error reporting exact (a collective's failure reaches its own handle)
// at the price of not overlapping the next cycle's negotiation with device work.
//
// Layouts (member-major allgather/reducescatter buffers, dim-0 splits) are the CPU executor's.
// Background thread only. The fusion buffers (one per device) are freed in the destructor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "comm/data_backend.h"
#include "comm/device_ops.h"
#include "core/message.h"
#include "core/process_set.h"
#include "core/tensor_queue.h"

namespace hvdl {

struct DeviceItem {
  const Response* response = nullptr;
  TensorEntry* entry = nullptr;  // nullptr: this rank joined; contributes zeros (allreduce only)
};

class DeviceExecutor {
 public:
  // `ops` and `sets` are not owned and must outlive the executor.
  DeviceExecutor(DeviceOps* ops, ProcessSetTable* sets, int rank);
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  // Names the phase the batch enters, for the timeline (static strings).
  using Phase = std::function<void(const char* activity)>;

  // Runs one planned batch (same op, dtype, scale factors, process set; device placement) on
  // `be` as described above. `extra` receives alltoall's received splits. On a failure after work
  // was queued it still waits for the stream, so no tensor is in use when the entries complete.
  Status Run(std::vector<DeviceItem>& items, DataBackend* be, const Phase& phase,
             std::vector<int64_t>* extra);

 private:
  Status PickDevice(const std::vector<DeviceItem>& items, int* device) const;
  Status WaitReady(const std::vector<DeviceItem>& items);
  Status Buffer(size_t bytes, void** out);
  Status RunOp(std::vector<DeviceItem>& items, DataBackend* be, const Phase& phase,
               std::vector<int64_t>* extra);
  Status Allreduce(std::vector<DeviceItem>& items, DataBackend* be, const Phase& phase);
  Status Allgather(std::vector<DeviceItem>& items, DataBackend* be, const Phase& phase);
  Status Reducescatter(std::vector<DeviceItem>& items, DataBackend* be, const Phase& phase);
  Status Broadcast(DeviceItem& item, DataBackend* be, const Phase& phase);
  Status Alltoall(DeviceItem& item, DataBackend* be, const Phase& phase,
                  std::vector<int64_t>* received);

  struct DeviceBuffer {
    void* data = nullptr;
    size_t capacity = 0;
  };

  DeviceOps* ops_;
  ProcessSetTable* sets_;
  int rank_;
  int last_device_ = 0;
  std::map<int, DeviceBuffer> buffers_;  // fusion buffer per device
};

}  // namespace hvdl
