// ThreadBackend: a DataBackend for N ranks that are threads of one process (tests only).
//
// The ranks share a ThreadFabric. Each collective is two steps: every rank publishes a pointer to
// its contribution and waits at a barrier; then each rank reads what it needs from the others
// into its own result and waits at a second barrier, so nobody overwrites a buffer another rank
// is still reading. Reductions visit ranks in order 0..n-1 with the CPU kernels, so results are
// deterministic. Only process set 0 (all ranks) exists. With `device_buffers`, Supports() is true
// for device >= 0 instead of the CPU: "device memory" is host memory under HostDeviceOps, which
// lets tests run the executor's device path without a GPU.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/data_backend.h"

namespace hvdl {

class ThreadFabric {
 public:
  explicit ThreadFabric(int n) : n_(n), slots_(static_cast<size_t>(n)) {}
  int size() const { return n_; }
  // Publishes `mine` and returns every rank's pointer once all have published (blocking).
  std::vector<const void*> Exchange(int rank, const void* mine);
  void Barrier();

 private:
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long generation_ = 0;
  std::vector<const void*> slots_;
};

class ThreadBackend : public DataBackend {
 public:
  ThreadBackend(std::shared_ptr<ThreadFabric> fabric, int rank, bool device_buffers)
      : fabric_(std::move(fabric)), rank_(rank), device_buffers_(device_buffers) {}
  const char* name() const override { return device_buffers_ ? "thread-device" : "thread"; }
  bool Supports(OpType op, DataType dtype, int device) const override;
  Status AddProcessSet(int ps, const std::vector<int>& ranks) override;
  Status RemoveProcessSet(int ps) override { return Status::Ok(); }
  int SetSize(int ps) const override { return ps == 0 ? fabric_->size() : 0; }
  Status Allreduce(const AllreduceArgs& args) override;
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype, int ps) override;
  Status Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype, int ps) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op, int ps) override;

 private:
  std::shared_ptr<ThreadFabric> fabric_;
  int rank_;
  bool device_buffers_;
};

}  // namespace hvdl
