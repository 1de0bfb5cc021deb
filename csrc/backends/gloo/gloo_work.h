// Waiting for c10d work: what every Gloo-backed piece shares.
//
// A c10d operation runs on the process group's own threads and completes a Work. WaitWork blocks
// on it (a condition-variable wait: no spinning) once, for the launch's timeout - a Gloo send or
// receive whose wait timed out is over, so it cannot be waited for in slices - and gives up
// with a message naming the peer it was waiting for; it never lets a c10d exception escape:
// failures come back as a Status. Background thread.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace hvdl {

class GlooWatchdog;

// What every wait of one Gloo world shares: its timeout, the watchdog that names lost ranks in
// a failure, and the cancellation (Context::Abort) that ends waits early.
struct GlooWaits {
  double timeout_seconds = 30;
  GlooWatchdog* watchdog = nullptr;  // may be null
  std::atomic<bool> cancelled{false};
  std::mutex mu;
  std::string why;  // set once cancelled

  void Cancel(const std::string& reason);
  Status Cancelled();
};

// `what` describes the operation and the peer(s) for the message ("receive from rank 3 (host
// h1)"); the wait is bounded by waits.timeout_seconds; a cancelled `waits` fails it at once if
// cancelled before it starts (a wait under way runs to its end or the timeout).
Status WaitWork(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what,
                GlooWaits* waits);

// Runs `post` (which starts c10d work) and turns any c10d exception into a Status.
template <typename Post>
Status PostWork(Post&& post, const std::string& what, c10::intrusive_ptr<c10d::Work>* out) {
  try {
    *out = post();
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::Internal(what + " failed: " + e.what());
  }
}

}  // namespace hvdl
