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
#include <string_view>
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
// Bytes of records waiting for the writer; a recorder that finds the queue this full waits.
constexpr size_t kMaxQueuedBytes = size_t{64} << 20;
// Emptied chunks of records kept for reuse (Publish hands over one per cycle and per batch: some
// tens arrive between two rounds of the writer).
constexpr size_t kSpareChunks = 64;
// The first region of spaces the closing bracket sits behind.
constexpr off_t kInitialRegion = off_t{1} << 20;
// A full region is replaced by a copy with this many times the room. Each growth copies the file
// once, so a larger factor copies less (x4: a third of the content is copied again, x2: all of it)
// at the price of more trailing spaces in the file of a killed job (up to 3/4 of it).
constexpr off_t kGrowth = 4;
// The most one write or read moves (the writer's page-aligned I/O buffer). A direct write has a
// large fixed cost (on a VM: 48-59 us of CPU for a 128 KiB call, 68-79 us for 1 MiB, 218-264 us
// for 4 MiB), so calls are large; not larger, because the writer only yields the CPU on its way
// back to user space: on a kernel without preemption (PREEMPT_NONE, common on servers) a
// training thread waking on the writer's core waits for the current call's CPU part to finish.
constexpr size_t kIoBytes = size_t{1} << 20;

std::string Escape(std::string_view s) {
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
  if (!io_) {  // the data half, and a half of spaces the padding is written from
    void* buf = nullptr;
    if (::posix_memalign(&buf, page_, 2 * kIoBytes) != 0) {
      return Status::InvalidArgument("timeline: out of memory for the I/O buffer");
    }
    io_.reset(static_cast<char*>(buf));
    std::memset(io_.get() + kIoBytes, ' ', kIoBytes);
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
  // The writer's state; no writer runs now (Stop joined it).
  path_ = path;
  fd_ = fd;
  pos_ = 1;
  head_ = "[";
  end_ = kInitialRegion - 1;
  wrote_any_ = false;
  origin_us_ = NowUs();
  tracks_.clear();
  batch_.clear();
  phase_ = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    queue_.clear();
    queue_.emplace_back(1, static_cast<char>(Rec::kProcessName));
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
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
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

namespace {

template <typename T>
char* Put(char* p, const T& v) {
  std::memcpy(p, &v, sizeof(T));
  return p + sizeof(T);
}

// A tensor in a record: its process set, the name's length and bytes.
size_t TensorBytes(const std::string& name) { return 2 * sizeof(int32_t) + name.size(); }

void PutTensor(char* p, const std::string& name, int32_t process_set) {
  p = Put(p, process_set);
  p = Put(p, static_cast<uint32_t>(name.size()));
  std::memcpy(p, name.data(), name.size());
}

}  // namespace

template <typename... Fields>
char* Timeline::Append(Rec kind, size_t extra, const Fields&... fields) {
  const size_t at = staged_.size();
  staged_.resize(at + 1 + (sizeof(Fields) + ... + 0) + extra);
  char* p = &staged_[at];
  *p++ = static_cast<char>(kind);
  ((p = Put(p, fields)), ...);
  return p;
}

void Timeline::NegotiateStart(const std::string& name, int32_t process_set, OpType op,
                              DataType dtype, const Shape& shape) {
  if (!Active()) return;
  const auto ndims = static_cast<uint32_t>(shape.size());
  const size_t dim_bytes = ndims * sizeof(int64_t);
  char* p = Append(Rec::kNegotiateStart, dim_bytes + TensorBytes(name), NowUs(),
                   static_cast<int32_t>(op), static_cast<int32_t>(dtype), ndims);
  if (dim_bytes > 0) std::memcpy(p, shape.data(), dim_bytes);
  PutTensor(p + dim_bytes, name, process_set);
}

void Timeline::RankReady(const std::string& name, int32_t process_set, int rank) {
  if (!Active()) return;
  PutTensor(Append(Rec::kRankReady, TensorBytes(name), NowUs(), static_cast<int32_t>(rank)), name,
            process_set);
}

void Timeline::NegotiateEnd(const std::string& name, int32_t process_set, OpType op,
                            bool cached) {
  if (!Active()) return;
  PutTensor(Append(Rec::kNegotiateEnd, TensorBytes(name), NowUs(), static_cast<int32_t>(op),
                   static_cast<int32_t>(cached)),
            name, process_set);
}

void Timeline::BeginBatch() {
  if (Active()) Append(Rec::kBatch, 0);
}

void Timeline::BatchMember(const std::string& name, int32_t process_set) {
  if (Active()) PutTensor(Append(Rec::kMember, TensorBytes(name)), name, process_set);
}

void Timeline::Activity(const char* activity) {
  if (Active()) Append(Rec::kActivity, 0, NowUs(), activity);
}

void Timeline::Done() {
  if (Active()) Append(Rec::kDone, 0, NowUs());
  // Published now, not at the next cycle: the executor marks the handles done right after, and
  // a stop_timeline() that follows the caller's synchronize() must find these records queued.
  Publish();
}

void Timeline::CycleStart() {
  if (!Active()) return;
  if (mark_cycles()) Append(Rec::kCycle, 0, NowUs());
  Publish();
}

namespace {

// Formatting runs for every event: it writes into a stack buffer and copies once. A Line starts
// an event: the separator from the event before (if any), then the fields every event has.
class Line {
 public:
  explicit Line(bool after_another) {
    if (after_another) Lit(",\n");
    else Lit("\n");
    Lit("{\"pid\":0,\"tid\":");
  }
  void Put(const char* s, size_t n) {
    std::memcpy(p_, s, n);
    p_ += n;
  }
  template <size_t N>
  void Lit(const char (&s)[N]) {
    Put(s, N - 1);
  }
  void Str(const char* s) { Put(s, std::strlen(s)); }
  void Int(int64_t v) { p_ = std::to_chars(p_, buf_ + sizeof(buf_), v).ptr; }
  std::string_view view() const { return std::string_view(buf_, static_cast<size_t>(p_ - buf_)); }

 private:
  char buf_[224];  // the fixed parts of an event: three integers and a static name (< 64)
  char* p_ = buf_;
};

}  // namespace

// Reads the records of a chunk of the log in the order the background thread wrote them.
class Timeline::LogReader {
 public:
  explicit LogReader(const std::string& log) : p_(log.data()), end_(log.data() + log.size()) {}
  bool more() const { return p_ < end_; }
  template <typename T>
  T Get() {
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  const char* Skip(size_t n) {
    const char* at = p_;
    p_ += n;
    return at;
  }
  // A tensor (PutTensor): its process set in *set, its name returned.
  std::string_view Tensor(int32_t* set) {
    *set = Get<int32_t>();
    const auto n = Get<uint32_t>();
    return std::string_view(Skip(n), n);
  }

 private:
  const char* p_;
  const char* end_;
};

Timeline::Track* Timeline::Find(std::string_view name, int32_t process_set) {
  key_.assign(name.data(), name.size());  // one key per (name, process set), in a reused buffer
  if (process_set != 0) {
    key_ += '\x1f';
    key_ += std::to_string(process_set);
  }
  auto it = tracks_.find(key_);
  return it == tracks_.end() ? nullptr : &it->second;
}

bool Timeline::EmitSpan(int32_t tid, int64_t start, int64_t end, const char* name,
                        const std::string* args) {
  Line line(wrote_any_);
  line.Int(tid);
  line.Lit(",\"ts\":");
  line.Int(start - origin_us_);
  line.Lit(",\"ph\":\"X\",\"dur\":");
  line.Int(end - start);
  line.Lit(",\"name\":\"");
  line.Str(name);
  if (args == nullptr) {
    line.Lit("\"}");
    return Place(line.view());
  }
  line.Lit("\",\"args\":");
  event_.assign(line.view()).append(*args).append("}");
  return Place(event_);
}

bool Timeline::EmitInstant(int32_t tid, int64_t ts, int rank) {
  Line line(wrote_any_);
  line.Int(tid);
  line.Lit(",\"ts\":");
  line.Int(ts - origin_us_);
  if (rank < 0) {
    line.Lit(",\"ph\":\"i\",\"s\":\"g\",\"name\":\"CYCLE_START\"}");
  } else {
    line.Lit(",\"ph\":\"i\",\"s\":\"t\",\"name\":\"rank ");
    line.Int(rank);
    line.Lit(" ready\"}");
  }
  return Place(line.view());
}

bool Timeline::EmitMeta(int32_t tid, const char* name, std::string_view value) {
  Line line(wrote_any_);
  line.Int(tid);
  line.Lit(",\"ts\":0,\"ph\":\"M\",\"name\":\"");
  line.Str(name);
  line.Lit("\",\"args\":{\"name\":\"");
  event_.assign(line.view()).append(Escape(value)).append("\"}}");
  return Place(event_);
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
  const char* spaces = buf + kIoBytes;
  size_t used = 0;  // bytes of `data` placed so far
  for (off_t off = at; off < upto;) {
    const size_t len = static_cast<size_t>(std::min<off_t>(upto - off, kIoBytes));
    const size_t take = std::min(data.size() - used, len);
    const bool has_bracket = bracket >= off && bracket < off + static_cast<off_t>(len);
    const char* from = spaces;  // padding only: written straight from the spaces
    if (take > 0 || has_bracket) {
      std::memcpy(buf, data.data() + used, take);
      std::memset(buf + take, ' ', len - take);
      if (has_bracket) buf[bracket - off] = ']';
      from = buf;
    }
    if (!WriteAll(fd, off, from, len)) return false;
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

bool Timeline::Place(std::string_view event) {
  const off_t size = static_cast<off_t>(event.size());
  if (event.size() > page_) return true;  // cannot happen with names cut to kMaxNameChars
  const auto start_for = [&](off_t from) {  // an event that would cross moves to the next page
    return from % static_cast<off_t>(page_) + size > static_cast<off_t>(page_) ? PageEnd(from)
                                                                                : from;
  };
  off_t start = start_for(at_);
  if (start + size > end_) {  // region full: write what fits, then grow (the content stops at
    // at_: the padding is left out, it would cover the bracket)
    const off_t grown = PageEnd(std::max<off_t>(kGrowth * (end_ + 1), size + 1 + PageEnd(at_)));
    if (!Flush(text_, at_) || !Rewrite(grown - 1)) return false;
    text_ = head_;  // pos_ == at_ now
    start = start_for(at_);
  }
  if (start > at_) text_.append(static_cast<size_t>(start - at_), ' ');
  text_ += event;
  at_ = start + size;
  wrote_any_ = true;
  return true;
}

bool Timeline::EndPhase(int64_t now) {
  for (const Track* t : batch_) {
    const bool ok = phase_ == nullptr ? EmitSpan(t->tid, t->exec_start, now, "QUEUE", nullptr)
                                      : EmitSpan(t->tid, phase_start_, now, phase_, nullptr);
    if (!ok) return false;
  }
  return true;
}

bool Timeline::ReplayNegotiateStart(LogReader& r) {
  const auto ts = r.Get<int64_t>();
  const auto op = static_cast<OpType>(r.Get<int32_t>());
  const auto dtype = static_cast<DataType>(r.Get<int32_t>());
  const auto ndims = r.Get<uint32_t>();
  const size_t dim_bytes = ndims * sizeof(int64_t);
  const char* dims = r.Skip(dim_bytes);
  int32_t set = 0;
  const std::string_view name = r.Tensor(&set);
  Track* t = Find(name, set);
  if (t == nullptr) {
    t = &tracks_[key_];
    t->tid = static_cast<int32_t>(tracks_.size());  // 1, 2, ...: tid 0 is the process
    if (!EmitMeta(t->tid, "thread_name", name)) return false;
  }
  if (t->depth > 0) return true;  // already negotiating or executing
  t->depth = 1;
  t->op = op;
  t->negotiate_start = ts;
  if (!t->known || t->dtype != dtype || t->shape.size() != ndims ||
      (ndims > 0 && std::memcmp(t->shape.data(), dims, dim_bytes) != 0)) {
    t->known = true;
    t->dtype = dtype;
    t->shape.resize(ndims);
    if (ndims > 0) std::memcpy(t->shape.data(), dims, dim_bytes);
    t->describe = true;
  }
  return true;
}

bool Timeline::ReplayNegotiateEnd(LogReader& r) {
  const auto ts = r.Get<int64_t>();
  const auto op = static_cast<OpType>(r.Get<int32_t>());
  const bool cached = r.Get<int32_t>() != 0;
  int32_t set = 0;
  const std::string_view name = r.Tensor(&set);
  Track* t = Find(name, set);
  if (t == nullptr || t->depth != 1) return true;
  // dtype and shape only when they are new on this track (they rarely change; repeating them on
  // every negotiation made the trace of the fusion benchmark 11% bigger).
  static const std::string kCachedOnly = "{\"via\":\"response cache\"}";
  const std::string* args = cached ? &kCachedOnly : nullptr;
  if (t->describe) {
    event_args_ = "{\"dtype\":\"" + std::string(DataTypeName(t->dtype)) + "\",\"shape\":\"" +
                  ShapeString(t->shape) + (cached ? "\",\"via\":\"response cache\"}" : "\"}");
    args = &event_args_;
    t->describe = false;
  }
  t->depth = 2;
  t->exec_start = ts;  // QUEUE starts
  return EmitSpan(t->tid, t->negotiate_start, ts, NegotiateName(op), args);
}

bool Timeline::Replay(LogReader& r) {
  switch (r.Get<Rec>()) {
    case Rec::kProcessName:
      return EmitMeta(0, "process_name", "horovodlite (rank 0)");
    case Rec::kNegotiateStart:
      return ReplayNegotiateStart(r);
    case Rec::kRankReady: {
      const auto ts = r.Get<int64_t>();
      const auto rank = r.Get<int32_t>();
      int32_t set = 0;
      const std::string_view name = r.Tensor(&set);
      const Track* t = Find(name, set);
      return t == nullptr || EmitInstant(t->tid, ts, rank);
    }
    case Rec::kNegotiateEnd:
      return ReplayNegotiateEnd(r);
    case Rec::kBatch:
      batch_.clear();
      phase_ = nullptr;
      return true;
    case Rec::kMember: {
      int32_t set = 0;
      const std::string_view name = r.Tensor(&set);
      Track* t = Find(name, set);
      if (t != nullptr && t->depth == 2) batch_.push_back(t);
      return true;
    }
    case Rec::kActivity: {
      const auto ts = r.Get<int64_t>();
      const auto activity = r.Get<const char*>();
      if (batch_.empty()) return true;
      const bool ok = EndPhase(ts);
      phase_ = activity;
      phase_start_ = ts;
      return ok;
    }
    case Rec::kDone: {
      const auto ts = r.Get<int64_t>();
      bool ok = EndPhase(ts);
      for (Track* t : batch_) {
        ok = ok && EmitSpan(t->tid, t->exec_start, ts, ExecName(t->op), nullptr);
        t->depth = 0;
      }
      batch_.clear();
      return ok;
    }
    case Rec::kCycle:
      return EmitInstant(0, r.Get<int64_t>(), -1);
  }
  return true;
}

void Timeline::WriteLog(const std::vector<std::string>& chunks) {
  if (chunks.empty() || fd_ < 0) return;
  // text_ is what the pages from the one holding pos_ onwards will hold: it starts with that
  // page's content so far (head_), and at_ is where its next byte lands.
  text_ = head_;
  at_ = pos_;
  bool ok = true;  // false after an I/O error (the timeline is disabled then)
  for (const std::string& chunk : chunks) {
    LogReader r(chunk);
    while (ok && r.more()) ok = Replay(r);
  }
  if (fd_ >= 0) Flush(text_, at_);
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
  // Drop the padding: a copy ending "\n]" replaces the file.
  if (fd_ >= 0 && end_ > pos_ + 2) {
    Rewrite(pos_ + 1, "\n");
  }
}

}  // namespace hvdl
