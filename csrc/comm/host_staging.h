// HostStagingBackend: every collective on device buffers, through host memory and a host backend.
//
// This is how a CUDA build without NCCL (or with HOROVOD_GPU_OPERATIONS=mpi) runs collectives on
// CUDA tensors. Each call:
//   1. queues copies of the device inputs into one page-locked staging buffer (DeviceOps),
//   2. waits for the device stream (the copies, and everything the executor queued before them),
//   3. runs the same collective on the staging buffer with the host backend (the host
//      collectives, which plan the allreduce's algorithm for the host buffer),
//   4. queues the copy of the result back into device memory.
// Step 4 is ordered before any later work on the stream, so the executor's unpack sees the result.
// Pipeline: an allreduce or broadcast larger than `chunk_bytes` goes in chunks of that size. The
// copy of chunk k+1 off the device is queued before the host reduces chunk k (an event per chunk
// says when it landed), and the copy of chunk k back is queued right after, so the copies overlap
// the host collective of the neighbouring chunk; only the first chunk's copy in and the last
// one's copy out are not hidden. Every member of the set cuts at the same offsets (the chunk is
// HOROVOD_STAGING_CHUNK_BYTES, the same on every rank), so the host collectives match.
// The staging buffer is reused across calls; it grows (after a stream wait, so no pending copy
// still reads the old one) when a larger collective comes.
//
// The host backend is registered in the BackendRegistry on its own, which forwards process-set
// changes to it; this wrapper therefore ignores them. Background thread only, like every backend.
#pragma once

#include <cstddef>
#include <functional>

#include "comm/data_backend.h"
#include "comm/device_ops.h"

namespace hvdl {

class HostStagingBackend : public DataBackend {
 public:
  // This rank's index within process set `ps` (set-relative, as DataBackend counts ranks).
  using SetRank = std::function<int(int ps)>;
  // Neither `host` nor `ops` is owned; both must outlive this backend. `chunk_bytes`: the
  // pipeline's chunk (0: every collective in one piece).
  HostStagingBackend(DataBackend* host, DeviceOps* ops, SetRank set_rank, size_t chunk_bytes = 0);
  ~HostStagingBackend() override;
  HostStagingBackend(const HostStagingBackend&) = delete;
  HostStagingBackend& operator=(const HostStagingBackend&) = delete;

  const char* name() const override { return "host-staged"; }
  // Device buffers, for whatever the host backend supports on the CPU.
  bool Supports(OpType op, DataType dtype, int device) const override;
  Status AddProcessSet(int ps, const std::vector<int>& ranks) override { return Status::Ok(); }
  Status RemoveProcessSet(int ps) override { return Status::Ok(); }
  int SetSize(int ps) const override { return host_->SetSize(ps); }

  Status Allreduce(const AllreduceArgs& args) override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype, int ps) override;
  Status Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype, int ps) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op, int ps) override;

 private:
  // A staging buffer of at least `bytes`, after a stream wait (steps 2 above).
  Status Stage(size_t bytes, char** out);
  // Steps 1-4 for `bytes` at `device` through `host`, in chunks of whole elements of `elem`
  // bytes: `collective(chunk, chunk_bytes)` runs on each chunk of the host buffer once its copy
  // landed. Without `copy_in` nothing is copied to the host (a broadcast's non-root).
  Status Pipelined(void* device, char* host, size_t bytes, size_t elem, bool copy_in,
                   const std::function<Status(char*, size_t)>& collective);

  DataBackend* host_;
  DeviceOps* ops_;
  SetRank set_rank_;
  size_t chunk_bytes_;
  void* staging_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace hvdl
