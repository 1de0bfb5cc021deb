// Controller: one negotiation cycle, identical on every rank.
//
// Protocol of a cycle (all ranks, in lock step):
//   1. StartCycle: classify this rank's new requests against the response cache and post one
//      bitwise-OR allreduce of [flags | invalid bits | not-ready bits]. Non-blocking.
//   2. TestCycle until done (the background loop decides how often to test).
//   3. FinishCycle:
//      a. erase cache entries any rank invalidated;
//      b. cached names whose not-ready bit is clear everywhere are ready: their responses come
//         from the cache, in slot order (no gather, no broadcast);
//      c. if any rank flagged uncached requests, gather every rank's request list to rank 0, which
//         merges them by name (MessageTable), validates complete names and broadcasts the ordered
//         response list;
//      d. update the cache in list order, so slots stay identical on every rank.
//   The agreed list is (b) then (c); every rank executes it in that order.
// While any rank has joined (hvd.join) the cache fast path is suspended: joined ranks hold no
// requests to set bits for, so every name goes through the coordinator, which knows who joined.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/control_plane.h"
#include "core/message.h"
#include "core/message_table.h"
#include "core/process_set.h"
#include "core/response_cache.h"
#include "core/stall_inspector.h"
#include "core/timeline.h"

namespace hvdl {

enum CycleFlag : uint64_t {
  kFlagUncached = 1u << 0,  // some rank needs full negotiation this cycle
  kFlagShutdown = 1u << 1,  // some rank asks the job to stop
  kFlagPending = 1u << 2,   // some rank waits for a response: everyone keeps polling quickly
  kFlagJoined = 1u << 3,    // some rank has joined: cache fast path suspended
  kFlagStall = 1u << 4,     // some rank waited too long: everyone reports what it waits for
};

struct CycleResult {
  std::vector<Response> responses;  // agreed order
  bool shutdown = false;
  std::string shutdown_reason;
  bool anyone_pending = false;
  bool negotiated = false;  // the slow path ran
  int cache_hits = 0;       // responses served from the cache this cycle
  bool this_rank_joined = false;  // this rank had joined when the cycle's responses were agreed
  TunedParams params;             // new parameters every rank applies now (autotune)
};

struct ControllerStats {
  uint64_t cycles = 0;
  uint64_t negotiations = 0;  // cycles that ran the gather/broadcast slow path
  uint64_t cache_hits = 0;    // responses agreed through the bit vector
  uint64_t invalidations = 0;
  uint64_t responses = 0;
  double wait_seconds = 0;  // this rank's submit-to-agreement time, summed over its requests
};

// Coordinator-side hook run after merging requests each slow-path cycle (stall inspection).
using CoordinatorHook = std::function<void(MessageTable& table, ResponseList* list)>;

class Controller {
 public:
  // `stall_seconds` <= 0 disables stall checks; `stall_shutdown_seconds` <= 0 only warns.
  Controller(ControlPlane* cp, ProcessSetTable* sets, size_t cache_capacity,
             double stall_seconds = 0, double stall_shutdown_seconds = 0);

  // Adds this rank's new requests (background thread), moving each out of `requests` (the list
  // keeps its storage for the queue's next ones). Their rank field is filled in here.
  void Submit(std::vector<Request>& requests);
  // Asks every rank to stop at the end of the next cycle; `reason` reaches every rank.
  void RequestShutdown(const std::string& reason);
  void set_coordinator_hook(CoordinatorHook hook) { hook_ = std::move(hook); }
  // Rank 0: hand `params` to every rank at the next cycle (forces one slow-path cycle).
  void PublishParams(const TunedParams& params);
  // Rank 0 records negotiation into `timeline` (may be nullptr).
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

  Status StartCycle();
  Status TestCycle(bool* done);
  Status FinishCycle(CycleResult* out);

  // Requests of this rank still waiting for a response.
  size_t num_pending() const;
  // Names of this rank's pending requests (stall reports, shutdown errors).
  std::vector<std::string> PendingNames() const;
  const ControllerStats& stats() const { return stats_; }
  const ResponseCache& cache() const { return cache_; }
  // Forgets cache entries of a removed process set (called in agreed order on every rank).
  void ForgetProcessSet(int id);

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  // A request announced through a cache bit, and when it was submitted. Keeping the time here
  // rather than in since_ spares each cached tensor two string-keyed map updates and a clock
  // read per step (~0.1 us each on the background thread).
  struct CachedPending {
    Request request;
    TimePoint since;
  };
  void Classify(Request request, TimePoint now);
  void BuildBits();
  void ApplyInvalidations(size_t words);
  void CollectCachedReady(size_t words, CycleResult* out);
  Status Negotiate(CycleResult* out, uint64_t flags);
  ResponseList Coordinate(const std::vector<std::string>& gathered);
  void UpdateCache(const std::vector<Response>& negotiated);
  void Requeue(uint32_t slot);
  bool StallCheckDue();
  RankMessage ReportPending(std::vector<Request> requests) const;
  void Forget(const Response& response, bool cached);
  void TraceStart(const Request& q);

  ControlPlane* cp_;
  ProcessSetTable* sets_;
  ResponseCache cache_;
  MessageTable table_;  // used on rank 0 only
  CoordinatorHook hook_;
  Timeline* timeline_ = nullptr;

  std::vector<Request> unsent_;                   // waiting for the next slow path
  std::map<uint32_t, CachedPending> cached_pending_;  // by cache slot
  std::unordered_map<std::string, Request> sent_;  // by TensorKey: sent, awaiting response
  std::set<uint32_t> invalid_;                     // slots this rank invalidates this cycle
  TunedParams publish_;  // rank 0: parameters to send with the next response list
  bool shutdown_requested_ = false;
  std::string shutdown_reason_;
  bool joined_ = false;        // this rank has a join pending
  bool cache_suspended_ = false;
  // Stall inspection: when each pending request was submitted (cached ones: in
  // cached_pending_), and this rank's last submission.
  std::unordered_map<std::string, TimePoint> since_;  // by TensorKey
  PendingInfo last_;
  TimePoint last_time_;
  TimePoint last_check_;
  double stall_seconds_;
  StallInspector inspector_;
  std::vector<uint64_t> words_;
  size_t slots_in_cycle_ = 0;  // cache slots covered by the posted bit vector
  ControllerStats stats_;
};

}  // namespace hvdl
