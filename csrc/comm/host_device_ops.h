// HostDeviceOps: DeviceOps whose "devices" are plain host memory.
//
// It is the CPU reference of the CUDA kernels: ScaleCopy walks the same tiles in the same order
// as the kernel's thread blocks (comm/batch_copy.h) and applies the CPU scaling rules
// (comm/reduce_kernels), so tests without a GPU check the batching logic the kernel uses. Work
// runs eagerly, so every queued operation has finished when the call returns; events are always
// complete. It also counts what it was asked to do, for tests of the executor's device path.
// Same contract as DeviceOps: background thread only.
#pragma once

#include <atomic>
#include <cstdint>

#include "comm/device_ops.h"

namespace hvdl {

struct HostDeviceOpsCounters {
  int64_t launches = 0;        // ScaleCopy calls that moved data (one kernel launch each)
  int64_t regions = 0;         // regions they covered
  int64_t records = 0;         // events recorded
  int64_t host_copies = 0;     // CopyToHost + CopyToDevice calls
};

class HostDeviceOps : public DeviceOps {
 public:
  const char* name() const override { return "host"; }
  Status SetDevice(int device) override;
  int device() const override { return device_; }
  void* stream() override { return &stream_token_; }
  Status Alloc(size_t bytes, void** out) override;
  void Free(int device, void* ptr) override;
  Status AllocHost(size_t bytes, void** out) override;
  void FreeHost(void* ptr) override;
  Status ScaleCopy(const std::vector<CopyRegion>& regions, DataType dtype, double factor) override;
  Status Zero(void* dst, size_t bytes) override;
  Status CopyToHost(void* host, const void* device_src, size_t bytes) override;
  Status CopyToDevice(void* device_dst, const void* host, size_t bytes) override;
  Status Record(std::shared_ptr<DeviceEvent>* out) override;
  Status Synchronize() override { return Status::Ok(); }

  const HostDeviceOpsCounters& counters() const { return counters_; }

 private:
  int device_ = kCpuDevice;
  int stream_token_ = 0;  // stream() must be a stable, non-null pointer
  HostDeviceOpsCounters counters_;
};

// A DeviceEvent that is always complete; counts how often a stream waited on it (any thread).
class HostEvent : public DeviceEvent {
 public:
  explicit HostEvent(int device) : device_(device) {}
  int device() const override { return device_; }
  Status StreamWait(void* stream) override;
  Status Query(bool* done) override;
  Status Synchronize() override { return Status::Ok(); }
  int64_t stream_waits() const { return waits_.load(); }

 private:
  int device_;
  std::atomic<int64_t> waits_{0};
};

}  // namespace hvdl
