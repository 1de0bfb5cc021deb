#include "core/handle_table.h"

#include <algorithm>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace hvdl {
namespace {

// The CompletionBatch nesting depth on this thread, and the tables it has deferred wake-ups of.
thread_local int t_batch_depth = 0;
thread_local std::vector<HandleTable*> t_deferred;

}  // namespace

CompletionBatch::CompletionBatch() { ++t_batch_depth; }

CompletionBatch::~CompletionBatch() {
  if (--t_batch_depth > 0) return;
  std::vector<HandleTable*> tables;
  tables.swap(t_deferred);
  for (HandleTable* t : tables) t->Notify();
}

int HandleTable::Allocate(int num_entries, std::shared_ptr<void> payload, std::string what) {
  auto state = std::make_shared<State>();
  state->remaining = num_entries;
  state->payload = std::move(payload);
  state->what = std::move(what);
  std::lock_guard<std::mutex> lock(mu_);
  const int handle = NextId();
  states_[handle] = std::move(state);
  return handle;
}

int HandleTable::NextId() {
  for (;;) {
    const int id = next_;
    next_ = next_ == std::numeric_limits<int>::max() ? 1 : next_ + 1;  // no signed overflow
    if (id > 0 && states_.find(id) == states_.end()) return id;
  }
}

void HandleTable::SetNextIdForTesting(int next) {
  std::lock_guard<std::mutex> lock(mu_);
  next_ = next;
}

void HandleTable::MarkDone(int handle, const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = states_.find(handle);
    if (it == states_.end()) return;
    State& s = *it->second;
    if (!status.ok() && s.status.ok()) s.status = status;
    if (--s.remaining > 0) return;  // wake waiters only when the whole handle is done
    s.done.store(true, std::memory_order_release);  // a spinning waiter sees this
    if (s.sleepers == 0) return;  // nobody asleep: a later Wait finds it done
  }
  if (t_batch_depth > 0) {
    if (std::find(t_deferred.begin(), t_deferred.end(), this) == t_deferred.end()) {
      t_deferred.push_back(this);
    }
    return;
  }
  cv_.notify_all();
}

Status HandleTable::Unknown(int handle) const {
  return Status::InvalidArgument("handle " + std::to_string(handle) +
                                 " is unknown or was already synchronized; every handle from "
                                 "an *_async call is synchronized exactly once.");
}

Status HandleTable::Poll(int handle, bool* done) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  if (it == states_.end()) return Unknown(handle);
  *done = it->second->remaining <= 0;
  // Asking about an unfinished handle is waiting too (a poll loop): end any hold of new work.
  if (!*done && block_hook_) block_hook_();
  return Status::Ok();
}

Status HandleTable::Wait(int handle, Status* op_status, std::shared_ptr<void>* payload) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  if (it == states_.end()) return Unknown(handle);
  std::shared_ptr<State> state = it->second;
  if (state->remaining > 0) {
    blocked_.fetch_add(1, std::memory_order_relaxed);
    ++state->waiters;
    if (block_hook_) block_hook_();
    const std::chrono::microseconds window{spin_us_.load(std::memory_order_relaxed)};
    if (window.count() > 0) {
      lock.unlock();
      const auto until = std::chrono::steady_clock::now() + window;
      while (!state->done.load(std::memory_order_acquire) &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
      lock.lock();
    }
    if (state->remaining > 0) {
      ++state->sleepers;
      cv_.wait(lock, [&] { return state->remaining <= 0; });
      --state->sleepers;
    }
    --state->waiters;
    blocked_.fetch_sub(1, std::memory_order_relaxed);
  }
  states_.erase(handle);
  *op_status = state->status;
  *payload = std::move(state->payload);
  return Status::Ok();
}

void HandleTable::SetSpinWindow(std::chrono::microseconds window) {
  spin_us_.store(window.count(), std::memory_order_relaxed);
}

void HandleTable::FailPending(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : states_) {
      State& s = *kv.second;
      if (s.remaining <= 0) continue;
      if (s.status.ok()) {
        s.status = s.what.empty() ? status
                                  : Status(status.code(), s.what + " did not complete: " +
                                                              status.message());
      }
      s.remaining = 0;
      s.done.store(true, std::memory_order_release);
    }
  }
  cv_.notify_all();
}

void HandleTable::SetBlockHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  block_hook_ = std::move(hook);
}

void HandleTable::Release(int handle) {
  std::lock_guard<std::mutex> lock(mu_);
  states_.erase(handle);
}

size_t HandleTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return states_.size();
}

}  // namespace hvdl
