// BatchMemory: where a batch's tensors live, and how the executor moves their bytes there.
//
// The per-op code (core/batch_ops) is written once against this interface; HostMemory runs it on
// host memory (the CPU kernels, the persistent huge-page fusion buffer), DeviceMemory on an
// accelerator through DeviceOps (one batched launch per copy list, a fusion buffer per device,
// every step queued on horovodlite's stream of the batch's device):
//   1. Begin makes the batch's device current: every entry of a batch is on one device (the
//      adapter enforces one device per process); a rank that joined and has no entry uses the
//      last device it ran on;
//   2. WaitReady makes horovodlite's stream wait for each entry's ready event (the caller's
//      stream at enqueue and at output allocation) - a device-side wait, the host never blocks;
//   3. Copy / Zero / Buffer queue pack and unpack around the collective;
//   4. End records the finished event and blocks in DataBackend::WaitForDevice until the device
//      has run it (NCCL checks asynchronous errors meanwhile), then passes the event to every
//      entry's device_done, so the adapter makes the caller's stream wait on it in
//      synchronize(). Blocking here keeps error reporting exact (a collective's failure reaches
//      its own handle) at the price of not overlapping the next cycle's negotiation with device
//      work. On a failure after work was queued it still waits for the stream, so no tensor is
//      in use when the entries complete.
//      With stream completion (HOROVOD_GPU_COMPLETION=stream) End does not block: it passes the
//      event to the entries at once and hands the batch to DeviceInFlight (core/device_inflight),
//      which the executor polls each cycle; the host never waits for the device on the hot path,
//      and a failure the device reports later reaches the next batch instead of this one
//      (which then waits for its own queued work before its entries fail: the user may free
//      the tensors of a failed op at once).
// Host memory needs none of 1, 2 and 4. Background thread only.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "comm/data_backend.h"
#include "comm/device_ops.h"
#include "core/device_inflight.h"
#include "core/fusion.h"
#include "core/message.h"
#include "core/tensor_queue.h"

namespace hvdl {

// One response of a batch and, unless this rank joined without it, its entry.
struct BatchItem {
  const Response* response = nullptr;
  TensorEntry entry;
  bool has_entry = false;
};
using BatchItems = std::vector<BatchItem>;

class BatchMemory {
 public:
  virtual ~BatchMemory() = default;
  virtual Status Begin(const BatchItems& items) = 0;
  virtual Status WaitReady(const BatchItems& items) = 0;
  // A buffer of at least `bytes` in this memory, reused from batch to batch.
  virtual Status Buffer(size_t bytes, void** out) = 0;
  // dst[i] = src[i] * factor for every region (comm/reduce_kernels' rules; factor 1 copies).
  virtual Status Copy(const std::vector<CopyRegion>& regions, DataType dtype, double factor) = 0;
  // Copy of one region.
  virtual Status CopyOne(void* dst, const void* src, int64_t count, DataType dtype,
                         double factor) {
    return Copy({{dst, src, count}}, dtype, factor);
  }
  virtual Status Zero(void* dst, size_t bytes) = 0;
  // Host memory: copies cost nothing to start, so per-tensor work beats packing (a device
  // launches once per copy list instead).
  virtual bool host() const = 0;
  // The batch's collectives ran on `be` with result `status`; returns the batch's result.
  virtual Status End(const Status& status, BatchItems& items, DataBackend* be) = 0;
};

class HostMemory : public BatchMemory {
 public:
  explicit HostMemory(FusionBuffer* fusion) : fusion_(fusion) {}
  Status Begin(const BatchItems&) override { return Status::Ok(); }
  Status WaitReady(const BatchItems&) override { return Status::Ok(); }
  Status Buffer(size_t bytes, void** out) override;
  Status Copy(const std::vector<CopyRegion>& regions, DataType dtype, double factor) override;
  Status CopyOne(void* dst, const void* src, int64_t count, DataType dtype,
                 double factor) override;
  Status Zero(void* dst, size_t bytes) override;
  bool host() const override { return true; }
  Status End(const Status& status, BatchItems&, DataBackend*) override { return status; }

 private:
  FusionBuffer* fusion_;
};

class DeviceMemory : public BatchMemory {
 public:
  // `ops` is not owned and must outlive this object; `rank` is for messages.
  DeviceMemory(DeviceOps* ops, int rank) : ops_(ops), rank_(rank) {}
  ~DeviceMemory() override;  // frees the fusion buffers
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  Status Begin(const BatchItems& items) override;
  Status WaitReady(const BatchItems& items) override;
  Status Buffer(size_t bytes, void** out) override;
  Status Copy(const std::vector<CopyRegion>& regions, DataType dtype, double factor) override;
  Status Zero(void* dst, size_t bytes) override;
  bool host() const override { return false; }
  Status End(const Status& status, BatchItems& items, DataBackend* be) override;

  // Stream completion (see the top): End hands batches to the in-flight list.
  void set_stream_completion(bool on) { stream_completion_ = on; }
  bool stream_completion() const { return stream_completion_; }
  // Non-blocking: retires the in-flight batches the device has run; an asynchronous failure of
  // one, naming it.
  Status Poll() { return in_flight_.Poll(); }
  size_t in_flight() const { return in_flight_.size(); }
  // How long a batch failed with an earlier batch's error waits for its own device work before
  // the device backend's work is aborted (End); tests shorten it.
  void set_failure_wait(double seconds) { failure_wait_ = seconds; }

 private:
  static std::string Describe(const BatchItems& items);
  // End's failure path: `finished` has completed, or the backend failed, or failure_wait_
  // passed - then the backend's device work is aborted and the error says so.
  Status WaitAfterFailure(DeviceEvent* finished, DataBackend* be, const BatchItems& items);

  struct DeviceBuffer {
    void* data = nullptr;
    size_t capacity = 0;
  };

  DeviceOps* ops_;
  int rank_;
  int last_device_ = 0;
  std::map<int, DeviceBuffer> buffers_;  // fusion buffer per device
  bool stream_completion_ = false;
  double failure_wait_ = 30.0;
  DeviceInFlight in_flight_;
};

}  // namespace hvdl
