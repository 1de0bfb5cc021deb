#include "core/tensor_queue.h"

#include <string_view>
#include <unordered_set>

namespace hvdl {

Status TensorQueue::Add(std::vector<TensorEntry> entries, std::vector<Request> requests,
                        int handle) {
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
      auto holder = taken_.find(keys[i]);
      if (holder != taken_.end()) {
        return Status::InvalidArgument(
            std::string(OpTypeName(entries[i].op)) + " '" + entries[i].name +
            "': a collective with this name is still pending on this rank (handle " +
            std::to_string(holder->second) + ", not completed yet); synchronize() it before " +
            "reusing the name, or pass a different name.");
      }
      if (keys.size() > 1 && !batch.insert(keys[i]).second) {
        return Status::InvalidArgument(std::string(OpTypeName(entries[i].op)) + " '" +
                                       entries[i].name + "': the same name twice in one " +
                                       "grouped call; give each tensor its own name.");
      }
    }
    for (const std::string& k : keys) taken_.emplace(k, handle);
  auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < entries.size(); ++i) {
      entries[i].enqueued = now;
      entries_.emplace(std::move(keys[i]), std::move(entries[i]));
    }
    for (Request& r : requests) new_requests_.push_back(std::move(r));
    arrivals_ += requests.size();
    notify = arrival_waiter_;
  }
  // Only a loop waiting for arrivals is woken: while it holds work back to fuse it, each
  // submission waking it would cost two context switches on a core the training needs.
  if (notify) cv_.notify_one();
  return Status::Ok();
}

void TensorQueue::Release(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  taken_.erase(key);
}

void TensorQueue::PopRequests(std::vector<Request>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mu_);
  out->swap(new_requests_);
}

bool TensorQueue::Take(const std::string& key, TensorEntry* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  *out = std::move(it->second);
  entries_.erase(it);
  return true;
}

void TensorQueue::Close(const Status& status) {
  std::unordered_map<std::string, TensorEntry> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    closed_status_ = status;
    failed.swap(entries_);
    new_requests_.clear();
  }
  for (auto& kv : failed) {
    Status s(status.code(), std::string(OpTypeName(kv.second.op)) + " '" + kv.second.name +
                                "' did not complete: " + status.message());
    kv.second.done(s, {});
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

void TensorQueue::WaitForWake(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return woken_; });
  woken_ = false;
}

void TensorQueue::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
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
  return entries_.size();
}

}  // namespace hvdl
