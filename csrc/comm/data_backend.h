// DataBackend: runs the collectives of a process set on buffers.
//
// Implementations: the host collectives (comm/host_collectives: every algorithm over a Fabric's
// transports, plus a transport family's native collectives where it has them - MPI's), NCCL
// (device buffers) and host staging (device buffers through the host collectives). The registry
// picks, per operation, the first backend whose Supports() is true; the allreduce planner
// (comm/allreduce_planner) picks the allreduce's algorithm. Every method is called from the
// background thread only and blocks until the data is in place on this rank. Buffers are
// caller-owned; counts are elements of `dtype`; `ps` is the process set id and every rank index
// is set-relative. Reductions here are elementwise Sum/Min/Max/Product: the planner turns Average
// into Sum and a postscale, so every backend shares one definition. Failures return a Status
// naming the call; nothing throws.
//
// Device buffers (device >= 0; see comm/device_ops.h): a backend that supports them queues its
// work on the current device's horovodlite stream and returns once it is queued ("in place" then
// means: in place for work queued later on that stream). The executor calls WaitForDevice once
// per batch before it reports completion.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/config.h"
#include "common/device_event.h"
#include "common/status.h"
#include "common/tensor_ref.h"
#include "common/types.h"

namespace hvdl {

struct AllreducePlan;  // comm/allreduce_planner.h

struct AllreduceArgs {
  void* buf = nullptr;  // in place: this rank's contribution in, the reduction out
  int64_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int ps = 0;
  double postscale = 1.0;  // applied to the result by the backend
  // Ring and hierarchical plans: the data as spans per ring chunk (tensors reduced in place, no
  // fusion buffer). When set, `buf` is unused; `count` is the total.
  std::vector<std::vector<Span>> chunks;
  // The planner's decision; null: the backend asks the planner itself (host staging's buffer).
  const AllreducePlan* plan = nullptr;
  // Where set, an algorithm of several stages names each as it starts (the timeline's phases).
  std::function<void(const char* activity)> phase;
};

class DataBackend {
 public:
  virtual ~DataBackend() = default;
  virtual const char* name() const = 0;
  virtual bool Supports(OpType op, DataType dtype, int device) const = 0;

  // Collective over every rank of the job, in the agreed order: creates/destroys the
  // communicator of a process set. Non-members take part but get nothing.
  virtual Status AddProcessSet(int ps, const std::vector<int>& ranks) = 0;
  virtual Status RemoveProcessSet(int ps) = 0;

  virtual Status Allreduce(const AllreduceArgs& args) = 0;
  // Number of members of process set `ps` as this backend sees them.
  virtual int SetSize(int ps) const = 0;
  // The backend runs horovodlite's algorithms over transports (ring, hierarchical), so the
  // planner may choose them for it.
  virtual bool runs_algorithms() const { return false; }
  // The backend's collectives run natively on device memory (NCCL), not through the host.
  virtual bool native_device() const { return false; }
  // Ring transports (one per process set used so far) that copy straight from peer memory.
  virtual int single_copy_transports() const { return 0; }
  // Summed over those transports: members this rank exchanges with by single copy (the others,
  // on other hosts or where the kernel refused, by messages).
  virtual int single_copy_peers() const { return 0; }
  // Allreduces that went through comm/hierarchical (HOROVOD_HIERARCHICAL_ALLREDUCE).
  virtual int64_t hierarchical_allreduces() const { return 0; }
  virtual int64_t hierarchical_allgathers() const { return 0; }
  virtual int64_t hierarchical_reducescatters() const { return 0; }
  // recv receives every member's block, member i's block of counts[i] elements at offset
  // sum(counts[0..i)). send holds counts[my rank] elements, or is nullptr when this rank's block
  // is already in place inside recv.
  virtual Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DataType dtype, int ps) = 0;
  // In place from member `root` to all.
  virtual Status Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) = 0;
  // send_counts[i] elements go to member i; recv_counts[i] come from member i; blocks are packed
  // back to back in member order.
  virtual Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                           const std::vector<int64_t>& recv_counts, DataType dtype, int ps) = 0;
  // Reduces `send` (sum(counts) elements) across members; member i receives block i
  // (counts[i] elements) into `recv`.
  virtual Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                               DataType dtype, ReduceOp op, int ps) = 0;
  // ReduceScatter of `work`, scratch the backend may overwrite (a fusion buffer): a backend that
  // reduces in place skips copying it first.
  virtual Status ReduceScatterScratch(void* work, void* recv, const std::vector<int64_t>& counts,
                                      DataType dtype, ReduceOp op, int ps) {
    return ReduceScatter(work, recv, counts, dtype, op, ps);
  }
  // Device buffers only, background thread: blocks until `event` (recorded after this backend's
  // queued work) has completed. A backend whose work can fail asynchronously (NCCL) checks for
  // such failures while it waits and returns them as a Status naming the rank.
  virtual Status WaitForDevice(DeviceEvent* event) { return event->Synchronize(); }
  // Device buffers only, background thread, non-blocking: a failure of work queued earlier that
  // the backend learnt of asynchronously (NCCL: ncclCommGetAsyncError, after which the failed
  // communicator is aborted), as a Status naming the rank; Ok when there is none.
  virtual Status CheckAsync() { return Status::Ok(); }
  // Device buffers only, background thread, on a failure path: ends this backend's device work
  // that may never finish (NCCL: aborts its communicators, whose kernels then exit; the next
  // collective on a process set builds a new one). Work that can always finish: nothing to do.
  virtual void AbortDevice() {}
};

}  // namespace hvdl
