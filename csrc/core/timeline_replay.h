// The timeline's formatter: replays the record log (core/timeline_log.h) on the writer thread and
// turns it into Chrome trace events placed in the file. Everything per tensor that touches
// scattered memory (the track of each name, the negotiation state, the batch's members) happens
// here, off the background thread (looking up a track per tensor on the background thread cost
// about 0.3 us per lookup, cache misses mostly: 1.7% of a fusion step).
//
// The events (timeline.h has the overview): one track (tid) per tensor name and process set, a
// thread_name metadata event when a track first appears; NEGOTIATE_<OP> spans with "rank <r>
// ready" instants inside; per batch member a QUEUE span, one span per activity and the <OP>
// span around them; global CYCLE_START instants.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/types.h"
#include "core/timeline_file.h"
#include "core/timeline_log.h"

namespace hvdl {

class TimelineReplay {
 public:
  explicit TimelineReplay(TimelineFile& file) : file_(file) {}
  // Forgets every track; timestamps are written relative to `origin_us`.
  void Reset(int64_t origin_us);
  // Replays one record; false after an I/O error.
  bool Replay(timeline_log::Reader& r);

 private:
  // One tensor's track and where its collective is.
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
  bool ReplayNegotiateStart(timeline_log::Reader& r);
  bool ReplayNegotiateEnd(timeline_log::Reader& r);
  // The track of a tensor (its key is left in key_), or nullptr.
  Track* Find(std::string_view name, int32_t process_set);
  // Format one event and place it; false after an I/O error. EmitInstant: "rank <rank> ready"
  // on the track, or with rank < 0 a global CYCLE_START.
  bool EmitSpan(int32_t tid, int64_t start, int64_t end, const char* name,
                const std::string* args);
  bool EmitInstant(int32_t tid, int64_t ts, int rank);
  bool EmitMeta(int32_t tid, const char* name, std::string_view value);
  // At kActivity and kDone: the batch's phase that ends at `now`, per member.
  bool EndPhase(int64_t now);

  TimelineFile& file_;
  int64_t origin_us_ = 0;
  std::unordered_map<std::string, Track> tracks_;
  std::vector<Track*> batch_;    // the members of the batch being executed
  const char* phase_ = nullptr;  // its current phase; nullptr: QUEUE
  int64_t phase_start_ = 0;
  std::string event_, event_args_, key_;  // buffers whose memory is reused
};

}  // namespace hvdl
