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

// Polling policy. Sleeping is expensive on small VMs (a 1 us sleep or a condition-variable
// wake-up costs 15-20 us there) and every wake-up steals CPU from training, so:
//  - the loop is in a hurry only while a user thread is blocked on a handle (Urgent(): the user
//    has nothing to do until we deliver; HandleTable wakes us the moment it starts to block).
//    Otherwise - training still computing the next gradients - new work is batched for up to
//    HOROVOD_CYCLE_TIME and nothing spins: on a 2-core machine running 2 ranks, the spins and
//    per-gradient cycles cost ~10 ms of CPU per training step that the training needed;
//  - only a rank that itself waits for a response polls quickly, and it backs off in proportion
//    to how long it has waited (period <= 1/8 of the wait so far, at most kWaitingCap): short
//    waits stay short, long waits cost ~2% of a core;
//  - a rank with nothing pending never needs to poll quickly - its own next submission wakes it
//    through the queue's condition variable - it only keeps other process sets moving
//    (kOthersCap) or, when the whole job is idle, checks in rarely (kIdleCap).
constexpr microseconds kMinBackoff{4};
constexpr microseconds kWaitingFloor{16};
constexpr microseconds kWaitingCap{1000};
constexpr microseconds kOthersCap{1000};
constexpr microseconds kIdleCap{10000};
constexpr microseconds kSpinAfterWork{60};  // watch for the next submission after progress
constexpr microseconds kSpinWaiting{40};    // spin before the first sleep while waiting
// HOROVOD_HOLD_UNTIL_WAIT: how long new work may wait for a user thread to block. Bounds how
// late an operation nobody waits for yet starts (another rank may be waiting for it).
constexpr microseconds kMaxHold{100000};

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

bool BackgroundLoop::Hurry() const { return Urgent() || Clock::now() < hurry_until_; }

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

void BackgroundLoop::Abort(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) abort_status_ = status;
  }
  aborted_ = true;
  d_.queue->Wake();
}

void BackgroundLoop::Join() {
  if (thread_.joinable()) thread_.join();
}

bool BackgroundLoop::JoinFor(std::chrono::milliseconds timeout) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!stopped_cv_.wait_for(lock, timeout, [this] { return !running_.load(); })) return false;
  }
  Join();
  return true;
}

std::string BackgroundLoop::stop_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_reason_;
}

void BackgroundLoop::set_cycle_time_ms(double ms) {
  cycle_time_us_ = static_cast<int64_t>(ms * 1000.0);
}

double BackgroundLoop::cycle_time_ms() const { return cycle_time_us_.load() / 1000.0; }

// How long to sleep between polls: see the policy at the top of this file.
microseconds BackgroundLoop::PollCap(bool waiting, bool others_pending,
                                     Clock::time_point waiting_since) const {
  if (waiting) {
    auto waited = std::chrono::duration_cast<microseconds>(Clock::now() - waiting_since);
    return std::clamp(waited / 8, kWaitingFloor, kWaitingCap);
  }
  return others_pending ? kOthersCap : kIdleCap;
}

void BackgroundLoop::WaitBeforeCycle(bool progressed, bool others_pending) {
  if (shutdown_requested_ || aborted_) return;
  auto has_new = [this] {
    return d_.queue->HasNew() || shutdown_requested_.load() || aborted_.load();
  };
  if (!has_new()) {
    // Right after progress the next submission usually follows within tens of microseconds:
    // catch it without a wake-up; otherwise run one cycle to hear from the other ranks.
    if (progressed) {
      backoff_ = kMinBackoff;
      if (Hurry()) SpinFor(kSpinAfterWork, has_new);
      if (!has_new()) return;
    } else {
      // The whole job idle as far as this rank knows (nothing pending here, nobody pending at
      // the last cycle): check in rarely at once instead of backing off from microseconds. The
      // ramp's dozen check-in cycles per training step (each a wake-up that preempts training
      // and waits on the other ranks) cost 1.3 ms of a 19 ms MLP step at np 2 on 2 cores;
      // this rank's own next submission still wakes it at once.
      if (!others_pending && d_.controller->num_pending() == 0) backoff_ = kIdleCap;
      d_.queue->WaitForRequests(Clock::now() + backoff_);
      const bool waiting = d_.controller->num_pending() > 0;
      backoff_ = std::min(backoff_ * 2, PollCap(waiting, others_pending, waiting_since_));
      if (!has_new()) return;
    }
  }
  // New local work. While nobody waits for it, batch for up to one cycle time (a user thread
  // starting to block ends the wait at once). While somebody does, let a burst of submissions
  // finish so it fuses, but never hold a lone tensor for a full cycle: stop at the first quiet
  // gap.
  backoff_ = kMinBackoff;
  const microseconds limit{cycle_time_us_.load()};
  const auto start = Clock::now();
  // Wakes from before these checks are stale (a user thread that blocked during the last
  // cycle): only a later one ends the hold. Work asked to go now (a ready gradient bucket:
  // fused already, one allreduce whenever it goes) is neither batched nor held, as DDP
  // launches a bucket from its hook: at np 2 on 2 cores, where the hold is on, sending the
  // bucket at once left the whole step as it was and cut the time after backward to about a
  // tenth (docs/bucket_views.md).
  const uint64_t wakes = d_.queue->wakes();
  if (!Hurry() && !d_.queue->send_now() && !shutdown_requested_ && !aborted_) {
    // On a host whose training threads fill every core, work sent while backward still runs
    // only takes CPU from it: a small ResNet's gradients arriving over ~20 ms went out in 2-3
    // pieces per step (each a negotiation and a wake-up); holding them until the optimizer
    // waits made the step 2.3% faster at np 2 on 2 cores (A/B in one job, 7 of 8 pairs).
    const microseconds hold = d_.hold_until_wait ? std::max(limit, kMaxHold) : limit;
    d_.queue->WaitForWake(wakes, start + hold);
    if (!Urgent()) return;
  }
  const microseconds gap = std::clamp(limit / 100, microseconds{0}, microseconds{10});
  uint64_t seen = d_.queue->arrivals();
  // A quiet gap ends the burst; so does a user thread blocking on a handle with nothing new
  // (the thread that submits is the one that waits: no more is coming from it).
  while (gap.count() > 0 && Clock::now() - start + gap <= limit) {
    bool more = SpinFor(gap, [&] { return d_.queue->arrivals() != seen || Urgent(); });
    if (!more || d_.queue->arrivals() == seen) break;
    seen = d_.queue->arrivals();
  }
}

Status BackgroundLoop::RunCycle(CycleResult* result, bool others_pending) {
  if (d_.timeline != nullptr) d_.timeline->CycleStart();
  d_.queue->PopRequests(&popped_);
  d_.controller->Submit(popped_);
  if (shutdown_requested_) {
    std::lock_guard<std::mutex> lock(mu_);
    d_.controller->RequestShutdown(shutdown_reason_);
  }
  HVDL_RETURN_IF_ERROR(d_.controller->StartCycle());
  bool waiting = d_.controller->num_pending() > 0;
  if (!waiting) waiting_since_ = Clock::now();
  bool done = false;
  Status test;
  auto tested_done = [&] {
    if (aborted_) {  // the ranks we wait for may be gone: stop waiting for them
      std::lock_guard<std::mutex> lock(mu_);
      test = abort_status_;
      return true;
    }
    test = d_.controller->TestCycle(&done);
    return done || !test.ok();
  };
  // Wait for the other ranks. Between tests, sleep on the queue's condition variable so that
  // local work arriving meanwhile wakes us: the other ranks may be waiting for it.
  bool urgent = Hurry();
  if (!waiting || !urgent || !SpinFor(kSpinWaiting, tested_done)) {
    microseconds sleep = kMinBackoff;
    uint64_t seen = d_.queue->arrivals();
    while (!tested_done()) {
      d_.queue->WaitForArrival(seen, Clock::now() + sleep);
      uint64_t now_seen = d_.queue->arrivals();
      if (now_seen != seen && !waiting) {
        waiting = true;  // the new work will need this cycle to finish quickly
        waiting_since_ = Clock::now();
        sleep = kMinBackoff;
      }
      if (!urgent && Urgent()) {  // a user thread just started to wait: hurry from now on
        urgent = true;
        sleep = kMinBackoff;
        if (waiting && SpinFor(kSpinWaiting, tested_done)) break;
      }
      seen = now_seen;
      sleep = std::min(sleep * 2, PollCap(waiting, others_pending, waiting_since_));
    }
  }
  HVDL_RETURN_IF_ERROR(test);
  // A user thread that waited on this cycle's work is likely to submit again within
  // microseconds (a loop of synchronous ops): stay in a hurry for that long after the cycle.
  if (Urgent()) hurry_until_ = Clock::now() + kSpinAfterWork;
  return d_.controller->FinishCycle(result);
}

void BackgroundLoop::Run() {
  TuneThisThread();
  bool progressed = false;
  bool others_pending = false;
  Status failure;
  while (true) {
    WaitBeforeCycle(progressed, others_pending);
    if (aborted_) {
      std::lock_guard<std::mutex> lock(mu_);
      failure = abort_status_;
      break;
    }
    CycleResult result;
    Status s = RunCycle(&result, others_pending);
    if (!s.ok()) {
      failure = s;
      break;
    }
    if (hook_) hook_(result);  // before execution: completions must see up-to-date state
    int ran = d_.executor->Run(result.responses, result.this_rank_joined);
    d_.executor->PollDevice();  // stream completion: device work that has run, or failed
    if (d_.peer_failed && d_.peer_failed()) {  // a data-plane call saw failed ranks
      failure = Status::PeerFailed("a collective reported failed ranks");
      break;
    }
    progressed = ran > 0 || result.negotiated;
    others_pending = result.anyone_pending;
    if (d_.controller->num_pending() == 0) waiting_since_ = Clock::now();
    if (result.shutdown) {
      std::string reason = result.shutdown_reason.empty() ? "a rank called hvd.shutdown()"
                                                          : result.shutdown_reason;
      failure = Status::Aborted("horovodlite was shut down (" + reason + ")");
      break;
    }
  }
  if (failure.code() == StatusCode::kPeerFailed && d_.recover) failure = Recover(failure);
  Stop(failure);
}

Status BackgroundLoop::Recover(const Status& failure) {
  HVDL_LOG(Warning) << "ranks failed (" << failure.message() << "); agreeing with the survivors";
  recovered_ = true;
  std::string what;
  Status s = d_.recover(&what);
  if (!s.ok()) {
    return Status::Internal("horovodlite lost ranks (" + failure.message() +
                            ") and could not agree with the survivors: " + s.message());
  }
  HVDL_LOG(Warning) << "horovodlite " << what;
  return Status::PeerFailed("horovodlite " + what + "; every pending operation failed. " +
                            "hvd.elastic.run continues on the survivors (hvd.shutdown() and " +
                            "hvd.init() start on them)");
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
  stopped_cv_.notify_all();
}

}  // namespace hvdl
