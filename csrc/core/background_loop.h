// BackgroundLoop: the one thread per process that makes every communication call.
//
// Each iteration: wait (see below), drain new requests into the controller, run one negotiation
// cycle, execute the agreed responses. It stops after a cycle in which any rank asked to shut
// down, failing whatever is still pending with the reason, or when communication fails.
//
// Why the waiting looks the way it does. MPI has no way to block without spinning, and the loop
// shares a small machine with the training threads, so it never busy-waits for long:
//   - new local work wakes it at once (condition variable); it then lets a burst of submissions
//     finish (a short quiet gap, at most HOROVOD_CYCLE_TIME) so they fuse, instead of waiting for a
//     fixed tick;
//   - while this rank waits for others it polls, at a period that grows with the wait;
//   - a rank with nothing pending is woken by its own submissions and otherwise checks in rarely,
//     so an idle loop costs about 1% of one core (policy details in background_loop.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/config.h"
#include "core/controller.h"
#include "core/executor.h"
#include "core/handle_table.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"

namespace hvdl {

struct LoopDeps {
  TensorQueue* queue = nullptr;
  Controller* controller = nullptr;
  Executor* executor = nullptr;
  const Config* config = nullptr;
  Timeline* timeline = nullptr;  // CYCLE_START markers; may be nullptr
  const HandleTable* handles = nullptr;  // is a user thread blocked on us? may be nullptr
  // Fault tolerance (CommRuntime's, may be empty): after a cycle in which a communication call
  // reported failed ranks, the loop recovers (the survivors agree on who is left) and stops,
  // failing everything pending with a HorovodInternalError that names the lost ranks.
  std::function<bool()> peer_failed;
  std::function<Status(std::string*)> recover;
  // New work waits for a user thread to block (or kMaxHold) instead of one cycle time: for
  // hosts whose training threads fill every core (Context decides, HOROVOD_HOLD_UNTIL_WAIT).
  bool hold_until_wait = false;
};

// Called on the loop thread after each cycle's negotiation, before its responses run.
using CycleHook = std::function<void(const CycleResult& result)>;

class BackgroundLoop {
 public:
  explicit BackgroundLoop(const LoopDeps& deps);
  ~BackgroundLoop();

  void Start();
  // Any thread: asks every rank to stop after the next cycle; `reason` reaches them all.
  void RequestShutdown(const std::string& reason);
  // Any thread: stops this rank's loop at once, without asking the others (they may be gone);
  // whatever is pending fails with `status`. A loop blocked inside a communication call stops
  // only when that call returns.
  void Abort(const Status& status);
  // Blocks until the loop thread has exited.
  void Join();
  // Waits up to `timeout` for the loop thread to exit; joins it and returns true if it did.
  bool JoinFor(std::chrono::milliseconds timeout);
  bool running() const { return running_.load(); }
  // The loop revoked the job's communicators to recover from failed ranks (whether or not the
  // survivors then agreed).
  bool recovered() const { return recovered_.load(); }
  void set_cycle_hook(CycleHook hook) { hook_ = std::move(hook); }
  // The reason the loop stopped (empty while running).
  std::string stop_reason() const;
  void set_cycle_time_ms(double ms);
  double cycle_time_ms() const;

 private:
  void Run();
  using Clock = std::chrono::steady_clock;
  // A user thread waits for a result (or no handle table is wired: always treat as urgent).
  bool Urgent() const { return d_.handles == nullptr || d_.handles->user_blocked(); }
  // Urgent, or a user thread waited on the last cycle's work moments ago (hurry_until_).
  bool Hurry() const;
  void WaitBeforeCycle(bool progressed, bool others_pending);
  Status RunCycle(CycleResult* result, bool others_pending);
  std::chrono::microseconds PollCap(bool waiting, bool others_pending,
                                    Clock::time_point waiting_since) const;
  void Stop(const Status& status);
  Status Recover(const Status& failure);

  // Until then the loop acts as if a user thread waited: one did on the last cycle's work.
  std::chrono::steady_clock::time_point hurry_until_{};
  LoopDeps d_;
  std::vector<Request> popped_;  // the requests of this cycle (see TensorQueue::PopRequests)
  CycleHook hook_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;  // guards shutdown_reason_, stop_reason_ and abort_status_
  std::condition_variable stopped_cv_;
  Status abort_status_;
  std::string shutdown_reason_;
  std::string stop_reason_;
  std::atomic<bool> recovered_{false};
  std::atomic<int64_t> cycle_time_us_;
  std::chrono::microseconds backoff_;
  Clock::time_point waiting_since_ = Clock::now();  // since when this rank has had work pending
};

}  // namespace hvdl
