// Executor: runs one cycle's agreed responses on the data backends, in the agreed order.
//
// Background thread only. For each response it takes this rank's entry back from the TensorQueue
// (a rank outside the response's process set skips it; a joined rank contributes zeros to
// allreduces), plans fusion (core/fusion), runs each batch - data collectives through the per-op
// code of core/batch_ops, in host or device memory (core/batch_memory); barriers, joins and
// process-set changes here - and finally calls every entry's `done` exactly once, with the error
// (prefixed with the op and tensor name) if the collective failed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/allreduce_planner.h"
#include "comm/backend_registry.h"
#include "comm/device_ops.h"
#include "core/batch_memory.h"
#include "core/batch_ops.h"
#include "core/fusion.h"
#include "core/message.h"
#include "core/process_set.h"
#include "core/tensor_queue.h"

namespace hvdl {

// Observes the phases of execution (timeline, performance summary). Background thread.
class ExecutionObserver {
 public:
  virtual ~ExecutionObserver() = default;
  // False when nobody records phases (no timeline): the executor then skips naming tensors.
  virtual bool Recording() const = 0;
  // A batch starts; a Member call per tensor names them (name and process set); Activity and
  // Done refer to it.
  virtual void Begin() = 0;
  virtual void Member(const std::string& name, int32_t process_set) = 0;
  // The batch enters `activity`, e.g. "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE"; its previous
  // activity ends.
  virtual void Activity(const char* activity) = 0;
  // The batch completed (successfully or not).
  virtual void Done() = 0;
  // One collective of `tensors` tensors moved `bytes` of payload in `seconds`.
  virtual void CollectiveDone(OpType op, int tensors, int64_t bytes, int set_size,
                              double seconds) = 0;
};

struct ExecutorDeps {
  TensorQueue* queue = nullptr;
  ProcessSetTable* sets = nullptr;
  BackendRegistry* backends = nullptr;
  FusionBuffer* fusion = nullptr;
  const AllreducePlanner* planner = nullptr;
  int rank = 0;
  // Device tensors (CUDA builds): batches whose response is on a device run in DeviceMemory
  // over these ops; nullptr in a CPU-only build.
  DeviceOps* device_ops = nullptr;
};

class Executor {
 public:
  explicit Executor(const ExecutorDeps& deps);
  void set_fusion_threshold(int64_t bytes) { threshold_ = bytes; }
  int64_t fusion_threshold() const { return threshold_; }
  void set_observer(ExecutionObserver* observer) { observer_ = observer; }

  // Runs `responses` (identical on every rank). `joined`: this rank has called join().
  // Returns the number of responses that involved this rank.
  int Run(const std::vector<Response>& responses, bool joined);
  // HOROVOD_GPU_COMPLETION=stream: device batches complete their handles once queued, and their
  // device work is watched by PollDevice (core/device_inflight.h). No effect without a device.
  void set_stream_completion(bool on);
  // Stream completion's failure path (DeviceMemory::set_failure_wait); tests shorten it.
  void set_failure_wait(double seconds);
  // Each background cycle: retires device work that has run; an asynchronous failure is logged
  // and fails the next device batch (its message names the batch that failed).
  void PollDevice();
  // The last fused batch's bytes and the buffer capacity (performance summary).
  int64_t last_batch_bytes() const { return last_batch_bytes_; }

 private:
  using Items = BatchItems;

  void RunBatch(Items& items);
  Status RunData(Items& items, DataBackend** be, std::vector<int64_t>* extra);
  Status RunProcessSet(BatchItem& item, std::vector<int64_t>* extra);
  int64_t PayloadBytes(const Response& r) const;
  void Phase(const Items& items, const char* activity);
  // Tells the observer, once per batch, which tensors the batch being run has (Finish forgets).
  void Trace(const Items& items);
  void Finish(Items& items, const Status& status, const std::vector<int64_t>& extra);

  ExecutorDeps d_;
  BatchOps ops_;
  HostMemory host_;
  std::unique_ptr<DeviceMemory> device_;  // set when d_.device_ops is
  int64_t threshold_ = 0;
  ExecutionObserver* observer_ = nullptr;
  const Items* traced_ = nullptr;
  int64_t last_batch_bytes_ = 0;
  Status device_failure_;  // from PollDevice, for the next device batch
};

}  // namespace hvdl
