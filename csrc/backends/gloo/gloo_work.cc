#include "backends/gloo/gloo_work.h"

#include <chrono>

#include "backends/gloo/gloo_watchdog.h"

namespace hvdl {

void GlooWaits::Cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu);
  if (!cancelled) why = reason;
  cancelled = true;
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
  while (true) {
    if (waits->cancelled) return waits->Cancelled();
    try {
      // Work::wait(timeout) throws when the slice ends first; the work stays pending.
      work->wait(std::chrono::milliseconds(200));
      return Status::Ok();
    } catch (const std::exception& e) {
      if (work->isCompleted()) {
        std::string message = e.what();
        const size_t cut = message.find('\n');
        if (cut != std::string::npos) message.resize(cut);
        return Status::Internal(what + " failed: " + message);
      }
    }
    if (Clock::now() >= deadline) {
      return Status::Internal(what + ": nothing for " + std::to_string(static_cast<int>(
                                  timeout_seconds)) +
                              " s (HOROVOD_GLOO_TIMEOUT_SECONDS); the rank or its host may be "
                              "lost, or the link to it cut");
    }
  }
}

}  // namespace

Status WaitWork(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what,
                GlooWaits* waits) {
  Status s = Wait(work, what, waits);
  if (s.ok() || s.code() == StatusCode::kAborted || waits->watchdog == nullptr) return s;
  return waits->watchdog->Explain(s);
}

}  // namespace hvdl
