#include "backends/gloo/gloo_work.h"

#include <chrono>

#include "backends/gloo/gloo_watchdog.h"

namespace hvdl {

void GlooWaits::Cancel(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (cancelled) return;
    why = reason;
    cancelled = true;
  }
  if (close) close();
}

Status GlooWaits::Cancelled() {
  std::lock_guard<std::mutex> lock(mu);
  return Status::Aborted(why);
}

namespace {

Status Wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what,
            GlooWaits* waits) {
  using Clock = std::chrono::steady_clock;
  const double timeout_seconds = waits->timeout_seconds;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  try {
    // One wait for the whole time: a c10d Gloo send or receive whose Work::wait(timeout) times
    // out is over - the work completes with the timeout and Gloo closes the pair - so waiting
    // in slices (200 ms, as before) failed every transfer that took longer than a slice (a
    // 16 MiB allreduce at 2+1 across the test hosts, 1 Gbit/s). A peer that dies or a closed
    // connection ends the wait at once; so does a cancel (a lost host, a launcher's notice),
    // which closes every connection (GlooWaits).
    work->wait(std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
    return Status::Ok();
  } catch (const std::exception& e) {
    if (Clock::now() >= deadline) {
      return Status::Internal(what + ": nothing for " + std::to_string(static_cast<int>(
                                  timeout_seconds)) +
                              " s (HOROVOD_GLOO_TIMEOUT_SECONDS); the rank or its host may be "
                              "lost, or the link to it cut");
    }
    std::string message = e.what();
    const size_t cut = message.find('\n');
    if (cut != std::string::npos) message.resize(cut);
    return Status::Internal(what + " failed: " + message);
  }
}

}  // namespace

Status WaitWork(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what,
                GlooWaits* waits) {
  Status s = Wait(work, what, waits);
  if (!s.ok() && waits->cancelled) return waits->Cancelled();
  if (s.ok() || waits->watchdog == nullptr) return s;
  // A peer's connection closing (it was cancelled after learning of a lost host) fails this
  // wait before this rank heard why: the launcher's notice may cancel the group while the
  // watchdog still waits for the lost rank's silence, and then names the lost host.
  Status explained = waits->watchdog->Explain(s, [waits] { return waits->cancelled.load(); });
  if (waits->cancelled) return waits->Cancelled();
  return explained;
}

}  // namespace hvdl
