#include "core/timeline.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

namespace hvdl {
namespace {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Bytes of records waiting for the writer; a recorder that finds the queue this full waits.
constexpr size_t kMaxQueuedBytes = size_t{64} << 20;
// Emptied chunks of records kept for reuse (Publish hands over one per cycle and per batch: some
// tens arrive between two rounds of the writer).
constexpr size_t kSpareChunks = 64;

}  // namespace

Timeline::~Timeline() { Stop(); }

Status Timeline::Start(const std::string& path, bool mark_cycles) {
  Stop();
  // The writer's state; no writer runs now (Stop joined it).
  HVDL_RETURN_IF_ERROR(file_.Open(path));
  replay_.Reset(NowUs());
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    queue_.clear();
    queue_.emplace_back(1, static_cast<char>(TimelineRec::kProcessName));
    queued_bytes_ = 1;
    // Under mu_: records an earlier timeline's recorder still publishes are dropped (Publish).
    generation_.fetch_add(1, std::memory_order_release);
  }
  mark_cycles_ = mark_cycles;
  writer_ = std::thread([this] { WriterLoop(); });
  enabled_ = true;
  return Status::Ok();
}

void Timeline::Stop() {
  enabled_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  space_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  file_.Close();
}

bool Timeline::WaitForRoom(std::unique_lock<std::mutex>& lock) {
  // Back-pressure instead of unbounded memory when the idle-priority writer gets no CPU.
  space_cv_.wait(lock, [&] { return stop_ || queued_bytes_ < kMaxQueuedBytes; });
  return !stop_;
}

void Timeline::Publish() {
  if (staged_.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  if (WaitForRoom(lock) && generation_.load(std::memory_order_relaxed) == seen_generation_) {
    queued_bytes_ += staged_.size();
    queue_.push_back(std::move(staged_));
    staged_ = std::string();
    if (!spare_.empty()) {  // emptied by the writer
      staged_.swap(spare_.back());
      spare_.pop_back();
    }
  } else {
    staged_.clear();  // the timeline stopped, or restarted since these were recorded
  }
}

bool Timeline::Active() {
  if (!enabled()) return false;
  Sync();
  return true;
}

void Timeline::Sync() {
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (gen == seen_generation_) return;
  seen_generation_ = gen;
  staged_.clear();
}

template <typename... Fields>
char* Timeline::Append(TimelineRec kind, size_t extra, const Fields&... fields) {
  const size_t at = staged_.size();
  staged_.resize(at + 1 + (sizeof(Fields) + ... + 0) + extra);
  char* p = &staged_[at];
  *p++ = static_cast<char>(kind);
  ((p = timeline_log::Put(p, fields)), ...);
  return p;
}

void Timeline::NegotiateStart(const std::string& name, int32_t process_set, OpType op,
                              DataType dtype, const Shape& shape) {
  if (!Active()) return;
  const auto ndims = static_cast<uint32_t>(shape.size());
  const size_t dim_bytes = ndims * sizeof(int64_t);
  char* p = Append(TimelineRec::kNegotiateStart, dim_bytes + timeline_log::TensorBytes(name), NowUs(),
                   static_cast<int32_t>(op), static_cast<int32_t>(dtype), ndims);
  if (dim_bytes > 0) std::memcpy(p, shape.data(), dim_bytes);
  timeline_log::PutTensor(p + dim_bytes, name, process_set);
}

void Timeline::RankReady(const std::string& name, int32_t process_set, int rank) {
  if (!Active()) return;
  timeline_log::PutTensor(Append(TimelineRec::kRankReady, timeline_log::TensorBytes(name), NowUs(), static_cast<int32_t>(rank)), name,
            process_set);
}

void Timeline::NegotiateEnd(const std::string& name, int32_t process_set, OpType op,
                            bool cached) {
  if (!Active()) return;
  timeline_log::PutTensor(Append(TimelineRec::kNegotiateEnd, timeline_log::TensorBytes(name), NowUs(), static_cast<int32_t>(op),
                   static_cast<int32_t>(cached)),
            name, process_set);
}

void Timeline::BeginBatch() {
  if (Active()) Append(TimelineRec::kBatch, 0);
}

void Timeline::BatchMember(const std::string& name, int32_t process_set) {
  if (Active()) timeline_log::PutTensor(Append(TimelineRec::kMember, timeline_log::TensorBytes(name)), name, process_set);
}

void Timeline::Activity(const char* activity) {
  if (Active()) Append(TimelineRec::kActivity, 0, NowUs(), activity);
}

void Timeline::Done() {
  if (Active()) Append(TimelineRec::kDone, 0, NowUs());
  // Published now, not at the next cycle: the executor marks the handles done right after, and
  // a stop_timeline() that follows the caller's synchronize() must find these records queued.
  Publish();
}

void Timeline::CycleStart() {
  if (!Active()) return;
  if (mark_cycles()) Append(TimelineRec::kCycle, 0, NowUs());
  Publish();
}

void Timeline::WriteLog(const std::vector<std::string>& chunks) {
  if (chunks.empty() || !file_.is_open()) return;
  file_.BeginRound();
  bool ok = true;  // false after an I/O error
  for (const std::string& chunk : chunks) {
    timeline_log::Reader r(chunk);
    while (ok && r.more()) ok = replay_.Replay(r);
  }
  file_.EndRound();
  if (!file_.is_open()) enabled_ = false;  // the file said why; recording stops
}

void Timeline::WriterLoop() {
#if defined(__linux__)
  sched_param idle{};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);  // formatting never competes
  pthread_setname_np(pthread_self(), "hvdl-timeline");
#endif
  std::vector<std::string> chunks;
  while (true) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // The emptied chunks of the last round go back for reuse (a few: the rest is freed).
      for (std::string& c : chunks) {
        if (spare_.size() >= kSpareChunks) break;
        c.clear();
        spare_.push_back(std::move(c));
      }
      chunks.clear();
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_; });
      chunks.swap(queue_);
      queued_bytes_ = 0;
      stopping = stop_;
    }
    space_cv_.notify_all();
    // Replay, formatting and I/O happen outside the lock the recorder takes.
    WriteLog(chunks);
    if (stopping) break;
  }
  file_.Finish();  // drops the padding
}

}  // namespace hvdl
