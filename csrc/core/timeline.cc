#include "core/timeline.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/logging.h"

namespace hvdl {
namespace {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Names longer than this are cut: every event must fit in one page of the file (see timeline.h).
constexpr size_t kMaxNameChars = 1024;
// Events waiting for the writer; a recorder that finds the queue this full waits for it.
constexpr size_t kMaxQueued = size_t{1} << 18;
// The first region of spaces the closing bracket sits behind.
constexpr off_t kInitialRegion = off_t{1} << 20;
// A full region is replaced by a copy with this many times the room. Each growth copies the file
// once, so a larger factor copies less (x4: a third of the content is copied again, x2: all of it)
// at the price of more trailing spaces in the file of a killed job (up to 3/4 of it).
constexpr off_t kGrowth = 4;
// The writer's page-aligned I/O buffer, and the most one write or read moves. Small, because the
// writer only yields the CPU on its way back to user space: on a kernel without preemption
// (PREEMPT_NONE, common on servers) a training thread waking on its core waits for the current
// call to finish. (Fusion benchmark, 200 paired rounds: 1 MiB calls +3.2% and +9.1%, 128 KiB
// calls +2.3% to +6.3% over four runs.)
constexpr size_t kIoBytes = size_t{1} << 17;

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (out.size() >= kMaxNameChars) {
      out += "...";
      break;
    }
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

// Opens with O_DIRECT where the filesystem allows it (see timeline.h), else buffered.
int OpenFile(const char* path, int flags) {
  int fd = ::open(path, flags | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) fd = ::open(path, flags, 0644);
  return fd;
}

// pread/pwrite of the whole range, retried on short counts and EINTR. A filesystem that took
// O_DIRECT at open but rejects the transfer (EINVAL) gets the fd switched to buffered I/O.
template <typename Io, typename Buf>
bool Transfer(Io io, int fd, Buf data, size_t n, off_t offset) {
  while (n > 0) {
    ssize_t done = io(fd, data, n, offset);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0 && errno == EINVAL) {
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags >= 0 && (flags & O_DIRECT) != 0 && ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0) {
        continue;
      }
    }
    if (done <= 0) return false;
    data += done;
    n -= static_cast<size_t>(done);
    offset += done;
  }
  return true;
}

bool WriteAll(int fd, off_t offset, const char* data, size_t n) {
  return Transfer(::pwrite, fd, data, n, offset);
}

bool ReadAll(int fd, off_t offset, char* data, size_t n) {
  return Transfer(::pread, fd, data, n, offset);
}

// Writes a new version of `path` with `fill(fd)` and puts it in place with rename() (atomic), so
// readers see the old file or the new one, never a partial one. It is built in an unnamed file
// (O_TMPFILE) where the filesystem has them, so a kill meanwhile leaves nothing behind; it is
// named only just before the rename. Returns the new file's fd, or -1 (errno set).
template <typename Fill>
int ReplaceFile(const std::string& path, Fill fill) {
  const std::string tmp = path + ".hvdl-tmp";
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  bool unnamed = true;
  int fd = OpenFile(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    unnamed = false;
    fd = OpenFile(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC);
  }
  bool ok = fd >= 0 && fill(fd);
  if (ok && unnamed) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    ::unlink(tmp.c_str());  // a leftover of an earlier killed run
    ok = ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) == 0;
  }
  ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
  if (ok) return fd;
  const int err = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
  }
  errno = err;
  return -1;
}

}  // namespace

Timeline::~Timeline() { Stop(); }

Status Timeline::Start(const std::string& path, bool mark_cycles) {
  Stop();
  const long page = ::sysconf(_SC_PAGESIZE);
  page_ = page > 0 ? static_cast<size_t>(page) : 4096;
  if (!io_) {
    void* buf = nullptr;
    if (::posix_memalign(&buf, page_, kIoBytes) != 0) {
      return Status::InvalidArgument("timeline: out of memory for the I/O buffer");
    }
    io_.reset(static_cast<char*>(buf));
  }
  // Like every later version of the file, the first replaces whatever is at `path` in one
  // rename: "[", the first region of spaces, "]".
  const int fd = ReplaceFile(
      path, [&](int to) { return PutPages(to, 0, kInitialRegion, kInitialRegion - 1, "["); });
  if (fd < 0) {
    const int err = errno;  // before the message is built
    return Status::InvalidArgument("cannot write timeline file '" + path +
                                   "': " + std::strerror(err));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    path_ = path;
    fd_ = fd;
    pos_ = 1;
    head_ = "[";
    end_ = kInitialRegion - 1;
    wrote_any_ = false;
    stop_ = false;
    queue_.clear();
    origin_us_ = NowUs();
    // Under mu_: events an earlier timeline's recorder still publishes are dropped (Publish).
    generation_.fetch_add(1, std::memory_order_release);  // the background thread drops its tracks
  }
  mark_cycles_ = mark_cycles;
  writer_ = std::thread([this] { WriterLoop(); });
  enabled_ = true;
  Push(Event{Kind::kMeta, 0, 0, 0, "process_name",
             std::make_shared<std::string>("horovodlite (rank 0)"), {}});
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
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

bool Timeline::WaitForRoom(std::unique_lock<std::mutex>& lock) {
  // Back-pressure instead of unbounded memory when the idle-priority writer gets no CPU.
  space_cv_.wait(lock, [&] { return stop_ || queue_.size() < kMaxQueued; });
  return !stop_;
}

void Timeline::Push(Event e) {
  std::unique_lock<std::mutex> lock(mu_);
  if (WaitForRoom(lock)) queue_.push_back(std::move(e));
}

void Timeline::Publish() {
  if (staged_.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  if (!WaitForRoom(lock) || generation_.load(std::memory_order_relaxed) != seen_generation_) {
    staged_.clear();
    return;
  }
  if (queue_.empty()) queue_.swap(staged_);  // the common case: no copy, buffers trade places
  else queue_.insert(queue_.end(), std::make_move_iterator(staged_.begin()),
                     std::make_move_iterator(staged_.end()));
  staged_.clear();
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
  tracks_.clear();
  staged_.clear();
  batch_.reset();
  batch_tracks_.clear();
}

Timeline::Track* Timeline::Find(const std::string& key) {
  auto it = tracks_.find(key);
  return it == tracks_.end() ? nullptr : &it->second;
}

Timeline::Track& Timeline::TrackFor(const std::string& key, const std::string& label) {
  if (Track* t = Find(key)) return *t;
  Track t;
  t.tid = static_cast<int32_t>(tracks_.size()) + 1;
  staged_.push_back(
      Event{Kind::kMeta, 0, t.tid, 0, "thread_name", std::make_shared<std::string>(label), {}});
  return tracks_.emplace(key, std::move(t)).first->second;
}

void Timeline::NegotiateStart(const std::string& key, const std::string& label, OpType op,
                              DataType dtype, const Shape& shape) {
  if (!Active()) return;
  Track& t = TrackFor(key, label);
  if (t.depth > 0) return;  // already negotiating or executing
  t.depth = 1;
  t.op = op;
  t.negotiate_start = NowUs();
  if (!t.args || t.dtype != dtype || t.shape != shape) {
    t.dtype = dtype;
    t.shape = shape;
    t.describe = true;
    std::string body = "\"dtype\":\"" + std::string(DataTypeName(dtype)) + "\",\"shape\":\"" +
                       ShapeString(shape) + "\"";
    t.args = std::make_shared<std::string>("{" + body + "}");
    t.cached_args = std::make_shared<std::string>("{" + body + ",\"via\":\"response cache\"}");
  }
}

void Timeline::RankReady(const std::string& key, int rank) {
  if (!Active()) return;
  if (Track* t = Find(key)) {
    staged_.push_back(Event{Kind::kRankReady, NowUs(), t->tid, rank, nullptr, {}, {}});
  }
}

void Timeline::NegotiateEnd(const std::string& key, OpType op, bool cached) {
  if (!Active()) return;
  Track* t = Find(key);
  if (t == nullptr || t->depth != 1) return;
  const int64_t now = NowUs();
  // dtype and shape only when they are new on this track (they rarely change; repeating them
  // on every negotiation made the trace of the fusion benchmark 11% bigger).
  static const auto kCachedOnly = std::make_shared<const std::string>("{\"via\":\"response cache\"}");
  std::shared_ptr<const std::string> args;
  if (t->describe) args = cached ? t->cached_args : t->args;
  else if (cached) args = kCachedOnly;
  t->describe = false;
  staged_.push_back(Event{Kind::kSpan, t->negotiate_start, t->tid, now - t->negotiate_start,
                          NegotiateName(op), std::move(args), {}});
  t->depth = 2;
  t->exec_start = now;  // QUEUE starts
}

void Timeline::BeginBatch(const std::vector<std::string>& keys) {
  batch_.reset();
  batch_tracks_.clear();
  if (!Active()) return;
  auto members = std::make_shared<std::vector<Member>>();
  members->reserve(keys.size());
  for (const std::string& key : keys) {
    Track* t = Find(key);
    if (t == nullptr || t->depth != 2) continue;
    members->push_back(Member{t->tid, t->op, t->exec_start});
    batch_tracks_.push_back(t);
  }
  if (!members->empty()) batch_ = std::move(members);
  phase_ = nullptr;
}

void Timeline::EndPhase(int64_t now) {
  if (phase_ == nullptr) staged_.push_back(Event{Kind::kBatchQueue, 0, 0, now, "QUEUE", {}, batch_});
  else staged_.push_back(Event{Kind::kBatchPhase, phase_start_, 0, now, phase_, {}, batch_});
}

void Timeline::Activity(const char* activity) {
  if (!Active() || !batch_) return;
  const int64_t now = NowUs();
  EndPhase(now);
  phase_ = activity;
  phase_start_ = now;
}

void Timeline::Done() {
  if (Active() && batch_) {
    const int64_t now = NowUs();
    EndPhase(now);
    staged_.push_back(Event{Kind::kBatchOp, 0, 0, now, nullptr, {}, batch_});
    for (Track* t : batch_tracks_) t->depth = 0;
  }
  batch_.reset();
  batch_tracks_.clear();
  // Published now, not at the next cycle: the executor marks the handles done right after, and
  // a stop_timeline() that follows the caller's synchronize() must find these events queued.
  Publish();
}

void Timeline::CycleStart() {
  if (!Active()) return;
  if (mark_cycles()) {
    staged_.push_back(Event{Kind::kGlobalInstant, NowUs(), 0, 0, "CYCLE_START", {}, {}});
  }
  Publish();
}

namespace {

// Formatting runs for every event: it writes into a stack buffer and appends once.
class Line {
 public:
  void Put(const char* s, size_t n) {
    std::memcpy(p_, s, n);
    p_ += n;
  }
  template <size_t N>
  void Lit(const char (&s)[N]) {
    Put(s, N - 1);
  }
  void Int(int64_t v) { p_ = std::to_chars(p_, buf_ + sizeof(buf_), v).ptr; }
  void AppendTo(std::string* out) const { out->append(buf_, static_cast<size_t>(p_ - buf_)); }

 private:
  char buf_[224];  // the fixed parts of an event: three integers and a static name (< 64)
  char* p_ = buf_;
};

}  // namespace

void Timeline::FormatSpan(int32_t tid, int64_t start, int64_t end, const char* name,
                          const std::string* args, std::string* out) const {
  Line line;
  line.Lit("{\"pid\":0,\"tid\":");
  line.Int(tid);
  line.Lit(",\"ts\":");
  line.Int(start - origin_us_);
  line.Lit(",\"ph\":\"X\",\"dur\":");
  line.Int(end - start);
  line.Lit(",\"name\":\"");
  line.Put(name, std::strlen(name));
  line.AppendTo(out);
  if (args != nullptr) out->append("\",\"args\":").append(*args).append("}");
  else out->append("\"}");
}

void Timeline::Format(const Event& e, std::string* out) const {
  if (e.kind == Kind::kSpan) {
    return FormatSpan(e.tid, e.ts_us, e.ts_us + e.value, e.name, e.text.get(), out);
  }
  Line line;
  line.Lit("{\"pid\":0,\"tid\":");
  line.Int(e.tid);
  line.Lit(",\"ts\":");
  line.Int(e.kind == Kind::kMeta ? 0 : e.ts_us - origin_us_);
  switch (e.kind) {
    case Kind::kGlobalInstant:
      line.Lit(",\"ph\":\"i\",\"s\":\"g\",\"name\":\"");
      line.Put(e.name, std::strlen(e.name));
      line.Lit("\"}");
      break;
    case Kind::kRankReady:
      line.Lit(",\"ph\":\"i\",\"s\":\"t\",\"name\":\"rank ");
      line.Int(e.value);
      line.Lit(" ready\"}");
      break;
    case Kind::kMeta:
      line.Lit(",\"ph\":\"M\",\"name\":\"");
      line.Put(e.name, std::strlen(e.name));
      line.AppendTo(out);
      out->append("\",\"args\":{\"name\":\"").append(Escape(*e.text)).append("\"}}");
      return;
    default:  // spans: above; batch events: expanded by WriteBatch
      return;
  }
  line.AppendTo(out);
}

void Timeline::Fail(const char* what) {
  const int err = errno;
  HVDL_LOG(Error) << "timeline '" << path_ << "': " << what << ": " << std::strerror(err)
                  << "; recording stopped (the file keeps what was written before)";
  enabled_ = false;
  ::close(fd_);
  fd_ = -1;
}

off_t Timeline::PageStart(off_t at) const { return at - at % static_cast<off_t>(page_); }

off_t Timeline::PageEnd(off_t at) const {
  return PageStart(at + static_cast<off_t>(page_) - 1);
}

bool Timeline::PutPages(int fd, off_t at, off_t upto, off_t bracket, const std::string& data) {
  char* buf = io_.get();
  size_t used = 0;  // bytes of `data` placed so far
  for (off_t off = at; off < upto;) {
    const size_t len = static_cast<size_t>(std::min<off_t>(upto - off, kIoBytes));
    const size_t take = std::min(data.size() - used, len);
    std::memcpy(buf, data.data() + used, take);
    std::memset(buf + take, ' ', len - take);
    if (bracket >= off && bracket < off + static_cast<off_t>(len)) buf[bracket - off] = ']';
    if (!WriteAll(fd, off, buf, len)) return false;
    used += take;
    off += static_cast<off_t>(len);
  }
  return true;
}

bool Timeline::CopyPages(int from, int to, off_t n) {
  for (off_t off = 0; off < n;) {
    const size_t len = static_cast<size_t>(std::min<off_t>(n - off, kIoBytes));
    if (!ReadAll(from, off, io_.get(), len) || !WriteAll(to, off, io_.get(), len)) return false;
    off += static_cast<off_t>(len);
  }
  return true;
}

bool Timeline::Flush(const std::string& text, off_t at) {
  if (at == pos_) return true;
  const off_t base = PageStart(pos_);
  if (!PutPages(fd_, base, PageEnd(at), end_, text)) {
    Fail("write failed");
    return false;
  }
  pos_ = at;
  head_.assign(text, static_cast<size_t>(PageStart(at) - base), std::string::npos);
  return true;
}

bool Timeline::Rewrite(off_t new_end, const char* tail) {
  // Whole pages up to the one holding pos_, then that page's content (head_) and `tail`, spaces
  // and the bracket; a trimmed file (new_end not at a page's end) is cut right after its bracket.
  const off_t base = PageStart(pos_), size = new_end + 1;
  const int fd = ReplaceFile(path_, [&](int to) {
    return CopyPages(fd_, to, base) && PutPages(to, base, PageEnd(size), new_end, head_ + tail) &&
           (size == PageEnd(size) || ::ftruncate(to, size) == 0);
  });
  if (fd < 0) {
    Fail("cannot rewrite the file");
    return false;
  }
  ::close(fd_);
  fd_ = fd;
  end_ = new_end;
  return true;
}

void Timeline::WriteBatch(std::vector<Event>& batch) {
  if (batch.empty() || fd_ < 0) {
    batch.clear();
    return;
  }
  // text_ is what the pages from the one holding pos_ onwards will hold: it starts with that
  // page's content so far (head_), and `at` is where its next byte lands. (text_ and event_ are
  // members so their memory is reused from batch to batch.)
  text_ = head_;
  off_t at = pos_;
  // Appends event_ to text_ without letting it cross a page boundary; grows the file first when
  // the region is full. False after an I/O error.
  const auto place = [&]() {
    const off_t size = static_cast<off_t>(event_.size());
    if (event_.size() > page_) return true;  // cannot happen with names cut to kMaxNameChars
    const auto start_for = [&](off_t from) {  // an event that would cross moves to the next page
      return from % static_cast<off_t>(page_) + size > static_cast<off_t>(page_) ? PageEnd(from)
                                                                                  : from;
    };
    off_t start = start_for(at);
    if (start + size > end_) {  // region full: write what fits, then grow (the content stops at
      // `at`: the padding is left out, it would cover the bracket)
      const off_t grown = PageEnd(std::max<off_t>(kGrowth * (end_ + 1), size + 1 + PageEnd(at)));
      if (!Flush(text_, at) || !Rewrite(grown - 1)) return false;
      text_ = head_;  // pos_ == at now
      start = start_for(at);
    }
    text_.append(static_cast<size_t>(start - at), ' ');
    text_ += event_;
    at = start + size;
    wrote_any_ = true;
    return true;
  };
  // Formats `e` (a batch event: one span per tensor) and places it; false after an I/O error.
  const auto emit = [&](const Event& e) {
    const auto separator = [&] { event_.assign(wrote_any_ ? ",\n" : "\n"); };
    if (!e.batch) {
      separator();
      Format(e, &event_);
      return place();
    }
    for (const Member& m : *e.batch) {
      separator();
      if (e.kind == Kind::kBatchQueue) {
        FormatSpan(m.tid, m.exec_start, e.value, "QUEUE", nullptr, &event_);
      } else if (e.kind == Kind::kBatchPhase) {
        FormatSpan(m.tid, e.ts_us, e.value, e.name, nullptr, &event_);
      } else {
        FormatSpan(m.tid, m.exec_start, e.value, ExecName(m.op), nullptr, &event_);
      }
      if (!place()) return false;
    }
    return true;
  };
  for (const Event& e : batch) {
    if (!emit(e)) break;
  }
  if (fd_ >= 0) Flush(text_, at);
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
    space_cv_.notify_all();
    WriteBatch(batch);  // formatting and I/O happen outside the lock the recorder takes
    if (stopping) break;
  }
  // Drop the padding: a copy ending "\n]" replaces the file.
  if (fd_ >= 0 && end_ > pos_ + 2) {
    Rewrite(pos_ + 1, "\n");
  }
}

}  // namespace hvdl
