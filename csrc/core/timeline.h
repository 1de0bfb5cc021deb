// Timeline: a Chrome trace (chrome://tracing, Perfetto) of what every tensor went through.
//
// One track (tid) per tensor name. For each collective:
//   NEGOTIATE_<OP>  from the first time the coordinator hears of the name until every rank
//                   agreed; instant events inside say which rank reported when; args carry
//                   dtype and shape (on a track's first negotiation and when they change), and
//                   "via": "response cache" when the cache agreed;
//   <OP>            the execution span, containing QUEUE, MEMCPY_IN_FUSION_BUFFER, the
//                   collective (MPI_ALLREDUCE, RING_ALLREDUCE, ...) and MEMCPY_OUT_FUSION_BUFFER.
// With mark_cycles, CYCLE_START instant events mark each background-loop cycle.
//
// Only rank 0 (the coordinator) records. Recording is kept cheap because it runs on the
// background thread, between the ranks' collectives: a recorder call only appends a compact
// record (a timestamp and the tensor's name, a few dozen bytes; core/timeline_log.h) to a local
// byte log, which goes to a bounded queue once per cycle. A writer thread at SCHED_IDLE priority
// (so it only uses CPU the training threads leave idle) takes the queue every 50 ms, replays it
// into events (core/timeline_replay.h) and writes them to a file that is valid JSON at every
// moment, also when the job is killed mid-write (core/timeline_file.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "core/timeline_file.h"
#include "core/timeline_log.h"
#include "core/timeline_replay.h"

namespace hvdl {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Any thread. Starts writing to `path` (truncating it); an open timeline is stopped first.
  Status Start(const std::string& path, bool mark_cycles);
  // Any thread. Flushes and closes the file.
  void Stop();
  // Acquire: a recorder that sees the timeline enabled also sees Start()'s new generation.
  bool enabled() const { return enabled_.load(std::memory_order_acquire); }
  bool mark_cycles() const { return mark_cycles_.load(std::memory_order_relaxed); }

  // Background thread. A tensor is named by `name` and its process set, as in TensorKey.
  void NegotiateStart(const std::string& name, int32_t process_set, OpType op, DataType dtype,
                      const Shape& shape);
  void RankReady(const std::string& name, int32_t process_set, int rank);
  // Also starts <OP> with QUEUE; `cached`: the response cache agreed (args say so).
  void NegotiateEnd(const std::string& name, int32_t process_set, OpType op, bool cached);
  // Background thread. Execution is recorded per fused batch, not per tensor (the writer
  // expands it into one span per tensor): BeginBatch and a BatchMember call per tensor name the
  // batch's tensors, Activity ends its previous phase (QUEUE at first) and starts `activity` (a
  // static string), Done ends the last phase and the tensors' <OP> spans.
  void BeginBatch();
  void BatchMember(const std::string& name, int32_t process_set);
  void Activity(const char* activity);
  void Done();
  // Background thread, every cycle: a CYCLE_START marker (with mark_cycles), and the records
  // since the last cycle go to the writer.
  void CycleStart();

 private:
  // Background thread: forgets what an earlier Start() staged.
  void Sync();
  // Background thread, at every recorder entry: false when not recording; else Sync()s.
  bool Active();
  // Background thread: appends a record to staged_: its kind, `fields` (memcpy'd in order) and
  // room for `extra` more bytes, where the returned pointer points.
  template <typename... Fields>
  char* Append(TimelineRec kind, size_t extra, const Fields&... fields);
  // Waits (mu_ held by `lock`) while the queue is full; false once the timeline stops.
  bool WaitForRoom(std::unique_lock<std::mutex>& lock);
  // Background thread: hands staged_ to the writer.
  void Publish();
  void WriterLoop();
  // Writer thread: replays the records of `chunks` into the file.
  void WriteLog(const std::vector<std::string>& chunks);

  std::atomic<bool> enabled_{false};
  std::atomic<bool> mark_cycles_{false};
  std::mutex mu_;  // guards queue_ and stop_; the writer thread owns the file while it runs
  std::condition_variable cv_;        // wakes the writer
  std::condition_variable space_cv_;  // wakes a recorder waiting for room in the queue
  // Records waiting for the writer, in the chunks Publish() handed over, and chunks the writer
  // has emptied, kept for reuse: memory that stays mapped and warm (fresh memory for every
  // publish, faulted in page by page, cost the background thread 10-30 us per batch).
  std::vector<std::string> queue_, spare_;
  size_t queued_bytes_ = 0;
  bool stop_ = false;
  std::thread writer_;
  std::atomic<uint64_t> generation_{0};  // counts Start()s
  // Background thread only.
  uint64_t seen_generation_ = 0;
  std::string staged_;  // records since the last Publish
  // Writer thread only (Start() resets them before it starts the writer).
  TimelineFile file_;
  TimelineReplay replay_{file_};
};

}  // namespace hvdl
