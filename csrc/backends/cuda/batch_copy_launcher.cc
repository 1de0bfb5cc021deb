#include "backends/cuda/batch_copy_launcher.h"

#include <cstring>

#include "backends/cuda/batch_copy_kernels.h"
#include "backends/cuda/cuda_util.h"
#include "comm/batch_copy.h"

namespace hvdl {

BatchCopyLauncher::~BatchCopyLauncher() {
  for (Slot& s : slots_) {
    if (s.done != nullptr) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
    if (s.device != nullptr) cudaFree(s.device);
    if (s.host != nullptr) cudaFreeHost(s.host);
  }
}

Status BatchCopyLauncher::Reserve(Slot& slot, size_t bytes) {
  if (slot.done == nullptr) HVDL_CUDA(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  // The slot's previous launch must have consumed its tables before they are rewritten.
  HVDL_CUDA(cudaEventSynchronize(slot.done));
  if (bytes <= slot.capacity) return Status::Ok();
  if (slot.device != nullptr) HVDL_CUDA(cudaFree(slot.device));
  if (slot.host != nullptr) HVDL_CUDA(cudaFreeHost(slot.host));
  slot.device = slot.host = nullptr;
  slot.capacity = 0;
  const size_t grown = bytes < 16384 ? 16384 : bytes * 2;
  HVDL_CUDA(cudaHostAlloc(&slot.host, grown, cudaHostAllocDefault));
  HVDL_CUDA(cudaMalloc(&slot.device, grown));
  slot.capacity = grown;
  return Status::Ok();
}

Status BatchCopyLauncher::Launch(const std::vector<CopyRegion>& regions, DataType dtype,
                                 double factor, cudaStream_t stream) {
  // 1. Keep the regions with data; their tile starts follow them in the table.
  std::vector<CopyRegion> kept;
  std::vector<int64_t> counts;
  for (const CopyRegion& r : regions) {
    if (r.count > 0 && (r.dst != r.src || (factor != 1.0 && dtype != DataType::kBool))) {
      kept.push_back(r);
      counts.push_back(r.count);
    }
  }
  if (kept.empty()) return Status::Ok();
  const std::vector<int64_t> starts = batch::TileStarts(counts);
  const size_t region_bytes = kept.size() * sizeof(CopyRegion);
  const size_t bytes = region_bytes + starts.size() * sizeof(int64_t);
  // 2. Fill a free slot and copy it to the device, in stream order before the kernel.
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  HVDL_RETURN_IF_ERROR(Reserve(slot, bytes));
  std::memcpy(slot.host, kept.data(), region_bytes);
  std::memcpy(static_cast<char*>(slot.host) + region_bytes, starts.data(),
              starts.size() * sizeof(int64_t));
  HVDL_CUDA(cudaMemcpyAsync(slot.device, slot.host, bytes, cudaMemcpyHostToDevice, stream));
  // 3. One launch for every region; the event frees the slot once the kernel has read it.
  HVDL_CUDA(LaunchBatchScaleCopy(slot.device, static_cast<int>(kept.size()), starts.back(), dtype,
                                 factor, stream));
  HVDL_CUDA(cudaEventRecord(slot.done, stream));
  return Status::Ok();
}

}  // namespace hvdl
