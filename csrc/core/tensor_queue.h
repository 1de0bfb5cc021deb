// TensorQueue: where user threads hand work to the background thread, keyed by name.
//
// User threads call Add (never blocks on communication). The background thread drains new
// requests with PopRequests, later takes an entry back by name once its response is agreed, and
// completes it with Complete: the entry's callback, then its name freed, then its handle marked
// done. A name is taken from Add until Complete: a second Add under a taken name fails with
// kInvalidArgument and enqueues nothing. As on Horovod, the name is free again once the
// collective completed, whether or not its handle was synchronized. (This rule lived in Python,
// as a dictionary of reserved names per handle: keeping it here, where the queue already looks
// every name up, took ~0.3 us per allreduce_async_/synchronize pair off the training thread.)
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/device_event.h"
#include "common/status.h"
#include "common/tensor_ref.h"
#include "core/message.h"

namespace hvdl {

struct TensorEntry {
  std::string name;
  OpType op = OpType::kAllreduce;
  TensorRef input;
  TensorRef output;  // allgather/alltoall/reducescatter: filled by `allocate` once sizes are known
  // Host allreduce in place of one tensor that lives in several runs of memory (a gradient
  // bucket whose gradients are tensors of their own): its elements, in order, are these runs
  // (input and output are the first). Negotiated as one tensor of the runs' total count.
  std::vector<Span> pieces;
  int process_set = 0;
  // Allocates the output for `shape` (background thread). Set for ops whose output size is known
  // only after negotiation.
  std::function<Status(const Shape& shape, TensorRef* out)> allocate;
  // Optional; runs once, on the background thread (TensorQueue::Complete). `extra` carries
  // op-specific results: alltoall's received splits, join's last rank.
  std::function<void(const Status& status, const std::vector<int64_t>& extra)> done;
  // Device tensors only (unset for CPU tensors), see core/batch_memory.h:
  // `ready` marks the work the caller queued on its stream before the op (the adapter re-records
  // it when `allocate` hands out an output); the executor's stream waits for it before it touches
  // the tensors. `device_done` runs on the background thread just before `done`, with the event
  // after which the outputs are valid; the adapter makes the caller's stream wait for it.
  std::shared_ptr<DeviceEvent> ready;
  std::function<void(const std::shared_ptr<DeviceEvent>& finished)> device_done;
  std::chrono::steady_clock::time_point enqueued;
  int handle = -1;                  // the HandleTable handle Complete marks (-1: none)
  std::shared_ptr<void> keepalive;  // owner of the tensors, held until the entry completes
  const std::string* key = nullptr;  // TensorQueue: the name's slot, from Add until Complete
};

class HandleTable;

class TensorQueue {
 public:
  // `handles`: where Complete marks each entry's handle done (none when null).
  explicit TensorQueue(HandleTable* handles = nullptr) : handles_(handles) {}
  // Adds entries and their requests atomically (a grouped op adds several).
  Status Add(std::vector<TensorEntry> entries, std::vector<Request> requests);
  // Completes an entry Take returned: runs its callback, frees its name, then marks its handle
  // done (in that order: the handle's owner may reuse the name as soon as it sees it done).
  // Background thread.
  void Complete(TensorEntry* entry, const Status& status, const std::vector<int64_t>& extra);
  // Moves every request added since the last call into `*out` (emptied first), whose storage the
  // queue keeps for the next ones: regrowing the list from empty for every batch of submissions
  // (200 requests: nine reallocations, moving each request up to eight times) was ~4% of a
  // submitting thread's time. Background thread.
  void PopRequests(std::vector<Request>* out);
  // Removes and returns the queued entry for `key` (TensorKey of name and process set); false if
  // none. Its name stays taken until Complete.
  bool Take(const std::string& key, TensorEntry* out);
  // Fails (completes) every queued entry with `status` and refuses further Adds with it.
  void Close(const Status& status);
  // Any thread: later Adds fail with `status`; what is queued stays for Close (whose callbacks
  // must run on the background thread).
  void Refuse(const Status& status);
  // Blocks until new requests arrive, Wake() is called, or `deadline` passes.
  void WaitForRequests(std::chrono::steady_clock::time_point deadline);
  // Blocks until more than `seen` requests were ever added, Wake() is called, or `deadline`.
  void WaitForArrival(uint64_t seen, std::chrono::steady_clock::time_point deadline);
  // Blocks until Wake() is called after the `seen`-th wake (wakes() before the caller checked
  // its reasons to stop waiting: an older wake is stale), SendNow() is asked, or `deadline`
  // passes. Arrivals do not end it.
  void WaitForWake(uint64_t seen, std::chrono::steady_clock::time_point deadline);
  void Wake();
  uint64_t wakes() const;  // monotonic count of Wake() calls
  // Asks the loop to send what is queued without holding it back (Context::SendNow): ends a
  // WaitForWake, and stays asked until the next PopRequests takes the queued requests.
  void SendNow();
  bool send_now() const;
  bool HasNew() const;
  // Monotonic count of requests ever added (batching detects quiet gaps with it).
  uint64_t arrivals() const;
  size_t num_pending() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Slot {
    TensorEntry entry;  // until Take
    bool queued = true;
    int handle = -1;
  };
  HandleTable* handles_;
  // By TensorKey, from Add until Complete. One node per name for both uses (queued, taken):
  // a second map for taken names cost an allocation and a key copy per tensor per step.
  std::unordered_map<std::string, Slot> names_;
  size_t queued_ = 0;
  std::vector<Request> new_requests_;
  uint64_t arrivals_ = 0;
  bool woken_ = false;
  uint64_t wakes_ = 0;
  bool send_now_ = false;
  bool arrival_waiter_ = false;  // the loop waits in WaitForRequests/WaitForArrival
  bool closed_ = false;
  Status closed_status_;
};

}  // namespace hvdl
