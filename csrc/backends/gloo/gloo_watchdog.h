// GlooWatchdog: notices ranks that are gone - killed, or behind a cut link - in a launch
// without MPI, where nothing else would tell the survivors (no mpirun, maybe no launcher).
//
// Protocol, over the job's c10d store: every rank's watchdog thread bumps a heartbeat key of its
// own every `beat_seconds` (1 s; an elastic job's driver watches them too, and asks for less) and
// reads everyone's. A rank whose heartbeat has not changed for the launch's
// timeout (HOROVOD_GLOO_TIMEOUT_SECONDS) is lost: the watchdog calls `lost(why)` once, with the
// ranks and their hosts, and the Context aborts (every pending and later operation fails with
// HorovodInternalError naming them). A store that stays unreachable that long is itself the
// loss: the rendezvous host (rank 0's, or the launcher's) is the job's single point of failure.
// Explain() lets a failed Gloo operation wait a few heartbeats for the same verdict, so that its
// error names the lost ranks instead of a socket error.
// The thread is started by Watch and stopped and joined by the destructor, which then writes
// kStopped as this rank's heartbeat: it left the round in order (an elastic job's driver stops
// watching it there; a rank that stops beating without it is hung, stopped or cut off).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace hvdl {

class GlooWatchdog {
 public:
  static constexpr const char* kStopped = "stopped";

  GlooWatchdog(c10::intrusive_ptr<c10d::Store> store, int rank, std::vector<std::string> hosts,
               double timeout_seconds, double beat_seconds = 1.0);
  ~GlooWatchdog();
  GlooWatchdog(const GlooWatchdog&) = delete;
  GlooWatchdog& operator=(const GlooWatchdog&) = delete;

  // Starts the thread; `lost` runs on it at most once.
  void Watch(std::function<void(const std::string& why)> lost);
  // Any thread: `failure` (a failed Gloo operation) rewritten to name the ranks whose heartbeats
  // stopped, waiting up to a few heartbeats for them; unchanged if none stopped. The wait ends
  // early once `explained()` (when given) is true: another source (the launcher's notice of a
  // lost host) has said why, and the caller uses that.
  Status Explain(const Status& failure, const std::function<bool()>& explained = {});

 private:
  void Run();
  // One round: bump ours, read all. Returns the ranks silent for at least `silence`.
  std::vector<int> Silent(std::chrono::steady_clock::duration silence);
  std::string Describe(const std::vector<int>& ranks) const;

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  std::vector<std::string> hosts_;
  double timeout_seconds_;
  std::chrono::steady_clock::duration period_;  // between two heartbeats
  std::vector<std::string> keys_;
  std::atomic<int64_t> beat_{0};
  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::string> last_;  // last heartbeat value seen per rank
  std::vector<std::chrono::steady_clock::time_point> changed_;  // when it last changed
  std::chrono::steady_clock::time_point store_ok_;  // the store last answered
  std::function<void(const std::string&)> lost_;
  bool reported_ = false;
  std::thread thread_;
};

}  // namespace hvdl
