// DeviceOps: the memory operations the executor and the device backends need on an accelerator,
// behind an interface without CUDA types (csrc/core never includes CUDA; docs/architecture.md).
//
// Model. Each device has one horovodlite stream; every queued operation of every device backend
// (NCCL, host staging) runs on it, so the order of pack -> collective -> unpack holds on the
// device without host synchronisation. SetDevice selects the device that every later call acts
// on. Implementations: CudaDeviceOps (backends/cuda, kernels in batch_copy_kernels.cu) and
// HostDeviceOps (comm/host_device_ops: "devices" that are plain host memory; the CPU reference of
// the kernels' logic, used by the unit tests).
//
// Contract for every method: background thread only (not thread-safe); "queued" methods return
// once the work is enqueued on the current device's stream, and the memory they name must stay
// valid until that work has run; failures return a Status naming the call and never throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/device_event.h"
#include "common/status.h"
#include "common/types.h"

namespace hvdl {

// `count` elements from `src` to `dst` (both device memory of the current device). dst == src
// scales in place; otherwise the two must not overlap.
struct CopyRegion {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t count = 0;
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual const char* name() const = 0;

  // Blocking (cheap after the first call per device, which creates the device's stream): makes
  // `device` current for the calling thread and for every later call.
  virtual Status SetDevice(int device) = 0;
  // The current device, or kCpuDevice before the first SetDevice.
  virtual int device() const = 0;
  // The current device's horovodlite stream (cudaStream_t under CUDA); valid until destruction.
  virtual void* stream() = 0;

  // Blocking: `bytes` of memory on the current device; the caller frees it with Free.
  virtual Status Alloc(size_t bytes, void** out) = 0;
  // Blocking: frees memory from Alloc on `device` once the work queued before has finished.
  virtual void Free(int device, void* ptr) = 0;
  // Blocking: `bytes` of page-locked host memory (staging); freed with FreeHost.
  virtual Status AllocHost(size_t bytes, void** out) = 0;
  virtual void FreeHost(void* ptr) = 0;

  // Queued, one launch for all regions: dst[i] = src[i] * factor with the CPU kernels' rules
  // (comm/reduce_kernels: float16/bfloat16 scaled in float32, integers in float64 truncated,
  // bool copied); factor 1 copies. Regions with count 0 are skipped.
  virtual Status ScaleCopy(const std::vector<CopyRegion>& regions, DataType dtype,
                           double factor) = 0;
  // Queued: zeroes `bytes` at `dst`.
  virtual Status Zero(void* dst, size_t bytes) = 0;
  // Queued: copies between page-locked host memory and device memory of the current device.
  virtual Status CopyToHost(void* host, const void* device_src, size_t bytes) = 0;
  virtual Status CopyToDevice(void* device_dst, const void* host, size_t bytes) = 0;

  // Queued: an event that completes once everything queued so far on the current device's stream
  // has run.
  virtual Status Record(std::shared_ptr<DeviceEvent>* out) = 0;
  // Blocking: waits until everything queued so far on the current device's stream has run
  // (a stream wait, never a whole-device synchronisation).
  virtual Status Synchronize() = 0;
};

}  // namespace hvdl
