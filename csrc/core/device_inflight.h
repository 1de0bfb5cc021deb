// DeviceInFlight: device work whose handles already completed, watched until the device ran it.
//
// With HOROVOD_GPU_COMPLETION=stream the executor does not block the background thread until a
// batch's device work has run (DeviceMemory::End): it hands the batch's "finished" event to the
// entries at once (synchronize() makes the caller's stream wait on it, as DDP's work does) and
// completes the handles, so the host never waits for the GPU on the hot path. The work is then
// tracked here, oldest first, and checked on each background cycle:
//   - Poll retires the work whose event completed (one query per batch, oldest first: one
//     stream runs them in order, so the first pending one ends the scan), and while the oldest
//     is pending asks its backend for an asynchronous failure (NCCL: ncclCommGetAsyncError; the
//     failed communicator is aborted, which also ends a collective that would never finish, so
//     a lost peer cannot hang the caller's stream forever);
//   - Add retires first, and past `max_depth` batches waits for the oldest (a bound on events
//     and on how far the host runs ahead).
// A failure names the batch ("allreduce.grad.w and 3 more") and says its handles had already
// completed. Background thread only.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <string>

#include "comm/data_backend.h"
#include "common/device_event.h"
#include "common/status.h"

namespace hvdl {

class DeviceInFlight {
 public:
  explicit DeviceInFlight(size_t max_depth = 64) : max_depth_(max_depth) {}

  // Tracks `finished`, recorded after `be`'s work for `what` (`be` may be null: no async
  // failures to check). Returns an earlier batch's failure, or the oldest's when it had to wait.
  Status Add(std::shared_ptr<DeviceEvent> finished, DataBackend* be, std::string what);
  // Non-blocking: see above. An error drops the failed batch (reported once).
  Status Poll();
  // Blocking: waits for every tracked batch (the first failure wins; all are dropped).
  Status Drain();
  size_t size() const { return work_.size(); }

 private:
  struct Work {
    std::shared_ptr<DeviceEvent> finished;
    DataBackend* be = nullptr;
    std::string what;
  };
  static Status Failed(const Work& w, const Status& s);

  size_t max_depth_;
  std::deque<Work> work_;
};

}  // namespace hvdl
