// The timeline's record log: what the background thread appends (core/timeline.cc) and the
// writer thread replays (core/timeline_replay.cc). A record is its kind byte, then fixed-size
// fields (memcpy'd, unaligned) and, where it names a tensor, the process set, the name's length
// and its bytes. Both sides live in one process and one build, so the format is not versioned.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace hvdl {

enum class TimelineRec : uint8_t {
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

namespace timeline_log {

template <typename T>
char* Put(char* p, const T& v) {
  std::memcpy(p, &v, sizeof(T));
  return p + sizeof(T);
}

// A tensor in a record: its process set, the name's length and bytes.
inline size_t TensorBytes(const std::string& name) { return 2 * sizeof(int32_t) + name.size(); }

inline void PutTensor(char* p, const std::string& name, int32_t process_set) {
  p = Put(p, process_set);
  p = Put(p, static_cast<uint32_t>(name.size()));
  std::memcpy(p, name.data(), name.size());
}

// Reads the records of a chunk of the log in the order the background thread wrote them.
class Reader {
 public:
  explicit Reader(const std::string& log) : p_(log.data()), end_(log.data() + log.size()) {}
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

}  // namespace timeline_log
}  // namespace hvdl
