#include "core/timeline.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

namespace hvdl {
namespace {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out;
}

// Static span names per op, so recording never builds strings.
const char* ExecName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "ALLREDUCE";
    case OpType::kAllgather: return "ALLGATHER";
    case OpType::kBroadcast: return "BROADCAST";
    case OpType::kAlltoall: return "ALLTOALL";
    case OpType::kReducescatter: return "REDUCESCATTER";
    case OpType::kBarrier: return "BARRIER";
    case OpType::kJoin: return "JOIN";
    default: return "CONTROL";
  }
}

const char* NegotiateName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "NEGOTIATE_ALLREDUCE";
    case OpType::kAllgather: return "NEGOTIATE_ALLGATHER";
    case OpType::kBroadcast: return "NEGOTIATE_BROADCAST";
    case OpType::kAlltoall: return "NEGOTIATE_ALLTOALL";
    case OpType::kReducescatter: return "NEGOTIATE_REDUCESCATTER";
    case OpType::kBarrier: return "NEGOTIATE_BARRIER";
    case OpType::kJoin: return "NEGOTIATE_JOIN";
    default: return "NEGOTIATE_CONTROL";
  }
}

}  // namespace

Timeline::~Timeline() { Stop(); }

Status Timeline::Start(const std::string& path, bool mark_cycles) {
  Stop();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, "[\n]", 3) != 3) {
    if (fd >= 0) ::close(fd);
    return Status::InvalidArgument("cannot write timeline file '" + path +
                                   "': " + std::strerror(errno));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd_ = fd;
    end_ = 2;
    wrote_any_ = false;
    stop_ = false;
    queue_.clear();
    origin_us_ = NowUs();
  }
  tracks_.clear();
  mark_cycles_ = mark_cycles;
  writer_ = std::thread([this] { WriterLoop(); });
  enabled_ = true;
  Push(Event{Kind::kMeta, 0, 0, 0, "process_name",
             std::make_shared<std::string>("horovodlite (rank 0)")});
  return Status::Ok();
}

void Timeline::Stop() {
  enabled_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Timeline::Push(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  queue_.push_back(std::move(e));
}

void Timeline::PushAll(std::vector<Event>* events) {
  if (events->empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  for (Event& e : *events) queue_.push_back(std::move(e));
}

Timeline::Track* Timeline::Find(const std::string& key) {
  auto it = tracks_.find(key);
  return it == tracks_.end() ? nullptr : &it->second;
}

Timeline::Track& Timeline::TrackFor(const std::string& key, const std::string& label) {
  if (Track* t = Find(key)) return *t;
  Track t;
  t.tid = static_cast<int32_t>(tracks_.size()) + 1;
  Push(Event{Kind::kMeta, 0, t.tid, 0, "thread_name", std::make_shared<std::string>(label)});
  return tracks_.emplace(key, std::move(t)).first->second;
}

void Timeline::NegotiateStart(const std::string& key, const std::string& label, OpType op,
                              DataType dtype, const Shape& shape) {
  if (!enabled()) return;
  Track& t = TrackFor(key, label);
  if (t.depth > 0) return;  // already negotiating or executing
  t.depth = 1;
  t.op = op;
  t.via_cache = false;
  t.negotiate_start = NowUs();
  if (!t.args || t.dtype != dtype || t.shape != shape) {
    t.dtype = dtype;
    t.shape = shape;
    std::string body = "\"dtype\": \"" + std::string(DataTypeName(dtype)) + "\", \"shape\": \"" +
                       ShapeString(shape) + "\"";
    t.args = std::make_shared<std::string>("{" + body + "}");
    t.cached_args = std::make_shared<std::string>("{" + body + ", \"via\": \"response cache\"}");
  }
}

void Timeline::RankReady(const std::string& key, int rank) {
  if (!enabled()) return;
  if (Track* t = Find(key)) Push(Event{Kind::kRankReady, NowUs(), t->tid, rank, nullptr, {}});
}

void Timeline::CacheHit(const std::string& key) {
  if (!enabled()) return;
  if (Track* t = Find(key)) t->via_cache = true;
}

void Timeline::NegotiateEnd(const std::string& key, OpType op) {
  if (!enabled()) return;
  Track* t = Find(key);
  if (t == nullptr || t->depth != 1) return;
  const int64_t now = NowUs();
  Push(Event{Kind::kSpan, t->negotiate_start, t->tid, now - t->negotiate_start,
             NegotiateName(op), t->via_cache ? t->cached_args : t->args});
  t->depth = 2;
  t->exec_start = now;
  t->activity = "QUEUE";
  t->activity_start = now;
}

void Timeline::EndActivity(Track& t, int64_t now, std::vector<Event>* out) {
  if (t.activity != nullptr) {
    out->push_back(Event{Kind::kSpan, t.activity_start, t.tid, now - t.activity_start,
                         t.activity, {}});
  }
  t.activity = nullptr;
}

void Timeline::Activity(const std::vector<std::string>& keys, const char* activity) {
  if (!enabled()) return;
  const int64_t now = NowUs();
  std::vector<Event> events;
  events.reserve(keys.size());
  for (const std::string& key : keys) {
    Track* t = Find(key);
    if (t == nullptr || t->depth != 2) continue;
    EndActivity(*t, now, &events);
    t->activity = activity;
    t->activity_start = now;
  }
  PushAll(&events);
}

void Timeline::Done(const std::vector<std::string>& keys) {
  if (!enabled()) return;
  const int64_t now = NowUs();
  std::vector<Event> events;
  events.reserve(keys.size() * 2);
  for (const std::string& key : keys) {
    Track* t = Find(key);
    if (t == nullptr || t->depth != 2) continue;
    EndActivity(*t, now, &events);
    events.push_back(Event{Kind::kSpan, t->exec_start, t->tid, now - t->exec_start,
                           ExecName(t->op), {}});
    t->depth = 0;
  }
  PushAll(&events);
}

void Timeline::CycleStart() {
  if (enabled() && mark_cycles()) {
    Push(Event{Kind::kGlobalInstant, NowUs(), 0, 0, "CYCLE_START", {}});
  }
}

namespace {

void AppendInt(std::string* out, int64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, static_cast<size_t>(res.ptr - buf));
}

}  // namespace

void Timeline::Format(const Event& e, std::string* out) const {
  out->append("{\"pid\": 0, \"tid\": ");
  AppendInt(out, e.tid);
  out->append(", \"ts\": ");
  AppendInt(out, e.kind == Kind::kMeta ? 0 : e.ts_us - origin_us_);
  switch (e.kind) {
    case Kind::kSpan:
      out->append(", \"ph\": \"X\", \"dur\": ");
      AppendInt(out, e.value);
      out->append(", \"name\": \"").append(e.name).append("\"");
      if (e.text) out->append(", \"args\": ").append(*e.text);
      break;
    case Kind::kInstant:
    case Kind::kGlobalInstant:
      out->append(e.kind == Kind::kGlobalInstant ? ", \"ph\": \"i\", \"s\": \"g\", \"name\": \""
                                                   : ", \"ph\": \"i\", \"s\": \"t\", \"name\": \"");
      out->append(e.name).append("\"");
      break;
    case Kind::kRankReady:
      out->append(", \"ph\": \"i\", \"s\": \"t\", \"name\": \"rank ");
      AppendInt(out, e.value);
      out->append(" ready\"");
      break;
    case Kind::kMeta:
      out->append(", \"ph\": \"M\", \"name\": \"").append(e.name);
      out->append("\", \"args\": {\"name\": \"").append(Escape(*e.text)).append("\"}");
      break;
  }
  out->append("}");
}

void Timeline::WriteBatch(std::vector<Event>& batch) {
  if (batch.empty() || fd_ < 0) return;
  std::string text;
  text.reserve(batch.size() * 96);
  for (const Event& e : batch) {
    if (wrote_any_) text += ",\n";
    Format(e, &text);
    wrote_any_ = true;
  }
  text += "\n]";
  // One pwrite over the closing bracket: the events and a new bracket land together.
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::pwrite(fd_, text.data() + done, text.size() - done,
                         end_ + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // disk full: drop the rest of this batch, keep the file valid so far
    done += static_cast<size_t>(n);
  }
  if (done == text.size()) end_ += static_cast<off_t>(text.size()) - 1;
  batch.clear();
}

void Timeline::WriterLoop() {
#if defined(__linux__)
  sched_param idle{};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);  // formatting never competes
  pthread_setname_np(pthread_self(), "hvdl-timeline");
#endif
  std::vector<Event> batch;
  while (true) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_; });
      batch.swap(queue_);
      stopping = stop_;
    }
    WriteBatch(batch);  // formatting and I/O happen outside the lock the recorder takes
    if (stopping) return;
  }
}

}  // namespace hvdl
