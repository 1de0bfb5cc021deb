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
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace hvdl {

class GlooWatchdog;

// What every wait of one Gloo world shares: its timeout, the watchdog that names lost ranks in
// a failure, and the cancellation (Context::Abort) that ends waits early.
//
// A cancel is final (comm/transport.h): Gloo cannot withdraw a posted send or receive, and a
// receive whose buffer went away leaves its message unread in the socket - the pair wedges and
// its loop thread spins. So Cancel closes every connection of the group (`close`, set by the
// world that owns the group): every pending operation fails at once, every later post fails,
// and no message lands after it. Waits still wait for their work to end (at once, after the
// close): only an ended work no longer touches its buffer. The group is never used again (an
// aborted Context is never reused).
struct GlooWaits {
  double timeout_seconds = 30;
  GlooWatchdog* watchdog = nullptr;  // may be null
  std::atomic<bool> cancelled{false};
  std::mutex mu;
  std::string why;  // set once cancelled
  std::function<void()> close;  // closes every connection of the group; may be empty

  // Any thread; the first call closes the connections.
  void Cancel(const std::string& reason);
  Status Cancelled();
};

// `what` describes the operation and the peer(s) for the message ("receive from rank 3 (host
// h1)"); the wait is bounded by waits.timeout_seconds and always waits for the work to end (a
// cancel ends it at once); after a cancel a failure says why the group was cancelled.
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
