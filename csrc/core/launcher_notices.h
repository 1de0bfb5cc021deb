// LauncherNotices: what horovodliterun tells a running rank about the rest of the job.
//
// horovodliterun's per-rank wrapper (horovodlite/runner/task.py) learns from the launcher when a
// host was lost (its processes died, or nothing came from it for a while: a cut link). The MPI
// runtime may take minutes to notice a cut link, or never; meanwhile this rank's collectives
// with the lost ranks would just wait. So the wrapper writes one line per event into a pipe whose
// read end the rank inherits (its number in HVDL_NOTICE_FD):
//
//     lost <host> (<ranks>): <why>
//
// An elastic job's driver (horovodliterun --elastic) prefixes each line with the rendezvous
// round it concerns, "@<round> lost ...": a rank that has moved on to a later round (SetRound)
// drops it - it reached the pipe after this rank had already recovered from that loss.
//
// The pipe has ONE reader per process, a thread started by the first LauncherNotices and kept
// for the life of the process; each LauncherNotices (one per Context) subscribes to it and gets
// every line, on that thread, while it exists. The callback fails the runtime (Context::Abort):
// every pending handle and every later submission raises HorovodInternalError with the line.
// One reader because a process may hold several Contexts at once: an aborted one is never
// destroyed (core/context.cc), and neither is one left after a recovery. With a reader each,
// a line woke every reader's poll but only one read it - the one of a context left behind,
// often - and the others blocked in read(): the live context missed the notice, and its
// destructor then joined a thread that never returned (an elastic worker hung in hvd.shutdown
// at a reset; scripts/elastic_chaos.py's long run stalled on it). Lines read while no context
// listens wait for the next one (they stayed in the pipe before). Without HVDL_NOTICE_FD
// (plain mpirun) nothing starts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace hvdl {

class LauncherNotices {
 public:
  using Callback = std::function<void(const std::string& line)>;
  // Subscribes `on_notice` to the descriptor named by HVDL_NOTICE_FD, if it is a pipe (starting
  // the process's reader the first time); `on_notice` runs on the reader thread, once per line.
  // Lines that arrived while nobody listened run it on this thread, before the constructor
  // returns. The descriptor is never closed.
  explicit LauncherNotices(Callback on_notice);
  // Unsubscribes: once it returns, `on_notice` is not running and never runs again.
  ~LauncherNotices();
  LauncherNotices(const LauncherNotices&) = delete;
  LauncherNotices& operator=(const LauncherNotices&) = delete;

  // The descriptor from HVDL_NOTICE_FD as the process's first call found it, or -1 if unset,
  // malformed or not a pipe.
  static int DescriptorFromEnv();
  // The rendezvous round this process is in (elastic jobs); notices of earlier rounds are dropped.
  static void SetRound(int round);

 private:
  uint64_t id_ = 0;  // the subscription (0: none, no descriptor)
};

}  // namespace hvdl
