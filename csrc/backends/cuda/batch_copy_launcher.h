// BatchCopyLauncher: builds the region table of the batched ScaleCopy kernel and launches it.
//
// Per launch: the regions (zero-length ones dropped) and their tile starts are written into a
// page-locked host slot, copied to the slot's device table with one async copy, and one kernel
// covers them all. Four slots rotate; an event recorded after each launch tells when a slot's
// host and device tables are free again (normally long before the slot comes round). Tables grow
// on demand; growing frees the old ones only after their event. One launcher per device and
// stream; background thread only.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <vector>

#include "comm/device_ops.h"

namespace hvdl {

class BatchCopyLauncher {
 public:
  BatchCopyLauncher(int device, int rank) : device_(device), rank_(rank) {}
  ~BatchCopyLauncher();  // the device must be current (CudaDeviceOps sees to it)
  BatchCopyLauncher(const BatchCopyLauncher&) = delete;
  BatchCopyLauncher& operator=(const BatchCopyLauncher&) = delete;

  // Queued on `stream`: one launch doing every region (see DeviceOps::ScaleCopy).
  Status Launch(const std::vector<CopyRegion>& regions, DataType dtype, double factor,
                cudaStream_t stream);

 private:
  struct Slot {
    void* host = nullptr;
    void* device = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the last launch that used this slot
  };
  Status Reserve(Slot& slot, size_t bytes);

  int device_;
  int rank_;
  std::array<Slot, 4> slots_;
  size_t next_ = 0;
};

}  // namespace hvdl
