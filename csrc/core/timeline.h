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
// record (a timestamp and the tensor's name, a few dozen bytes) to a local byte log, which goes
// to a bounded queue once per cycle. Everything per tensor that touches scattered memory (the
// track of each name, the negotiation state, the batch's members) happens on a writer thread that
// replays the log, then formats and writes the events every 50 ms, at SCHED_IDLE priority so it
// only uses CPU the training threads leave idle. (Looking up a track per tensor on the
// background thread cost about 0.3 us per lookup, cache misses mostly: 1.7% of a fusion step.)
//
// The file is valid JSON at every moment, also when the job is SIGKILLed in the middle of a
// write (Linux stops a write between page-cache folios, so a killed write leaves a prefix that
// ends on a page boundary). The layout makes every such prefix valid:
//   "[" events, padding spaces ... "]"
// The closing bracket sits at the end of a preallocated region of spaces, and events are
// written into the spaces without ever crossing a page boundary (an event that would is moved
// to the next page; the gap stays spaces). So every page of a partial write holds whole events
// and whitespace, and the bracket is already in place behind them. When the region is full, a
// copy with a region four times the size replaces the file with rename() (atomic); Stop() trims
// the padding the same way. Files of a killed job may end in up to 3/4 of their size of spaces.
//
// The writer only ever writes whole pages, from a page-aligned buffer, so the file is opened
// O_DIRECT where the filesystem allows it (else buffered, same code). Measured on a VM, most of
// the timeline's cost was not CPU but page-cache churn: every new page of the file is a fresh
// page of memory, and the pages of each replaced copy are freed again (on a VM that returns
// freed memory to its host, each such page costs a host fault). Direct I/O bypasses the page
// cache; Linux completes a direct write's submitted blocks even when the writer is killed, so
// the page-boundary argument above holds for it too (block size <= page size).
#pragma once

#include <atomic>
#include <cstdlib>
#include <condition_variable>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/types.h"

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
  // The records of the log, each its kind byte and then fixed-size fields (memcpy'd, unaligned)
  // and, where it names a tensor, the process set, the name's length and its bytes:
  enum class Rec : uint8_t {
    kProcessName,     // (nothing): the process_name metadata; Start() queues it first
    kNegotiateStart,  // ts, op, dtype, ndims, dims..., tensor
    kRankReady,       // ts, rank, tensor
    kNegotiateEnd,    // ts, op, cached, tensor
    kBatch,           // (nothing): a batch starts; its tensors follow as kMember records
    kMember,          // tensor
    kActivity,        // ts, const char* (a static string)
    kDone,            // ts
    kCycle,           // ts
  };
  // Writer thread: one tensor's track and where its collective is.
  struct Track {
    int32_t tid = 0;
    int depth = 0;  // 0 idle, 1 negotiating, 2 executing
    OpType op = OpType::kAllreduce;
    int64_t negotiate_start = 0, exec_start = 0;
    DataType dtype = DataType::kFloat32;
    Shape shape;
    bool known = false;     // dtype and shape were recorded (they go out again on a change)
    bool describe = false;  // the next NEGOTIATE span carries dtype and shape
  };
  class LogReader;
  // Background thread: forgets what an earlier Start() staged.
  void Sync();
  // Background thread, at every recorder entry: false when not recording; else Sync()s.
  bool Active();
  // Background thread: appends a record to staged_: its kind, `fields` (memcpy'd in order) and
  // room for `extra` more bytes, where the returned pointer points.
  template <typename... Fields>
  char* Append(Rec kind, size_t extra, const Fields&... fields);
  // Waits (mu_ held by `lock`) while the queue is full; false once the timeline stops.
  bool WaitForRoom(std::unique_lock<std::mutex>& lock);
  // Background thread: hands staged_ to the writer.
  void Publish();
  void WriterLoop();
  // Writer thread: replays the records of `chunks`, formats and writes the events they make.
  void WriteLog(const std::vector<std::string>& chunks);
  // Writer thread: replays one record; false after an I/O error.
  bool Replay(LogReader& r);
  bool ReplayNegotiateStart(LogReader& r);
  bool ReplayNegotiateEnd(LogReader& r);
  // Writer thread: the track of a tensor (its TensorKey is left in key_), or nullptr.
  Track* Find(std::string_view name, int32_t process_set);
  // Writer thread: formats one event and places it; false after an I/O error.
  // EmitInstant: "rank <rank> ready" on the track, or with rank < 0 a global CYCLE_START.
  bool EmitSpan(int32_t tid, int64_t start, int64_t end, const char* name,
                const std::string* args);
  bool EmitInstant(int32_t tid, int64_t ts, int rank);
  bool EmitMeta(int32_t tid, const char* name, std::string_view value);
  // Appends `event` to text_ without letting it cross a page boundary; grows the file first
  // when the region is full.
  bool Place(std::string_view event);
  // Writer thread, at kActivity and kDone: the batch's phase that ends at `now`, per member.
  bool EndPhase(int64_t now);
  // Writer thread. The file is written in whole pages from the page-aligned buffer io_ (so it
  // can be opened O_DIRECT). PutPages writes [at, upto) (page-aligned) as `data`, then spaces,
  // with the closing bracket at `bracket` if that falls inside; CopyPages copies [0, n).
  off_t PageStart(off_t at) const;
  off_t PageEnd(off_t at) const;  // the first page boundary at or after `at`
  bool PutPages(int fd, off_t at, off_t upto, off_t bracket, const std::string& data);
  bool CopyPages(int from, int to, off_t n);
  // Writer thread. `text` is the content of [PageStart(pos_), at): write it, advancing pos_ to
  // `at`; false (and the timeline disabled) on an I/O error.
  bool Flush(const std::string& text, off_t at);
  // Writer thread. Replace the file, via rename(), by a copy of its events [0, pos_) and `tail`
  // followed by spaces up to `new_end` and the closing bracket there (Stop trims the padding
  // with new_end = pos_ + 1 and tail "\n").
  bool Rewrite(off_t new_end, const char* tail = "");
  void Fail(const char* what);

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
  std::string path_;
  int fd_ = -1;
  off_t pos_ = 0;  // end of the last event written: [0, pos_) is final content
  off_t end_ = 0;  // offset of the closing ']' (the file is end_ + 1 bytes)
  std::string head_;  // the content of the page holding pos_: [PageStart(pos_), pos_)
  // The writer's buffers (members: their memory is reused).
  std::string text_, event_, event_args_, key_;
  off_t at_ = 0;                    // where text_'s next byte lands
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, FreeDeleter> io_;
  size_t page_ = 4096;
  bool wrote_any_ = false;
  int64_t origin_us_ = 0;
  std::unordered_map<std::string, Track> tracks_;
  std::vector<Track*> batch_;      // the members of the batch being executed
  const char* phase_ = nullptr;    // its current phase; nullptr: QUEUE
  int64_t phase_start_ = 0;
};

}  // namespace hvdl
