#include "comm/host_staging.h"

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

HostStagingBackend::HostStagingBackend(DataBackend* host, DeviceOps* ops, SetRank set_rank)
    : host_(host), ops_(ops), set_rank_(std::move(set_rank)) {}

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

// Every method: size the staging buffer, queue the device-to-host copies, wait for the stream
// (the host must not read the buffer before they land), run the host collective, queue the copy
// back.
Status HostStagingBackend::Allreduce(const AllreduceArgs& args) {
  if (!args.chunks.empty()) {
    return Status::Internal("host staging: span (ring) allreduce of device buffers is not "
                            "supported; the executor packs device tensors into one buffer");
  }
  const size_t bytes = Bytes(args.count, args.dtype);
  char* host = nullptr;
  HVDL_RETURN_IF_ERROR(Stage(bytes, &host));
  HVDL_RETURN_IF_ERROR(ops_->CopyToHost(host, args.buf, bytes));
  HVDL_RETURN_IF_ERROR(ops_->Synchronize());
  AllreduceArgs on_host = args;
  on_host.buf = host;
  on_host.plan = nullptr;  // the device plan chose this backend; the host part plans itself
  HVDL_RETURN_IF_ERROR(host_->Allreduce(on_host));
  return ops_->CopyToDevice(args.buf, host, bytes);
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
  const size_t bytes = Bytes(count, dtype);
  char* host = nullptr;
  HVDL_RETURN_IF_ERROR(Stage(bytes, &host));
  HVDL_RETURN_IF_ERROR(ops_->CopyToHost(host, buf, bytes));  // only the root's matters
  HVDL_RETURN_IF_ERROR(ops_->Synchronize());
  HVDL_RETURN_IF_ERROR(host_->Broadcast(host, count, dtype, root, ps));
  return ops_->CopyToDevice(buf, host, bytes);
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
  HVDL_RETURN_IF_ERROR(host_->ReduceScatter(host, host + send_bytes, counts, dtype, op, ps));
  return ops_->CopyToDevice(recv, host + send_bytes, recv_bytes);
}

}  // namespace hvdl
