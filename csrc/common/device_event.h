// DeviceEvent: a point in a device stream's work, as the framework-neutral core sees it.
//
// Two producers implement it: the torch adapter records one on the caller's current CUDA stream
// when an op is enqueued (the op's "ready" event), and a DeviceOps implementation records one on
// horovodlite's own stream when a batch of device work has been queued (the op's "finished"
// event). Streams travel as opaque `void*` (a cudaStream_t under CUDA), so the core never
// includes CUDA headers. Implementations own their native event and release it in the
// destructor; destroying an event that has not completed yet is allowed.
#pragma once

#include "common/status.h"

namespace hvdl {

class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // The device whose stream the event was recorded on.
  virtual int device() const = 0;
  // Non-blocking, any thread: work queued on `stream` after this call starts only once the
  // event has completed (a device-side wait; the host does not block). Error if the runtime
  // rejects the wait.
  virtual Status StreamWait(void* stream) = 0;
  // Non-blocking, any thread: sets `*done` to whether the event has completed. An error status if
  // the device reported a failure of the work before it.
  virtual Status Query(bool* done) = 0;
  // Blocks the calling thread until the event has completed (an event wait, never a whole-device
  // synchronisation).
  virtual Status Synchronize() = 0;
};

}  // namespace hvdl
