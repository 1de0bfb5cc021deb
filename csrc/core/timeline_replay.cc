#include "core/timeline_replay.h"

#include <charconv>
#include <cstring>

namespace hvdl {
namespace {

// Names longer than this are cut: every event must fit in one page of the file
// (core/timeline_file.h).
constexpr size_t kMaxNameChars = 1024;

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

void TimelineReplay::Reset(int64_t origin_us) {
  origin_us_ = origin_us;
  tracks_.clear();
  batch_.clear();
  phase_ = nullptr;
}

TimelineReplay::Track* TimelineReplay::Find(std::string_view name, int32_t process_set) {
  key_.assign(name.data(), name.size());  // one key per (name, process set), in a reused buffer
  if (process_set != 0) {
    key_ += '\x1f';
    key_ += std::to_string(process_set);
  }
  auto it = tracks_.find(key_);
  return it == tracks_.end() ? nullptr : &it->second;
}

bool TimelineReplay::EmitSpan(int32_t tid, int64_t start, int64_t end, const char* name,
                              const std::string* args) {
  Line line(file_.wrote_any());
  line.Int(tid);
  line.Lit(",\"ts\":");
  line.Int(start - origin_us_);
  line.Lit(",\"ph\":\"X\",\"dur\":");
  line.Int(end - start);
  line.Lit(",\"name\":\"");
  line.Str(name);
  if (args == nullptr) {
    line.Lit("\"}");
    return file_.Place(line.view());
  }
  line.Lit("\",\"args\":");
  event_.assign(line.view()).append(*args).append("}");
  return file_.Place(event_);
}

bool TimelineReplay::EmitInstant(int32_t tid, int64_t ts, int rank) {
  Line line(file_.wrote_any());
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
  return file_.Place(line.view());
}

bool TimelineReplay::EmitMeta(int32_t tid, const char* name, std::string_view value) {
  Line line(file_.wrote_any());
  line.Int(tid);
  line.Lit(",\"ts\":0,\"ph\":\"M\",\"name\":\"");
  line.Str(name);
  line.Lit("\",\"args\":{\"name\":\"");
  event_.assign(line.view()).append(Escape(value)).append("\"}}");
  return file_.Place(event_);
}

bool TimelineReplay::EndPhase(int64_t now) {
  for (const Track* t : batch_) {
    const bool ok = phase_ == nullptr ? EmitSpan(t->tid, t->exec_start, now, "QUEUE", nullptr)
                                      : EmitSpan(t->tid, phase_start_, now, phase_, nullptr);
    if (!ok) return false;
  }
  return true;
}

bool TimelineReplay::ReplayNegotiateStart(timeline_log::Reader& r) {
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

bool TimelineReplay::ReplayNegotiateEnd(timeline_log::Reader& r) {
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

bool TimelineReplay::Replay(timeline_log::Reader& r) {
  switch (r.Get<TimelineRec>()) {
    case TimelineRec::kProcessName:
      return EmitMeta(0, "process_name", "horovodlite (rank 0)");
    case TimelineRec::kNegotiateStart:
      return ReplayNegotiateStart(r);
    case TimelineRec::kRankReady: {
      const auto ts = r.Get<int64_t>();
      const auto rank = r.Get<int32_t>();
      int32_t set = 0;
      const std::string_view name = r.Tensor(&set);
      const Track* t = Find(name, set);
      return t == nullptr || EmitInstant(t->tid, ts, rank);
    }
    case TimelineRec::kNegotiateEnd:
      return ReplayNegotiateEnd(r);
    case TimelineRec::kBatch:
      batch_.clear();
      phase_ = nullptr;
      return true;
    case TimelineRec::kMember: {
      int32_t set = 0;
      const std::string_view name = r.Tensor(&set);
      Track* t = Find(name, set);
      if (t != nullptr && t->depth == 2) batch_.push_back(t);
      return true;
    }
    case TimelineRec::kActivity: {
      const auto ts = r.Get<int64_t>();
      const auto activity = r.Get<const char*>();
      if (batch_.empty()) return true;
      const bool ok = EndPhase(ts);
      phase_ = activity;
      phase_start_ = ts;
      return ok;
    }
    case TimelineRec::kDone: {
      const auto ts = r.Get<int64_t>();
      bool ok = EndPhase(ts);
      for (Track* t : batch_) {
        ok = ok && EmitSpan(t->tid, t->exec_start, ts, ExecName(t->op), nullptr);
        t->depth = 0;
      }
      batch_.clear();
      return ok;
    }
    case TimelineRec::kCycle:
      return EmitInstant(0, r.Get<int64_t>(), -1);
  }
  return true;
}

}  // namespace hvdl
