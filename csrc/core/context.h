// Context: the one owned runtime object. It takes the configuration and the communication
// runtime (control plane + data backends, built by csrc/runtime for the launch) and builds, in
// order, the process-set table, the tensor queue,
// the controller, the fusion buffer, the executor and the background loop, and destroys them in
// reverse. shutdown() destroys the Context; init() builds a new one in the same process.
//
// The HandleTable is the one collaborator a Context does not own: handles issued before a
// shutdown must still report "shut down before completion" when synchronized afterwards, so the
// binding layer keeps the table for the life of the process and lends it to each Context.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/comm_runtime.h"
#include "core/autotuner.h"
#include "common/config.h"
#include "core/background_loop.h"
#include "core/controller.h"
#include "core/executor.h"
#include "core/fusion.h"
#include "core/handle_table.h"
#include "core/launcher_notices.h"
#include "core/process_set.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"

namespace hvdl {

struct InitOptions {
  std::vector<std::vector<int>> process_sets;  // static sets; they get ids 1, 2, ... in order
  int dynamic_process_sets = -1;               // -1: HOROVOD_DYNAMIC_PROCESS_SETS decides
  HandleTable* handles = nullptr;              // required
};

// Per-rank performance counters since the last TakeSummary (hvd.summary()).
struct SummaryStats {
  uint64_t collectives = 0;       // collective calls (a fused batch counts once)
  uint64_t tensors = 0;           // tensors they carried
  int64_t bytes = 0;              // payload bytes
  double bus_bytes = 0;           // bytes x the collective's bus factor (2(n-1)/n for allreduce)
  double collective_seconds = 0;  // time inside collectives (packing included)
  double wait_seconds = 0;        // time this rank's requests waited for the other ranks
  uint64_t fused_batches = 0;     // collectives that carried more than one tensor
  int64_t fused_bytes = 0;
  int64_t fusion_threshold = 0;
};

struct RuntimeStats {
  ControllerStats controller;
  size_t cache_entries = 0;
  size_t fusion_buffer_bytes = 0;
  int single_copy_transports = 0;  // ring transports reading peer memory directly
  int single_copy_peers = 0;       // summed over them: members read from directly
  int64_t hierarchical_allreduces = 0;  // allreduces reduced inside hosts, then across them
  int64_t hierarchical_allgathers = 0;  // allgathers across hosts, then inside them
  int64_t hierarchical_reducescatters = 0;  // reduce-scatters inside hosts, then across them
  // The parameters in force on this rank (changed by autotune, identical on every rank).
  TunedParams params;
  bool autotune_converged = false;
};

class Context {
 public:
  // Main thread; collective over the job. `comm` is the communication runtime the composition
  // root (csrc/runtime) built for this launch; the Context owns it from here on.
  static Status Create(const Config& config, CommRuntime comm, const InitOptions& options,
                       std::unique_ptr<Context>* out);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Asks every rank to stop and waits for this rank's loop to exit. Pending ops fail with
  // `reason`. Main thread (the binding releases the GIL around it). An aborted context (see
  // Abort) is waited for 2 s at most, and must then be kept alive, never destroyed.
  void Shutdown(const std::string& reason);
  // Any thread: the job lost ranks (`why` says which). Fails every pending and later operation
  // of this rank with HorovodInternalError(why) and stops the loop without the other ranks.
  void Abort(const std::string& why);
  bool aborted() const { return aborted_.load(); }
  // An aborted context of a transport that can start a new world without the lost ranks.
  bool restartable_after_loss() const { return comm_.restartable_after_loss; }
  // The loop stopped to recover from failed ranks (elastic): like an aborted context, it may
  // have left requests posted on its buffers, and its communicators are revoked (freeing them
  // may wait for the lost ranks), so it must be kept alive, never destroyed.
  bool recovered() const { return loop_->recovered(); }

  // Submits entries as one handle (a grouped op submits several). Any thread.
  Status Submit(std::vector<TensorEntry> entries, std::vector<Request> requests,
                std::shared_ptr<void> payload, int* handle);
  // Any thread: what is queued goes out now instead of being held back to fuse with later
  // submissions (HOROVOD_CYCLE_TIME, HOROVOD_HOLD_UNTIL_WAIT). For work that is already fused:
  // a ready gradient bucket, whose reduction can then overlap the rest of backward.
  void SendNow() { queue_->SendNow(); }

  const Topology& topology() const { return comm_.topology; }
  const Config& config() const { return config_; }
  ProcessSetTable& process_sets() { return *sets_; }
  bool dynamic_process_sets() const { return dynamic_sets_; }
  // Empty while the loop runs; otherwise why it stopped.
  std::string stop_reason() const;
  RuntimeStats stats() const;
  SummaryStats TakeSummary();
  // Rank 0 writes the timeline; elsewhere these are no-ops.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();

 private:
  Context(const Config& config, CommRuntime comm, const InitOptions& options);
  Status Init(const InitOptions& options);
  void OnCycle(const CycleResult& result);
  void Apply(const TunedParams& params);
  void Autotune(const CycleResult& result);
  class Observer;

  Config config_;
  CommRuntime comm_;
  HandleTable* handles_;
  bool dynamic_sets_ = false;
  std::unique_ptr<ProcessSetTable> sets_;
  std::unique_ptr<Timeline> timeline_;
  std::unique_ptr<Observer> observer_;
  std::unique_ptr<TensorQueue> queue_;
  std::unique_ptr<FusionBuffer> fusion_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<BackgroundLoop> loop_;
  std::unique_ptr<Autotuner> tuner_;  // rank 0 with HOROVOD_AUTOTUNE=1
  std::unique_ptr<LauncherNotices> notices_;  // declared last: stopped first
  std::atomic<bool> aborted_{false};
  mutable std::mutex stats_mu_;  // guards stats_, summary_, summary_wait_base_
  RuntimeStats stats_;
  SummaryStats summary_;
  double summary_wait_base_ = 0;
};

}  // namespace hvdl
