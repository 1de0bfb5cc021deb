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
// A thread owned by the Context reads the pipe and hands each line to a callback, which fails
// the runtime (Context::Abort): every pending handle and every later submission raises
// HorovodInternalError with the line. Without HVDL_NOTICE_FD (plain mpirun) nothing starts.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace hvdl {

class LauncherNotices {
 public:
  using Callback = std::function<void(const std::string& line)>;
  // Starts reading the descriptor named by HVDL_NOTICE_FD, if it is a pipe; `on_notice` runs on
  // the reader thread, once per line. The descriptor is not closed (a later Context reads it).
  explicit LauncherNotices(Callback on_notice);
  // Stops and joins the reader at once (it also waits on a pipe of its own for this).
  ~LauncherNotices();
  LauncherNotices(const LauncherNotices&) = delete;
  LauncherNotices& operator=(const LauncherNotices&) = delete;

  // The descriptor from HVDL_NOTICE_FD as the process's first call found it, or -1 if unset,
  // malformed or not a pipe.
  static int DescriptorFromEnv();
  // The rendezvous round this process is in (elastic jobs); notices of earlier rounds are dropped.
  static void SetRound(int round);

 private:
  void Read(int fd);

  Callback on_notice_;
  int wake_[2] = {-1, -1};  // the destructor writes a byte to stop the reader
  std::thread thread_;
};

}  // namespace hvdl
