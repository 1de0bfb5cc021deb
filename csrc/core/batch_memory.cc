#include "core/batch_memory.h"

#include <cstring>
#include <string>

#include "comm/reduce_kernels.h"

namespace hvdl {

Status HostMemory::Buffer(size_t bytes, void** out) {
  *out = fusion_->Reserve(bytes);
  if (*out != nullptr) return Status::Ok();
  return Status::Internal("out of memory allocating a " + std::to_string(bytes) +
                          "-byte fusion buffer; lower HOROVOD_FUSION_THRESHOLD");
}

Status HostMemory::Copy(const std::vector<CopyRegion>& regions, DataType dtype, double factor) {
  for (const CopyRegion& c : regions) ScaleCopy(c.dst, c.src, c.count, dtype, factor);
  return Status::Ok();
}

Status HostMemory::CopyOne(void* dst, const void* src, int64_t count, DataType dtype,
                           double factor) {
  ScaleCopy(dst, src, count, dtype, factor);
  return Status::Ok();
}

Status HostMemory::Zero(void* dst, size_t bytes) {
  std::memset(dst, 0, bytes);
  return Status::Ok();
}

DeviceMemory::~DeviceMemory() {
  in_flight_.Drain();  // best effort: the buffers below may still be in use
  for (auto& kv : buffers_) {
    if (kv.second.data != nullptr) ops_->Free(kv.first, kv.second.data);
  }
}

Status DeviceMemory::Begin(const BatchItems& items) {
  int device = kCpuDevice;
  for (const BatchItem& it : items) {
    if (!it.has_entry) continue;
    const int d = it.entry.input.device;
    if (device != kCpuDevice && d != device) {
      return Status::InvalidArgument("tensors of one batch are on " + DeviceName(device) +
                                     " and " + DeviceName(d) + " on rank " +
                                     std::to_string(rank_) +
                                     "; horovodlite runs collectives on one GPU per process.");
    }
    device = d;
  }
  if (device == kCpuDevice) device = last_device_;  // joined: zeros on the last device used
  HVDL_RETURN_IF_ERROR(ops_->SetDevice(device));
  last_device_ = device;
  return Status::Ok();
}

Status DeviceMemory::WaitReady(const BatchItems& items) {
  for (const BatchItem& it : items) {
    if (it.has_entry && it.entry.ready) {
      HVDL_RETURN_IF_ERROR(it.entry.ready->StreamWait(ops_->stream()));
    }
  }
  return Status::Ok();
}

Status DeviceMemory::Buffer(size_t bytes, void** out) {
  DeviceBuffer& b = buffers_[ops_->device()];
  if (b.data == nullptr || bytes > b.capacity) {
    if (b.data != nullptr) ops_->Free(ops_->device(), b.data);  // waits for queued work
    b = DeviceBuffer();
    const size_t rounded = (bytes + 255) / 256 * 256;
    Status s = ops_->Alloc(rounded == 0 ? 256 : rounded, &b.data);
    if (!s.ok()) {
      return Status::Internal("out of device memory allocating a " + std::to_string(bytes) +
                              "-byte fusion buffer on " + DeviceName(ops_->device()) +
                              "; lower HOROVOD_FUSION_THRESHOLD (" + s.message() + ")");
    }
    b.capacity = rounded == 0 ? 256 : rounded;
  }
  *out = b.data;
  return Status::Ok();
}

Status DeviceMemory::Copy(const std::vector<CopyRegion>& regions, DataType dtype,
                          double factor) {
  return ops_->ScaleCopy(regions, dtype, factor);
}

Status DeviceMemory::Zero(void* dst, size_t bytes) { return ops_->Zero(dst, bytes); }

// "allreduce.grad.w and 3 more": the batch, for an error found after it completed.
std::string DeviceMemory::Describe(const BatchItems& items) {
  if (items.empty()) return "a batch";
  const Response& r = *items.front().response;
  std::string out = TensorLabel(OpTypeName(r.op), r.name);
  if (items.size() > 1) out += " and " + std::to_string(items.size() - 1) + " more";
  return out;
}

Status DeviceMemory::End(const Status& status, BatchItems& items, DataBackend* be) {
  Status s = status;
  std::shared_ptr<DeviceEvent> finished;
  if (s.ok()) s = ops_->Record(&finished);
  if (s.ok() && stream_completion_) {
    for (BatchItem& it : items) {
      if (it.has_entry && it.entry.device_done) it.entry.device_done(finished);
    }
    Status added = in_flight_.Add(finished, be, Describe(items));
    if (!added.ok()) {
      // An earlier batch's failure fails this batch's entries: its own work must have run
      // before they complete (the user may free the tensors then), on this error path only.
      Status waited = be != nullptr ? be->WaitForDevice(finished.get()) : finished->Synchronize();
      if (!waited.ok()) ops_->Synchronize();  // best effort, as below
    }
    return added;
  }
  if (s.ok()) s = be != nullptr ? be->WaitForDevice(finished.get()) : finished->Synchronize();
  if (!s.ok()) {
    ops_->Synchronize();  // best effort: nothing may still use the tensors; the first error wins
    return s;
  }
  for (BatchItem& it : items) {
    if (it.has_entry && it.entry.device_done) it.entry.device_done(finished);
  }
  return Status::Ok();
}

}  // namespace hvdl
