#include "core/batch_memory.h"

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>

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

Status DeviceMemory::WaitAfterFailure(DeviceEvent* finished, DataBackend* be,
                                      const BatchItems& items) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(failure_wait_);
  for (int polls = 0;; ++polls) {
    bool done = false;
    HVDL_RETURN_IF_ERROR(finished->Query(&done));
    if (done) return Status::Ok();
    if (be != nullptr) HVDL_RETURN_IF_ERROR(be->CheckAsync());
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 100 ? 10 : 1000));
  }
  if (be != nullptr) be->AbortDevice();
  std::ostringstream os;
  os << "the device work of " << Describe(items) << " had not finished " << failure_wait_
     << " s after the earlier failure, so the device backend's work was aborted (its "
        "communicators are built again by the next collective)";
  return Status::Aborted(os.str());
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
      // Bounded: after that failure the batch's own collective may wait for a peer that is
      // gone, and a plain stream synchronize behind it would never return.
      Status waited = WaitAfterFailure(finished.get(), be, items);
      if (!waited.ok()) {
        ops_->Synchronize();  // the backend's work was aborted: it returns
        return Status(added.code(), added.message() + "; " + waited.message());
      }
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
