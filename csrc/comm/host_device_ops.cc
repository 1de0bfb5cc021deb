#include "comm/host_device_ops.h"

#include <cstdlib>
#include <cstring>

#include "comm/batch_copy.h"
#include "comm/reduce_kernels.h"

namespace hvdl {

Status HostDeviceOps::SetDevice(int device) {
  if (device < 0) {
    return Status::Internal("HostDeviceOps::SetDevice: device " + std::to_string(device) +
                            " is not a device index");
  }
  device_ = device;
  return Status::Ok();
}

Status HostDeviceOps::Alloc(size_t bytes, void** out) {
  *out = std::malloc(bytes == 0 ? 1 : bytes);
  if (*out == nullptr) {
    return Status::Internal("HostDeviceOps::Alloc: out of memory for " + std::to_string(bytes) +
                            " bytes");
  }
  return Status::Ok();
}

void HostDeviceOps::Free(int device, void* ptr) { std::free(ptr); }

Status HostDeviceOps::AllocHost(size_t bytes, void** out) { return Alloc(bytes, out); }

void HostDeviceOps::FreeHost(void* ptr) { std::free(ptr); }

// The kernel's schedule on the CPU: one "thread block" per tile, in tile order.
Status HostDeviceOps::ScaleCopy(const std::vector<CopyRegion>& regions, DataType dtype,
                                double factor) {
  std::vector<int64_t> counts;
  for (const CopyRegion& r : regions) counts.push_back(r.count);
  const std::vector<int64_t> starts = batch::TileStarts(counts);
  const int n = static_cast<int>(regions.size());
  if (n == 0 || starts.back() == 0) return Status::Ok();
  const int64_t esize = static_cast<int64_t>(DataTypeSize(dtype));
  for (int64_t tile = 0; tile < starts.back(); ++tile) {
    const int r = batch::FindRegion(starts.data(), n, tile);
    int64_t first = 0, last = 0;
    batch::TileRange(starts.data(), r, tile, regions[static_cast<size_t>(r)].count, &first, &last);
    const CopyRegion& reg = regions[static_cast<size_t>(r)];
    hvdl::ScaleCopy(static_cast<char*>(reg.dst) + first * esize,
                    static_cast<const char*>(reg.src) + first * esize, last - first, dtype, factor);
  }
  ++counters_.launches;
  counters_.regions += n;
  return Status::Ok();
}

Status HostDeviceOps::Zero(void* dst, size_t bytes) {
  std::memset(dst, 0, bytes);
  return Status::Ok();
}

Status HostDeviceOps::CopyToHost(void* host, const void* device_src, size_t bytes) {
  std::memcpy(host, device_src, bytes);
  ++counters_.host_copies;
  return Status::Ok();
}

Status HostDeviceOps::CopyToDevice(void* device_dst, const void* host, size_t bytes) {
  std::memcpy(device_dst, host, bytes);
  ++counters_.host_copies;
  return Status::Ok();
}

Status HostDeviceOps::Record(std::shared_ptr<DeviceEvent>* out) {
  *out = std::make_shared<HostEvent>(device_);
  ++counters_.records;
  return Status::Ok();
}

Status HostEvent::StreamWait(void* stream) {
  if (stream == nullptr) return Status::Internal("HostEvent::StreamWait: null stream");
  ++waits_;
  return Status::Ok();
}

Status HostEvent::Query(bool* done) {
  *done = true;
  return Status::Ok();
}

}  // namespace hvdl
