#include "backends/gloo/gloo_watchdog.h"

#include "common/logging.h"

namespace hvdl {
namespace {

using Clock = std::chrono::steady_clock;
// After a failed operation: silence this long already names a rank (killed processes stop
// beating at once; the full timeout is for ranks that may only be slow).
constexpr auto kExplainSilence = std::chrono::seconds(3);

}  // namespace

GlooWatchdog::GlooWatchdog(c10::intrusive_ptr<c10d::Store> store, int rank,
                           std::vector<std::string> hosts, double timeout_seconds,
                           double beat_seconds)
    : store_(std::move(store)),
      rank_(rank),
      hosts_(std::move(hosts)),
      timeout_seconds_(timeout_seconds),
      period_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(beat_seconds > 0 ? beat_seconds : 1.0))),
      last_(hosts_.size()),
      changed_(hosts_.size(), Clock::now()),
      store_ok_(Clock::now()) {
  for (size_t r = 0; r < hosts_.size(); ++r) keys_.push_back("hvdl-heartbeat/" + std::to_string(r));
}

GlooWatchdog::~GlooWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  thread_.join();
  try {  // a set is one send, no reply: it does not wait on a lost store
    store_->set(keys_[static_cast<size_t>(rank_)], std::string(kStopped));
  } catch (const std::exception&) {
  }
}

void GlooWatchdog::Watch(std::function<void(const std::string& why)> lost) {
  std::lock_guard<std::mutex> lock(mu_);
  lost_ = std::move(lost);
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

std::string GlooWatchdog::Describe(const std::vector<int>& ranks) const {
  std::string out;
  for (int r : ranks) {
    out += (out.empty() ? "" : ", ") + std::to_string(r) + " (host " +
           hosts_[static_cast<size_t>(r)] + ")";
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

std::vector<int> GlooWatchdog::Silent(Clock::duration silence) {
  const auto now = Clock::now();
  std::vector<std::vector<uint8_t>> values;
  bool answered = true;
  try {
    store_->set(keys_[static_cast<size_t>(rank_)], std::to_string(++beat_));
    values = store_->multiGet(keys_);
  } catch (const std::exception&) {
    answered = false;  // below: a store silent for the timeout is the loss
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!answered) return {};
  store_ok_ = now;
  std::vector<int> silent;
  for (size_t r = 0; r < values.size(); ++r) {
    std::string v(values[r].begin(), values[r].end());
    if (v != last_[r]) {
      last_[r] = std::move(v);
      changed_[r] = now;
    } else if (static_cast<int>(r) != rank_ && last_[r] != kStopped &&
               now - changed_[r] >= silence) {  // (a rank that left in order is not lost)
      silent.push_back(static_cast<int>(r));
    }
  }
  return silent;
}

void GlooWatchdog::Run() {
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(timeout_seconds_));
  while (true) {
    std::vector<int> silent = Silent(timeout);
    std::string why;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!reported_) {
        if (!silent.empty()) {
          why = "lost " + Describe(silent) + ": no heartbeat for " +
                std::to_string(static_cast<int>(timeout_seconds_)) +
                " s (HOROVOD_GLOO_TIMEOUT_SECONDS); the rank or its host is gone, or the link "
                "to it is cut";
        } else if (Clock::now() - store_ok_ >= timeout) {
          why = "lost the rendezvous store for " +
                std::to_string(static_cast<int>(timeout_seconds_)) +
                " s (HOROVOD_GLOO_TIMEOUT_SECONDS): the job's rendezvous host (rank 0's or the "
                "launcher's) is gone, or the link to it is cut; it is the job's single point of "
                "failure";
        }
        reported_ = !why.empty();
      }
      if (why.empty()) {
        cv_.wait_for(lock, period_, [this] { return stop_; });
        if (stop_) return;
        continue;
      }
    }
    HVDL_LOG(Error) << why;
    if (lost_) lost_(why);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_; });
    return;
  }
}

Status GlooWatchdog::Explain(const Status& failure, const std::function<bool()>& explained) {
  if (failure.ok()) return failure;
  const auto deadline = Clock::now() + kExplainSilence + period_;
  while (Clock::now() < deadline) {
    if (explained && explained()) return failure;
    std::vector<int> silent = Silent(kExplainSilence);
    if (!silent.empty()) {
      return Status(failure.code(), "lost " + Describe(silent) + " (no heartbeat for " +
                                        std::to_string(kExplainSilence.count()) +
                                        " s): " + failure.message());
    }
    std::this_thread::sleep_for(period_ / 2);
  }
  return failure;
}

}  // namespace hvdl
