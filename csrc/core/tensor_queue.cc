#include "core/tensor_queue.h"

#include "core/handle_table.h"

#include <string_view>
#include <unordered_set>

namespace hvdl {

Status TensorQueue::Add(std::vector<TensorEntry> entries, std::vector<Request> requests) {
  std::vector<std::string> keys;
  keys.reserve(entries.size());
  for (const TensorEntry& e : entries) keys.push_back(TensorKey(e.name, e.process_set));
  std::unordered_set<std::string_view> batch;  // a group naming one tensor twice
  if (keys.size() > 1) batch.reserve(keys.size());
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return closed_status_;
    for (size_t i = 0; i < entries.size(); ++i) {
      auto holder = names_.find(keys[i]);
      if (holder != names_.end()) {
        return Status::InvalidArgument(
            TensorLabel(OpTypeName(entries[i].op), entries[i].name) +
            ": a collective with this name is still pending on this rank (handle " +
            std::to_string(holder->second.handle) + ", not completed yet); synchronize() it " +
            "before reusing the name, or pass a different name.");
      }
      if (keys.size() > 1 && !batch.insert(keys[i]).second) {
        return Status::InvalidArgument(TensorLabel(OpTypeName(entries[i].op), entries[i].name) +
                                       ": the same name twice in one grouped call; give each " +
                                       "tensor its own name.");
      }
    }
    batch.clear();  // views of keys about to move
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < entries.size(); ++i) {
      TensorEntry& e = entries[i];
      e.enqueued = now;
      const int handle = e.handle;
      auto it = names_.emplace(std::move(keys[i]), Slot{std::move(e), true, handle}).first;
      it->second.entry.key = &it->first;  // node keys stay put (rehashing moves no node)
    }
    queued_ += entries.size();
    for (Request& r : requests) new_requests_.push_back(std::move(r));
    arrivals_ += requests.size();
    notify = arrival_waiter_;
  }
  // Only a loop waiting for arrivals is woken: while it holds work back to fuse it, each
  // submission waking it would cost two context switches on a core the training needs.
  if (notify) cv_.notify_one();
  return Status::Ok();
}

void TensorQueue::Complete(TensorEntry* e, const Status& status,
                           const std::vector<int64_t>& extra) {
  if (e->done) e->done(status, extra);
  if (e->key != nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = names_.find(*e->key);
    if (it != names_.end() && !it->second.queued) names_.erase(it);
    e->key = nullptr;
  }
  e->keepalive.reset();
  if (handles_ != nullptr && e->handle >= 0) handles_->MarkDone(e->handle, status);
}

void TensorQueue::PopRequests(std::vector<Request>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mu_);
  out->swap(new_requests_);
  send_now_ = false;
}

bool TensorQueue::Take(const std::string& key, TensorEntry* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = names_.find(key);
  if (it == names_.end() || !it->second.queued) return false;
  *out = std::move(it->second.entry);
  it->second.queued = false;
  --queued_;
  return true;
}

void TensorQueue::Close(const Status& status) {
  std::vector<TensorEntry> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    closed_status_ = status;
    for (auto it = names_.begin(); it != names_.end();) {
      if (it->second.queued) {
        failed.push_back(std::move(it->second.entry));
        failed.back().key = nullptr;  // its slot goes now
        it = names_.erase(it);
      } else {
        ++it;  // in flight: its Complete frees it
      }
    }
    queued_ = 0;
    new_requests_.clear();
  }
  for (TensorEntry& e : failed) {
    Status s(status.code(), TensorLabel(OpTypeName(e.op), e.name) +
                                " did not complete: " + status.message());
    Complete(&e, s, {});
  }
}

void TensorQueue::Refuse(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  closed_status_ = status;
}

void TensorQueue::WaitForRequests(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  arrival_waiter_ = true;
  cv_.wait_until(lock, deadline, [&] { return !new_requests_.empty() || woken_; });
  arrival_waiter_ = false;
  woken_ = false;
}

void TensorQueue::WaitForArrival(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  arrival_waiter_ = true;
  cv_.wait_until(lock, deadline, [&] { return arrivals_ != seen || woken_; });
  arrival_waiter_ = false;
  woken_ = false;
}

void TensorQueue::WaitForWake(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return wakes_ != seen || send_now_; });
  woken_ = false;
}

uint64_t TensorQueue::wakes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wakes_;
}

void TensorQueue::SendNow() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    send_now_ = true;
  }
  cv_.notify_one();
}

bool TensorQueue::send_now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return send_now_;
}

void TensorQueue::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
    ++wakes_;
  }
  cv_.notify_one();
}

bool TensorQueue::HasNew() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !new_requests_.empty();
}

uint64_t TensorQueue::arrivals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return arrivals_;
}

size_t TensorQueue::num_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

}  // namespace hvdl
