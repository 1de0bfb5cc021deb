#include "comm/host_staging.h"

#include <algorithm>
#include <memory>
#include <utility>

namespace hvdl {
namespace {

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

size_t Bytes(int64_t count, DataType dtype) {
  return static_cast<size_t>(count) * DataTypeSize(dtype);
}

}  // namespace

HostStagingBackend::HostStagingBackend(DataBackend* host, DeviceOps* ops, SetRank set_rank,
                                       size_t chunk_bytes)
    : host_(host), ops_(ops), set_rank_(std::move(set_rank)), chunk_bytes_(chunk_bytes) {}

HostStagingBackend::~HostStagingBackend() {
  if (staging_ != nullptr) {
    ops_->Synchronize();  // no pending copy may still read or write the buffer
    ops_->FreeHost(staging_);
  }
}

bool HostStagingBackend::Supports(OpType op, DataType dtype, int device) const {
  return device != kCpuDevice && host_->Supports(op, dtype, kCpuDevice);
}

// Copies queued into and out of the buffer run in stream order, so reuse needs no wait; freeing
// the old buffer does, because a copy back to the device may still be reading it.
Status HostStagingBackend::Stage(size_t bytes, char** out) {
  if (bytes > capacity_ || staging_ == nullptr) {
    if (staging_ != nullptr) {
      HVDL_RETURN_IF_ERROR(ops_->Synchronize());
      ops_->FreeHost(staging_);
    }
    staging_ = nullptr;
    capacity_ = 0;
    size_t grown = bytes < 4096 ? 4096 : bytes;
    HVDL_RETURN_IF_ERROR(ops_->AllocHost(grown, &staging_));
    capacity_ = grown;
  }
  *out = static_cast<char*>(staging_);
  return Status::Ok();
}

Status HostStagingBackend::Pipelined(void* device, char* host, size_t bytes, size_t elem,
                                     bool copy_in,
                                     const std::function<Status(char*, size_t)>& collective) {
  char* dev = static_cast<char*>(device);
  const size_t chunk = chunk_bytes_ == 0 ? bytes : std::max(elem, chunk_bytes_ / elem * elem);
  if (bytes <= chunk) {  // one piece: nothing to overlap
    if (copy_in) HVDL_RETURN_IF_ERROR(ops_->CopyToHost(host, dev, bytes));
    HVDL_RETURN_IF_ERROR(ops_->Synchronize());
    HVDL_RETURN_IF_ERROR(collective(host, bytes));
    return ops_->CopyToDevice(dev, host, bytes);
  }
  const size_t n = (bytes + chunk - 1) / chunk;
  auto length = [&](size_t k) { return std::min(chunk, bytes - k * chunk); };
  // landed[k]: chunk k's copy to the host has run (with everything queued before it: the
  // executor's packing, for chunk 0).
  std::vector<std::shared_ptr<DeviceEvent>> landed(n);
  auto queue_in = [&](size_t k) -> Status {
    if (copy_in) HVDL_RETURN_IF_ERROR(ops_->CopyToHost(host + k * chunk, dev + k * chunk, length(k)));
    return ops_->Record(&landed[k]);
  };
  HVDL_RETURN_IF_ERROR(queue_in(0));
  HVDL_RETURN_IF_ERROR(queue_in(1));
  for (size_t k = 0; k < n; ++k) {
    HVDL_RETURN_IF_ERROR(landed[k]->Synchronize());
    landed[k].reset();
    HVDL_RETURN_IF_ERROR(collective(host + k * chunk, length(k)));
    HVDL_RETURN_IF_ERROR(ops_->CopyToDevice(dev + k * chunk, host + k * chunk, length(k)));
    if (k + 2 < n) HVDL_RETURN_IF_ERROR(queue_in(k + 2));
  }
  return Status::Ok();
}

// Every method: size the staging buffer, queue the device-to-host copies, wait for the stream
// (the host must not read the buffer before they land), run the host collective, queue the copy
// back. Allreduce and broadcast do it in chunks (Pipelined).
Status HostStagingBackend::Allreduce(const AllreduceArgs& args) {
  if (!args.chunks.empty()) {
    return Status::Internal("host staging: span (ring) allreduce of device buffers is not "
                            "supported; the executor packs device tensors into one buffer");
  }
  const size_t elem = DataTypeSize(args.dtype);
  const size_t bytes = Bytes(args.count, args.dtype);
  char* host = nullptr;
  HVDL_RETURN_IF_ERROR(Stage(bytes, &host));
  return Pipelined(args.buf, host, bytes, elem, true, [&](char* part, size_t part_bytes) {
    AllreduceArgs on_host = args;
    on_host.buf = part;
    on_host.count = static_cast<int64_t>(part_bytes / elem);
    on_host.plan = nullptr;  // the device plan chose this backend; the host part plans itself
    return host_->Allreduce(on_host);
  });
}

Status HostStagingBackend::Allgatherv(const void* send, void* recv,
                                      const std::vector<int64_t>& counts, DataType dtype, int ps) {
  // This rank's block goes straight to its place in the host buffer, from `send` or (in place)
  // from its place in `recv`; the host backend then gathers in place.
  const size_t me = static_cast<size_t>(set_rank_(ps));
  if (me >= counts.size()) {
    return Status::Internal("host staging allgather: this rank is not a member of process set " +
                            std::to_string(ps));
  }
  int64_t offset = 0;
  for (size_t m = 0; m < me; ++m) offset += counts[m];
  const size_t total = Bytes(Sum(counts), dtype);
  char* host = nullptr;
  HVDL_RETURN_IF_ERROR(Stage(total, &host));
  const size_t at = Bytes(offset, dtype);
  const void* mine = send != nullptr ? send : static_cast<const char*>(recv) + at;
  HVDL_RETURN_IF_ERROR(ops_->CopyToHost(host + at, mine, Bytes(counts[me], dtype)));
  HVDL_RETURN_IF_ERROR(ops_->Synchronize());
  HVDL_RETURN_IF_ERROR(host_->Allgatherv(nullptr, host, counts, dtype, ps));
  return ops_->CopyToDevice(recv, host, total);
}

Status HostStagingBackend::Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) {
  const size_t elem = DataTypeSize(dtype);
  const size_t bytes = Bytes(count, dtype);
  char* host = nullptr;
  HVDL_RETURN_IF_ERROR(Stage(bytes, &host));
  const bool is_root = set_rank_(ps) == root;  // only the root's data is read
  return Pipelined(buf, host, bytes, elem, is_root, [&](char* part, size_t part_bytes) {
    return host_->Broadcast(part, static_cast<int64_t>(part_bytes / elem), dtype, root, ps);
  });
}

Status HostStagingBackend::Alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                                     void* recv, const std::vector<int64_t>& recv_counts,
                                     DataType dtype, int ps) {
  const size_t send_bytes = Bytes(Sum(send_counts), dtype);
  const size_t recv_bytes = Bytes(Sum(recv_counts), dtype);
  char* host = nullptr;
  HVDL_RETURN_IF_ERROR(Stage(send_bytes + recv_bytes, &host));
  HVDL_RETURN_IF_ERROR(ops_->CopyToHost(host, send, send_bytes));
  HVDL_RETURN_IF_ERROR(ops_->Synchronize());
  HVDL_RETURN_IF_ERROR(host_->Alltoallv(host, send_counts, host + send_bytes, recv_counts, dtype, ps));
  return ops_->CopyToDevice(recv, host + send_bytes, recv_bytes);
}

Status HostStagingBackend::ReduceScatter(const void* send, void* recv,
                                         const std::vector<int64_t>& counts, DataType dtype,
                                         ReduceOp op, int ps) {
  const size_t me = static_cast<size_t>(set_rank_(ps));
  if (me >= counts.size()) {
    return Status::Internal("host staging reducescatter: this rank is not a member of process "
                            "set " + std::to_string(ps));
  }
  const size_t send_bytes = Bytes(Sum(counts), dtype);
  const size_t recv_bytes = Bytes(counts[me], dtype);
  char* host = nullptr;
  HVDL_RETURN_IF_ERROR(Stage(send_bytes + recv_bytes, &host));
  HVDL_RETURN_IF_ERROR(ops_->CopyToHost(host, send, send_bytes));
  HVDL_RETURN_IF_ERROR(ops_->Synchronize());
  // The staged copy is ours: reduced in place.
  HVDL_RETURN_IF_ERROR(
      host_->ReduceScatterScratch(host, host + send_bytes, counts, dtype, op, ps));
  return ops_->CopyToDevice(recv, host + send_bytes, recv_bytes);
}

}  // namespace hvdl
