#include "core/background_loop.h"

#include <algorithm>

#if defined(__linux__)
#include <pthread.h>
#include <sys/prctl.h>
#endif

#include "common/logging.h"

namespace hvdl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

// Sleeping is expensive on small VMs (a 1 us sleep or a condition-variable wake-up costs 15-20 us
// there), so the latency-critical waits spin with yield for a short, bounded window first.
constexpr microseconds kMinBackoff{4};
constexpr microseconds kEngagedCap{50};   // polling period while any rank has work pending
constexpr microseconds kIdleCap{10000};   // polling period once the whole job is idle
constexpr microseconds kSpinAfterWork{200};  // watch for the next submission after progress
constexpr microseconds kSpinEngaged{50};     // spin before the first sleep while engaged

void TuneThisThread() {
#if defined(__linux__)
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: short sleeps stay short
  pthread_setname_np(pthread_self(), "hvdl-bg");
#endif
}

// Yields until `done()` or `window` has passed; returns done().
template <typename Pred>
bool SpinFor(microseconds window, Pred done) {
  const auto until = Clock::now() + window;
  while (!done()) {
    if (Clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

BackgroundLoop::BackgroundLoop(const LoopDeps& deps)
    : d_(deps),
      cycle_time_us_(static_cast<int64_t>(deps.config->cycle_time_ms * 1000.0)),
      backoff_(kMinBackoff) {}

BackgroundLoop::~BackgroundLoop() {
  if (thread_.joinable()) {
    RequestShutdown("horovodlite runtime destroyed");
    thread_.join();
  }
}

void BackgroundLoop::Start() {
  running_ = true;
  thread_ = std::thread([this] { Run(); });
}

void BackgroundLoop::RequestShutdown(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_reason_.empty()) shutdown_reason_ = reason;
  }
  shutdown_requested_ = true;
  d_.queue->Wake();
}

void BackgroundLoop::Join() {
  if (thread_.joinable()) thread_.join();
}

std::string BackgroundLoop::stop_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_reason_;
}

void BackgroundLoop::set_cycle_time_ms(double ms) {
  cycle_time_us_ = static_cast<int64_t>(ms * 1000.0);
}

double BackgroundLoop::cycle_time_ms() const { return cycle_time_us_.load() / 1000.0; }

void BackgroundLoop::WaitBeforeCycle(bool progressed, bool engaged) {
  if (shutdown_requested_) return;
  auto has_new = [this] { return d_.queue->HasNew() || shutdown_requested_.load(); };
  if (!has_new()) {
    // Right after progress the next submission usually follows within tens of microseconds:
    // catch it without a wake-up; otherwise run one cycle to hear from the other ranks.
    if (progressed) {
      backoff_ = kMinBackoff;
      SpinFor(kSpinAfterWork, has_new);
      if (!has_new()) return;
    } else {
      d_.queue->WaitForRequests(Clock::now() + backoff_);
      backoff_ = std::min(backoff_ * 2, engaged ? kEngagedCap : kIdleCap);
      if (!has_new()) return;
    }
  }
  // New local work: let a burst of submissions finish so it fuses, but never hold a lone
  // tensor for a full cycle: stop at the first quiet gap.
  backoff_ = kMinBackoff;
  const microseconds limit{cycle_time_us_.load()};
  const microseconds gap = std::clamp(limit / 100, microseconds{0}, microseconds{10});
  const auto start = Clock::now();
  uint64_t seen = d_.queue->arrivals();
  while (gap.count() > 0 && Clock::now() - start + gap <= limit) {
    bool more = SpinFor(gap, [&] { return d_.queue->arrivals() != seen; });
    if (!more) break;
    seen = d_.queue->arrivals();
  }
}

Status BackgroundLoop::RunCycle(CycleResult* result, bool engaged) {
  if (d_.timeline != nullptr) d_.timeline->CycleStart();
  d_.controller->Submit(d_.queue->PopRequests());
  if (shutdown_requested_) {
    std::lock_guard<std::mutex> lock(mu_);
    d_.controller->RequestShutdown(shutdown_reason_);
  }
  HVDL_RETURN_IF_ERROR(d_.controller->StartCycle());
  engaged = engaged || d_.controller->num_pending() > 0;
  bool done = false;
  Status test;
  auto tested_done = [&] {
    test = d_.controller->TestCycle(&done);
    return done || !test.ok();
  };
  if (!engaged || !SpinFor(kSpinEngaged, tested_done)) {
    microseconds sleep = kMinBackoff;
    const microseconds cap = engaged ? kEngagedCap : kIdleCap;
    while (!tested_done()) {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, cap);
    }
  }
  HVDL_RETURN_IF_ERROR(test);
  return d_.controller->FinishCycle(result);
}

void BackgroundLoop::Run() {
  TuneThisThread();
  bool progressed = false;
  bool engaged = false;
  Status failure;
  while (true) {
    WaitBeforeCycle(progressed, engaged);
    CycleResult result;
    Status s = RunCycle(&result, engaged);
    if (!s.ok()) {
      failure = s;
      break;
    }
    if (hook_) hook_(result);  // before execution: completions must see up-to-date state
    int ran = d_.executor->Run(result.responses, result.this_rank_joined);
    progressed = ran > 0 || result.negotiated;
    engaged = result.anyone_pending;
    if (result.shutdown) {
      std::string reason = result.shutdown_reason.empty() ? "a rank called hvd.shutdown()"
                                                          : result.shutdown_reason;
      failure = Status::Aborted("horovodlite was shut down (" + reason + ")");
      break;
    }
  }
  Stop(failure);
}

void BackgroundLoop::Stop(const Status& status) {
  if (status.code() == StatusCode::kInternal) {
    HVDL_LOG(Error) << "background loop stopped: " << status.message();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_reason_ = status.message();
  }
  d_.queue->Close(status);
  running_ = false;
}

}  // namespace hvdl
