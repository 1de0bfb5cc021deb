// HandleTable: the int handles Python sees for asynchronous operations (positive: 0 and -1 mean
// "none" to the adapter and the queue; an id is reused only after 2^31 - 1 others, and never
// while it is still held).
//
// A handle covers one or more entries (a grouped op). The background thread reports each entry's
// completion with MarkDone; user threads Poll (non-blocking) or Wait (blocking; the binding
// releases the GIL around it). Wait consumes the handle: a second Wait or Poll on it, or on a
// handle never issued, returns kInvalidArgument. The payload is the adapter's per-handle state
// (its tensors), handed back by Wait so the adapter can return outputs. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/status.h"

namespace hvdl {

// While one is alive on a thread, the handles that thread completes (MarkDone) wake their
// waiters once, when the outermost batch ends, instead of once per entry. The executor completes
// a fused batch under one: a user thread synchronizing 16 fused gradients one after the other
// otherwise woke up to 16 times, each wake-up preempting the background thread (two context
// switches, ~15-20 us each on a small VM) - measured 15 voluntary waits per training step.
class CompletionBatch {
 public:
  CompletionBatch();
  ~CompletionBatch();
  CompletionBatch(const CompletionBatch&) = delete;
  CompletionBatch& operator=(const CompletionBatch&) = delete;
};

class HandleTable {
 public:
  // `what` names the operation for FailPending's messages, e.g. "allreduce 'grad.w'".
  int Allocate(int num_entries, std::shared_ptr<void> payload, std::string what = "");
  // Records the completion of one entry of `handle`; the first error wins.
  void MarkDone(int handle, const Status& status);
  Status Poll(int handle, bool* done);
  // Blocks until every entry of `handle` completed; returns the op's status in `op_status` and the
  // adapter payload, and forgets the handle. It spins (yielding) for up to the spin window first,
  // and only then sleeps: a completion seen while spinning costs no wake-up (a futex wake and
  // the scheduler's latency, 10-20 us on a small VM, the larger part of a small op's time).
  Status Wait(int handle, Status* op_status, std::shared_ptr<void>* payload);
  // How long Wait spins before it sleeps (0: never spins).
  void SetSpinWindow(std::chrono::microseconds window);
  // Completes every unfinished handle with `status`, prefixed by "<what> did not complete: "
  // (the job lost ranks: what they were waiting for will not come). Entries that complete
  // later change nothing.
  void FailPending(const Status& status);
  // Forgets a handle without waiting (the payload stays alive until its entries complete).
  void Release(int handle);
  size_t size() const;
  // True while some thread is blocked in Wait on an unfinished handle: the user is idle until we
  // deliver, so the background loop stops batching and polls quickly (see background_loop.cc).
  bool user_blocked() const { return blocked_.load(std::memory_order_relaxed) > 0; }
  // Runs (under the table's lock) when a thread starts blocking in Wait, or polls an unfinished
  // handle; nullptr clears it.
  void SetBlockHook(std::function<void()> hook);
  // Tests only: the id the next Allocate starts looking from (to reach the wrap quickly).
  void SetNextIdForTesting(int next);

 private:
  friend class CompletionBatch;
  void Notify() { cv_.notify_all(); }
  struct State {
    int remaining = 0;
    int waiters = 0;   // threads blocked in Wait on this handle (spinning or asleep)
    int sleepers = 0;  // of those, the ones asleep on cv_: only they need a notify
    std::atomic<bool> done{false};  // remaining reached 0 (read by spinning waiters)
    Status status;
    std::string what;
    std::shared_ptr<void> payload;
  };
  Status Unknown(int handle) const;
  int NextId();  // under mu_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<int, std::shared_ptr<State>> states_;
  // Ids are 1..INT_MAX: after INT_MAX they wrap to 1, never to 0 (the adapter's "no handle")
  // or below, and skip the ids still held (a handle never waited for).
  int next_ = 1;
  std::atomic<int> blocked_{0};
  std::atomic<int64_t> spin_us_{0};
  std::function<void()> block_hook_;
};

}  // namespace hvdl
