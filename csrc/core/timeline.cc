#include "core/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
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

std::string Upper(const char* s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
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
  Push(Event{Kind::kMeta, 0, 0, "process_name", "horovodlite (rank 0)"});
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
  if (e.ts_us == 0 && e.kind != Kind::kMeta) e.ts_us = NowUs();
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  queue_.push_back(std::move(e));
}

Timeline::Track& Timeline::TrackFor(const std::string& key, const std::string& label) {
  auto it = tracks_.find(key);
  if (it != tracks_.end()) return it->second;
  Track t;
  t.tid = static_cast<int32_t>(tracks_.size()) + 1;
  Push(Event{Kind::kMeta, 0, t.tid, "thread_name", label});
  return tracks_.emplace(key, t).first->second;
}

void Timeline::NegotiateStart(const std::string& key, const std::string& label, OpType op,
                              DataType dtype, const Shape& shape) {
  if (!enabled()) return;
  Track& t = TrackFor(key, label);
  if (t.depth > 0) return;  // already negotiating or executing
  ++t.depth;
  std::string args = "{\"dtype\": \"" + std::string(DataTypeName(dtype)) + "\", \"shape\": \"" +
                     ShapeString(shape) + "\"}";
  Push(Event{Kind::kBegin, 0, t.tid, nullptr, "NEGOTIATE_" + Upper(OpTypeName(op)) + "|" + args});
}

void Timeline::RankReady(const std::string& key, int rank) {
  if (!enabled()) return;
  auto it = tracks_.find(key);
  if (it == tracks_.end()) return;
  Push(Event{Kind::kInstant, 0, it->second.tid, nullptr, "rank " + std::to_string(rank) + " ready"});
}

void Timeline::CacheHit(const std::string& key) {
  if (!enabled()) return;
  auto it = tracks_.find(key);
  if (it != tracks_.end()) Push(Event{Kind::kInstant, 0, it->second.tid, "agreed via response cache", ""});
}

void Timeline::NegotiateEnd(const std::string& key, OpType op) {
  if (!enabled()) return;
  auto it = tracks_.find(key);
  if (it == tracks_.end() || it->second.depth != 1) return;
  Track& t = it->second;
  Push(Event{Kind::kEnd, 0, t.tid, nullptr, ""});
  Push(Event{Kind::kBegin, 0, t.tid, nullptr, Upper(OpTypeName(op))});
  Push(Event{Kind::kBegin, 0, t.tid, "QUEUE", ""});
  t.activity_open = true;
}

void Timeline::Activity(const std::string& key, const char* activity) {
  if (!enabled()) return;
  auto it = tracks_.find(key);
  if (it == tracks_.end() || it->second.depth != 1) return;
  Track& t = it->second;
  if (t.activity_open) Push(Event{Kind::kEnd, 0, t.tid, nullptr, ""});
  t.activity_open = activity != nullptr;
  if (activity != nullptr) Push(Event{Kind::kBegin, 0, t.tid, activity, ""});
}

void Timeline::Done(const std::string& key) {
  if (!enabled()) return;
  auto it = tracks_.find(key);
  if (it == tracks_.end() || it->second.depth != 1) return;
  Activity(key, nullptr);
  Push(Event{Kind::kEnd, 0, it->second.tid, nullptr, ""});
  it->second.depth = 0;
}

void Timeline::CycleStart() {
  if (enabled() && mark_cycles()) Push(Event{Kind::kGlobalInstant, 0, 0, "CYCLE_START", ""});
}

std::string Timeline::Format(const Event& e) const {
  const int64_t ts = e.kind == Kind::kMeta ? 0 : e.ts_us - origin_us_;
  std::string name = e.name != nullptr ? e.name : e.text;
  std::string args;
  if (e.kind == Kind::kBegin && e.name == nullptr) {
    size_t bar = e.text.find('|');
    if (bar != std::string::npos) {
      name = e.text.substr(0, bar);
      args = e.text.substr(bar + 1);
    }
  }
  std::string out = "{\"pid\": 0, \"tid\": " + std::to_string(e.tid) + ", \"ts\": " +
                    std::to_string(ts) + ", ";
  switch (e.kind) {
    case Kind::kBegin:
      out += "\"ph\": \"B\", \"name\": \"" + Escape(name) + "\"";
      if (!args.empty()) out += ", \"args\": " + args;
      break;
    case Kind::kEnd:
      out += "\"ph\": \"E\"";
      break;
    case Kind::kInstant:
      out += "\"ph\": \"i\", \"s\": \"t\", \"name\": \"" + Escape(name) + "\"";
      break;
    case Kind::kGlobalInstant:
      out += "\"ph\": \"i\", \"s\": \"g\", \"name\": \"" + Escape(name) + "\"";
      break;
    case Kind::kMeta:
      out += "\"ph\": \"M\", \"name\": \"" + std::string(e.name) + "\", \"args\": {\"name\": \"" +
             Escape(e.text) + "\"}";
      break;
  }
  return out + "}";
}

void Timeline::WriteBatch(std::vector<Event>& batch) {
  if (batch.empty() || fd_ < 0) return;
  std::string text;
  for (const Event& e : batch) {
    text += wrote_any_ ? ",\n" : "";
    text += Format(e);
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
